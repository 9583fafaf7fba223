"""One module per paper. Each module docstring gives the citation and maps functions to
the paper's algorithm numbers."""
from . import bjw19, gklw19, mr19

__all__ = ["bjw19", "gklw19", "mr19"]
