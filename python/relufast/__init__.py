"""relufast: weight recovery of ReLU networks, with certificates.

Passive recovery of a two-layer network ``Y = relu(X @ V.T + b) @ U.T + c`` from samples
(:func:`recover`, the methods of five papers), and extraction of a model that can be queried,
networks with several hidden layers included (:func:`extract`, random or chosen queries).

Convention: samples are rows, ``Y = relu(X @ V.T) @ U.T`` with V of shape (k, d) and U of
shape (m, k). Networks are identified up to permutation of hidden units and positive
scaling of rows of V; results report V with unit-norm rows.

``import relufast`` is cheap: every name below is imported on first use (``relufast.recover``
imports the algorithms, NumPy and SciPy), so the command line starts at once.
"""

from __future__ import annotations

import importlib as _importlib
import importlib.abc as _abc
import importlib.util as _util
import os as _os
import sys as _sys
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:  # what the names are, for type checkers and IDEs (imported lazily at run time)
    from . import activations, algorithms, metrics, planted, stages
    from ._api import METHODS, recover
    from ._native import BACKEND
    from ._result import RecoveryResult, RelufastWarning, Status
    from .algorithms import mr19
    from .bridges import from_sklearn, from_torch
    from .estimator import ReluNetRegressor  # noqa: F401  (not in __all__: it imports scikit-learn)
    from .extraction import extract
    from .network import Network
    from .stages import fit, highs, moments, patterns, refine, robust_pca, tensor

#: Public name -> (module relative to the package, attribute in it or None for the module).
_LAZY = {
    "recover": ("._api", "recover"),
    "METHODS": ("._api", "METHODS"),
    "BACKEND": ("._native", "BACKEND"),
    "RecoveryResult": ("._result", "RecoveryResult"),
    "RelufastWarning": ("._result", "RelufastWarning"),
    "Status": ("._result", "Status"),
    "from_torch": (".bridges", "from_torch"),
    "from_sklearn": (".bridges", "from_sklearn"),
    "extract": (".extraction", "extract"),
    "Network": (".network", "Network"),
    "ReluNetRegressor": (".estimator", "ReluNetRegressor"),  # scikit-learn only on first use
    "mr19": (".algorithms.mr19", None),  #: MR19 (Mazumdar & Rawat): robust code recovery and column space
}

#: The stages are also reachable under their short names (``relufast.moments``, ``import relufast.moments``).
_STAGE_ALIASES = ("moments", "tensor", "patterns", "refine", "fit", "robust_pca", "highs")
_LAZY.update({name: (f".stages.{name}", None) for name in _STAGE_ALIASES})

#: Submodules and subpackages of this package (``relufast.planted``, ``relufast.units``, ...).
_SUBMODULES = frozenset(
    (entry[:-3] if entry.endswith(".py") else entry)
    for folder in __path__  # every folder of the package (an editable install has several)
    if _os.path.isdir(folder)
    for entry in _os.listdir(folder)
    if not entry.startswith(("_", "."))
    and (entry.endswith(".py") or _os.path.isfile(_os.path.join(folder, entry, "__init__.py")))
)


def __getattr__(name):
    """Import a public name on first use and keep it in the package's namespace."""
    if name in _LAZY:
        module, attribute = _LAZY[name]
        value = _importlib.import_module(module, __name__)
        if attribute is not None:
            value = getattr(value, attribute)
        elif name in _STAGE_ALIASES:
            _sys.modules.setdefault(f"{__name__}.{name}", value)
    elif name in _SUBMODULES:
        value = _importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)


class _StageAlias(_abc.MetaPathFinder, _abc.Loader):
    """``import relufast.moments`` (and the other short names) gives the stage module itself,
    ``relufast.stages.moments``, imported at that moment."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in _STAGE_ALIASES:
            return None
        return _util.spec_from_loader(fullname, self)

    _specs: dict = {}

    def create_module(self, spec):
        module = _importlib.import_module(f"{__name__}.stages.{spec.name.rpartition('.')[2]}")
        self._specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module):
        # The import system set the alias's spec on the stage module: give it back its own.
        module.__spec__ = self._specs.pop(module.__name__, module.__spec__)


if not any(isinstance(finder, _StageAlias) for finder in _sys.meta_path):
    _sys.meta_path.append(_StageAlias())


__all__ = [
    "recover",
    "extract",
    "from_torch",
    "from_sklearn",
    "Network",
    "METHODS",
    "RecoveryResult",
    "Status",
    "RelufastWarning",
    "algorithms",
    "mr19",
    "stages",
    "activations",
    "fit",
    "highs",
    "metrics",
    "moments",
    "planted",
    "refine",
    "tensor",
    "patterns",
    "robust_pca",
    "BACKEND",
    "__version__",
]
