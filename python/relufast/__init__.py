"""relufast: provable weight recovery of two-layer ReLU networks.

Convention: samples are rows, ``Y = relu(X @ V.T) @ U.T`` with V of shape (k, d) and U of
shape (m, k). Networks are identified up to permutation of hidden units and positive
scaling of rows of V; results report V with unit-norm rows.
"""
from . import algorithms, lp, metrics, moments, patterns, planted, refine, robust_pca, tensor
from ._api import METHODS, recover
from ._native import BACKEND
from ._result import RecoveryResult, RelufastWarning, Status

mr19 = algorithms.mr19  #: MR19 (Mazumdar & Rawat): robust code recovery and column space

__version__ = "0.1.0"

__all__ = [
    "recover",
    "METHODS",
    "RecoveryResult",
    "Status",
    "RelufastWarning",
    "algorithms",
    "mr19",
    "metrics",
    "moments",
    "planted",
    "refine",
    "tensor",
    "lp",
    "patterns",
    "robust_pca",
    "BACKEND",
    "__version__",
]
