"""The one network type shared by results, planted teachers and metrics.

``y = U f(V x + b) + c`` with samples as rows: ``Y = f(X @ V.T + b) @ U.T + c``, V of shape
(k, d), hidden biases b (k,), U of shape (m, k), output offset c (m,). Models without
biases (BJW19, GKLW19) have b = 0 and c = 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["Network", "as_network"]


def _frozen(a, shape, name):
    a = np.array(a, dtype=np.float64, copy=True)
    if a.shape != shape:
        raise ValueError(f"{name} must have shape {shape}; got {a.shape}")
    a.setflags(write=False)
    return a


@dataclass(frozen=True)
class Network:
    """A two-layer network ``y = U f(V x + b) + c`` (f = ReLU unless ``activation``).

    Attributes
    ----------
    U : ndarray of shape (n_outputs, n_hidden)
    V : ndarray of shape (n_hidden, n_features)
    b : ndarray of shape (n_hidden,), default zeros
    c : ndarray of shape (n_outputs,), default zeros
    activation : Activation or None
        The rectified activation (None: ReLU).
    """

    U: np.ndarray
    V: np.ndarray
    b: Optional[np.ndarray] = None
    c: Optional[np.ndarray] = None
    activation: Any = None

    def __post_init__(self):
        U = np.atleast_2d(np.asarray(self.U, dtype=np.float64))
        V = np.atleast_2d(np.asarray(self.V, dtype=np.float64))
        k = V.shape[0]
        if U.shape[1] != k:
            raise ValueError(f"U must have n_hidden = {k} columns (V has {k} rows); got U of shape {U.shape}")
        object.__setattr__(self, "U", _frozen(U, U.shape, "U"))
        object.__setattr__(self, "V", _frozen(V, V.shape, "V"))
        object.__setattr__(self, "b", _frozen(np.zeros(k) if self.b is None else self.b, (k,), "b"))
        m = U.shape[0]
        object.__setattr__(self, "c", _frozen(np.zeros(m) if self.c is None else self.c, (m,), "c"))

    @property
    def n_features(self) -> int:
        return self.V.shape[1]

    @property
    def n_hidden(self) -> int:
        return self.V.shape[0]

    @property
    def n_outputs(self) -> int:
        return self.U.shape[0]

    @property
    def has_bias(self) -> bool:
        """True when b or c is nonzero."""
        return bool(np.any(self.b) or np.any(self.c))

    def hidden(self, X: ArrayLike) -> np.ndarray:
        """Hidden activations ``f(X V^T + b)`` of shape (n_samples, n_hidden)."""
        Z = np.asarray(X, dtype=np.float64) @ self.V.T + self.b
        return np.maximum(Z, 0.0) if self.activation is None else self.activation(Z)

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Outputs ``f(X V^T + b) U^T + c`` for X of shape (n_samples, n_features)."""
        return self.hidden(X) @ self.U.T + self.c

    __call__ = predict


def as_network(obj: Any) -> Network:
    """A :class:`Network` from a network, a result, or a tuple (U, V[, b[, c]])."""
    if isinstance(obj, Network):
        return obj
    if isinstance(obj, tuple) and 2 <= len(obj) <= 4:
        return Network(*obj)
    U, V = getattr(obj, "U", None), getattr(obj, "V", None)
    if U is None or V is None:
        raise ValueError(
            "expected a network, a result with parameters, or a (U, V[, b[, c]]) tuple; "
            f"got {type(obj).__name__}" + (" without parameters" if hasattr(obj, "U") else "")
        )
    return Network(U, V, getattr(obj, "b", None), getattr(obj, "c", None), getattr(obj, "activation", None))
