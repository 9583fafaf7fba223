"""relufast: provable weight recovery of two-layer ReLU networks.

Convention: samples are rows, ``Y = relu(X @ V.T) @ U.T`` with V of shape (k, d) and U of
shape (m, k). Networks are identified up to permutation of hidden units and positive
scaling of rows of V; results report V with unit-norm rows.
"""

import sys as _sys

from . import activations, algorithms, metrics, planted, stages
from ._api import METHODS, recover
from ._native import BACKEND
from ._result import RecoveryResult, RelufastWarning, Status
from .bridges import from_sklearn, from_torch
from .extraction import extract
from .network import Network
from .stages import fit, highs, moments, patterns, refine, robust_pca, tensor

mr19 = algorithms.mr19  #: MR19 (Mazumdar & Rawat): robust code recovery and column space

__version__ = "0.1.0"

# The stages are also reachable under their short names (``relufast.moments``, ...).
for _name, _mod in (
    ("moments", moments),
    ("tensor", tensor),
    ("patterns", patterns),
    ("refine", refine),
    ("fit", fit),
    ("robust_pca", robust_pca),
    ("highs", highs),
):
    _sys.modules.setdefault(f"{__name__}.{_name}", _mod)
del _name, _mod


def __getattr__(name):
    """``relufast.ReluNetRegressor`` (scikit-learn estimator) is imported on first use, so
    ``import relufast`` does not import scikit-learn."""
    if name == "ReluNetRegressor":
        from .estimator import ReluNetRegressor

        return ReluNetRegressor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
