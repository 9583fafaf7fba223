"""One module per paper (``bjw19`` a subpackage with one module per theorem). Each module
docstring gives the citation and maps functions to the paper's algorithm numbers; the
algorithms compose the stages of :mod:`relufast.stages`."""

from . import atv21, bjw19, gklw19, gp19, mr19

__all__ = ["atv21", "bjw19", "gklw19", "gp19", "mr19"]
