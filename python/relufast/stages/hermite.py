"""Hermite functions of one standard Gaussian, written once for every method: the density,
the probabilists' Hermite polynomials ``He_r`` and the Hermite coefficients
``E[f(z) He_r(z)]`` of activations (closed forms for the shifted ReLU and step, adaptive
quadrature otherwise). Every function takes the order ``r`` first."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtr

__all__ = [
    "SQRT_2PI",
    "gaussian_pdf",
    "hermite_he",
    "relu_coefficient",
    "step_coefficient",
    "activation_coefficient",
]

SQRT_2PI = math.sqrt(2.0 * math.pi)


def _like(out, z):
    return out[()] if np.ndim(z) == 0 else out


def gaussian_pdf(z):
    """The standard normal density ``phi(z)`` (float for a float, array for an array)."""
    z = np.asarray(z, dtype=np.float64)
    return _like(np.exp(-0.5 * z * z) / SQRT_2PI, z)


def hermite_he(r, z):
    """Probabilists' ``He_r(z)`` by the recurrence ``He_{j+1} = z He_j - j He_{j-1}``."""
    if r < 0:
        raise ValueError(f"the order r must be >= 0; got {r}")
    z = np.asarray(z, dtype=np.float64)
    h0, h1 = np.ones_like(z), z
    if r == 0:
        return _like(h0, z)
    for j in range(1, r):
        h0, h1 = h1, z * h1 - j * h0
    return _like(h1, z)


def relu_coefficient(r, b):
    """``c_r(b) = E[relu(z + b) He_r(z)]`` (ATV21 Lemma 3.5; with a unit row w,
    ``E[relu(w.x + b) He_r(x)] = c_r(b) w^(x r)``): ``c_0 = b Phi(b) + phi(b)``,
    ``c_1 = Phi(b)``, ``c_r = (-1)^r He_{r-2}(b) phi(b)`` for r >= 2."""
    if r < 0:
        raise ValueError(f"the order r must be >= 0; got {r}")
    b = np.asarray(b, dtype=np.float64)
    if r == 0:
        out = b * ndtr(b) + gaussian_pdf(b)
    elif r == 1:
        out = ndtr(b)
    else:
        out = (-1.0) ** r * hermite_he(r - 2, b) * gaussian_pdf(b)
    return _like(np.asarray(out, dtype=np.float64), b)


def step_coefficient(r, b):
    """``E[1[z + b >= 0] He_r(z)]``: ``Phi(b)`` for r = 0, ``(-1)^(r-1) He_{r-1}(b) phi(b)``
    for r >= 1 (the derivative of :func:`relu_coefficient` in b)."""
    if r < 0:
        raise ValueError(f"the order r must be >= 0; got {r}")
    b = np.asarray(b, dtype=np.float64)
    out = ndtr(b) if r == 0 else (-1.0) ** (r - 1) * hermite_he(r - 1, b) * gaussian_pdf(b)
    return _like(np.asarray(out, dtype=np.float64), b)


def activation_coefficient(r, activation):
    """``E[f(z) He_r(z)]`` of a rectified activation f (zero for z < 0: a name, a power or a
    :class:`relufast.activations.Activation`), by adaptive quadrature on (0, 40) (the
    Gaussian weight beyond 40 is below 1e-300)."""
    from scipy.integrate import quad

    from ..activations import get_activation

    act = get_activation(activation)
    val, _ = quad(
        lambda t: float(act.forward(np.array([t]))[0]) * float(hermite_he(r, t)) * float(gaussian_pdf(t)),
        0,
        40.0,
        limit=200,
    )
    return val
