"""Last-layer units that never switch: the outputs affine in the layer below.

A unit of the last hidden layer that is active at every input (trained networks have
many: 61 of the 100 second-layer units of the trained diabetes 10-100-100-1 of the
defaults bench were active at all of 2.8 million Gaussian inputs at scales 0.3 to 1000,
and positive at infinity in every direction drawn) has no kink: no query can find its row.
Its part of the outputs, ``a_j relu(z_j) = a_j (w_j . h + b_j)``, is affine in the layer
below's units h, and so is the sum of all such units' parts, ``B h + c``; a unit never
active adds nothing. The function is then the units found plus an affine term in h
(:func:`explained` tests it on the model's outputs), and since ``h >= 0`` that term is
exactly ``relu(B+ h) - relu(B- h)`` (``B = B+ - B-``, both nonnegative): at most two
always-active units an output (:func:`affine_units`). The network returned has the
requested widths, the units not found replaced by those and by units never active, all
listed in ``undetermined_units``: exact then means the function, not those units' weights.
"""

from __future__ import annotations

import numpy as np

from .._validation import NonFiniteOutputs
from .net import features, pre_activations
from .residual import _design

__all__ = ["affine_units", "explained"]

#: Gaussian points of the test at each scale (the same points for every test of a layer).
AFFINE_POINTS, AFFINE_SCALES = 4096, (1.0, 3.0, 10.0)
#: Largest residual of the fit, relative to the largest output at the point's scale, under
#: which the units not found are affine in the layer below (float64 only). With the true
#: rows of the switching units the residual is 1.1e-15 to 2.5e-15, with one of them left out
#: 0.03 to 0.2 (the planted 10-12-8-1, 20-16-12-2 and 30-40-30-1 of
#: tests/test_chosen_affine.py, an ad-hoc run); the margin is for rows from chains, found to
#: 1e-8 to 1e-7 (:mod:`.nullspace`).
AFFINE_TOL = 1e-6


def explained(oracle, known, tent, Theta, rng, carry):
    """Whether the model's outputs are, to AFFINE_TOL, an affine function of ``relu(zeta)``
    of the rows found (``Theta``, in phi-space of ``tent``, either sign) and of phi itself,
    on Gaussian points at AFFINE_SCALES (queried once, kept in ``carry``)."""
    if oracle.low_precision or len(Theta) == 0:
        return False
    if "affine_points" not in carry:
        d = oracle.d
        X = np.vstack([s * rng.standard_normal((AFFINE_POINTS, d)) for s in AFFINE_SCALES])
        try:
            carry["affine_points"] = (X, oracle(X))
        except NonFiniteOutputs:
            carry["affine_points"] = None
    if carry["affine_points"] is None:
        return False
    X, Y = carry["affine_points"]
    Phi = features(known, tent, X)[0]
    F = _design(Phi, Theta, Phi.shape[1])  # relu(+-zeta) of the rows found, every phi, 1
    if F.shape[1] >= len(X) // 2:  # too few points for the fit to test anything
        return False
    coef = np.linalg.lstsq(F, Y, rcond=None)[0]
    r = np.linalg.norm(Y - F @ coef, axis=1).reshape(len(AFFINE_SCALES), -1)
    top = np.abs(Y).max(axis=1).reshape(len(AFFINE_SCALES), -1).max(axis=1, keepdims=True)
    return bool(np.all(r <= AFFINE_TOL * np.maximum(top, 1e-300)))


def affine_units(known, last, X, Y):
    """The last hidden layer ``last`` (its units found) extended by the always-active units
    that carry the outputs' affine term in the layer below, and the output layer, by least
    squares on ``[relu(z_L), h_{L-1}, 1]`` at X: (layer (W, b), output layer (W_o, c),
    number of units added). ``known`` are the layers before (at least one)."""
    Z, H = pre_activations([*known, last], X)
    Hp = np.maximum(Z[-2], 0.0)
    k = last[0].shape[0]
    C = np.linalg.lstsq(np.hstack([H, Hp, np.ones((len(X), 1))]), Y, rcond=None)[0]
    A, B, c = C[:k].T, C[k:-1].T, C[-1]
    rows, cols = [], []
    for i in range(B.shape[0]):
        for sign in (1.0, -1.0):
            part = np.maximum(sign * B[i], 0.0)
            if np.any(part > 0):
                rows.append(part)
                col = np.zeros(B.shape[0])
                col[i] = sign
                cols.append(col)
    if not rows:
        return last, (A, c), 0
    W = np.vstack([last[0], np.array(rows)])
    b = np.concatenate([last[1], np.zeros(len(rows))])
    return (W, b), (np.hstack([A, np.array(cols).T]), c), len(rows)
