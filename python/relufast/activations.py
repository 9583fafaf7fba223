"""Rectified activations f(t) = phi(t) for t > 0 and 0 otherwise (BJW19 Section 9.1).

phi must be continuous, injective and positive on (0, inf), with its inverse supplied.
ReLU and ``relu^p`` are positively homogeneous (``degree`` p): rows of V are then only
identified up to positive scaling and are reported with unit norm. For other phi
(e.g. ``exp(t) - 1``) the scale of each row is identifiable and kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

__all__ = [
    "Activation",
    "RELU",
    "RELU2",
    "EXPM1",
    "power",
    "custom",
    "get_activation",
    "GP19_ACTIVATIONS",
]


@dataclass(frozen=True)
class Activation:
    """A rectified activation: ``f(t) = forward(t)`` for t > 0, else 0."""

    name: str
    forward: Callable[[np.ndarray], np.ndarray]
    inverse: Callable[[np.ndarray], np.ndarray]
    degree: Optional[float] = None  #: p when phi(c t) = c^p phi(t) for c > 0, else None

    def __call__(self, Z):
        Z = np.asarray(Z, dtype=np.float64)
        out = np.zeros_like(Z)
        pos = Z > 0
        out[pos] = self.forward(Z[pos])
        return out

    @property
    def homogeneous(self):
        return self.degree is not None


def power(p):
    """``relu(t)^p`` for p > 0 (p = 1: ReLU, p = 2: squared ReLU)."""
    if not (np.isfinite(p) and p > 0):
        raise ValueError(f"the power must be a positive number; got {p!r}")
    p = float(p)
    if p == 1.0:
        return RELU
    return Activation(f"relu^{p:g}", lambda t: t**p, lambda y: y ** (1.0 / p), degree=p)


def custom(forward, inverse, name="custom", degree=None):
    """A user-supplied phi on (0, inf) with its inverse (both vectorised)."""
    if not (callable(forward) and callable(inverse)):
        raise TypeError("forward and inverse must be callables")
    t = np.array([0.5, 1.0, 2.0])
    y = np.asarray(forward(t), dtype=np.float64)
    if y.shape != t.shape or not np.all(np.diff(y) > 0) or not np.all(y > 0):
        raise ValueError("forward must be vectorised, positive and increasing on (0, inf)")
    if not np.allclose(inverse(y), t, rtol=1e-8):
        raise ValueError("inverse(forward(t)) must equal t")
    return Activation(name, forward, inverse, degree)


RELU = Activation("relu", lambda t: t, lambda y: y, degree=1.0)
RELU2 = Activation("relu^2", lambda t: t * t, np.sqrt, degree=2.0)
EXPM1 = Activation("expm1", np.expm1, np.log1p, degree=None)

_NAMED = {"relu": RELU, "relu2": RELU2, "relu_squared": RELU2, "expm1": EXPM1}


def get_activation(spec):
    """An :class:`Activation` from itself, a name ("relu", "relu2", "expm1") or a power p."""
    if isinstance(spec, Activation):
        return spec
    if isinstance(spec, str):
        if spec in _NAMED:
            return _NAMED[spec]
        raise ValueError(
            f"unknown activation {spec!r}; use one of {sorted(_NAMED)}, a positive "
            "number p for relu^p, or relufast.activations.custom(forward, inverse)"
        )
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return power(spec)
    raise TypeError(f"activation must be a name, a number or an Activation; got {type(spec).__name__}")


def _gp19_sigmoid(a):
    return 0.5 * (1.0 + np.tanh(0.5 * a))


#: Activations u of GP19's model, applied to ``a = w.x - t`` (``rho`` scales "exp").
#: "step" is the 0/1 step GP19 writes as sgn (its erratum 14); "abs" and "square" are the
#: even activations of its Theorem 10; "exp" is ``e^{rho a}`` of Theorem 8.
GP19_ACTIVATIONS = {
    "relu": lambda a, rho=1.0: np.maximum(a, 0.0),
    "step": lambda a, rho=1.0: (a >= 0.0).astype(np.float64),
    "sigmoid": lambda a, rho=1.0: _gp19_sigmoid(a),
    "abs": lambda a, rho=1.0: np.abs(a),
    "square": lambda a, rho=1.0: a * a,
    "exp": lambda a, rho=1.0: np.exp(rho * a),
}
