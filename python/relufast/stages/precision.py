"""Precision of the outputs and the thresholds derived from it.

A deployed network computes in float32: its outputs carry a relative rounding error of
order ``eps sqrt(d)`` (the d-term dot products of the hidden layer), with ``eps = 2^-24``.
Every zero test of a pipeline (rank of the outputs, membership in a span, equality of
output directions, the null space of a refinement system, the residual certificate) was
set for float64 outputs, many orders above ``2^-53``; at float32 such a test reads rounding
as signal. :class:`Precision` turns a float64 threshold into the one for the outputs'
precision: unchanged for float64, raised to the rounding floor otherwise. A network
that reproduces the outputs to that floor is certified ``exact`` at that precision
(``RecoveryResult.precision`` says which).

Measured floor (NumPy float32 forward pass of random networks, d = 10..200, k = 5..50,
with and without biases): relative residual of the true network against its float32
outputs ``0.3-0.5 eps sqrt(d)``; :data:`FLOOR_FACTOR` leaves a margin of 16x or more.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

__all__ = [
    "Precision",
    "resolve_precision",
    "refine_tolerances",
    "polish_at_precision",
    "UNIT_ROUNDOFF",
    "FLOOR_FACTOR",
    "POLISH_ROWS",
]

#: Unit roundoff of the floating-point formats outputs may come in.
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}

#: Rounding floor = FLOOR_FACTOR * eps * sqrt(d + k): measured residuals are 0.3-0.5 eps sqrt(d).
FLOOR_FACTOR = 8.0


class Precision(NamedTuple):
    """Precision of the outputs Y.

    Attributes
    ----------
    name : str
        ``"float64"``, ``"float32"``, ``"float16"`` or ``"bfloat16"``.
    eps : float
        Unit roundoff of that format.
    """

    name: str
    eps: float

    @property
    def is_double(self) -> bool:
        return self.name == "float64"

    def floor(self, d: int, k: int = 0) -> float:
        """Relative rounding floor of outputs of a (d -> k -> m) network at this precision
        (0 for float64, where each method's own thresholds already apply)."""
        return 0.0 if self.is_double else FLOOR_FACTOR * self.eps * float(np.sqrt(d + k))

    def tol(self, tol64: float, d: int, k: int = 0) -> float:
        """The float64 threshold ``tol64`` of a zero test, raised to the rounding floor."""
        return max(float(tol64), self.floor(d, k))


def resolve_precision(Y, precision=None) -> Precision:
    """The precision of the outputs: ``precision`` when given, else from Y's dtype.

    Parameters
    ----------
    Y : array-like
        The outputs as the user passed them (before conversion to float64).
    precision : None, str, numpy dtype or float
        None (from the dtype of Y: float32/float16 arrays, torch tensors too, are taken at
        their precision, anything else as float64), a format name (``"float32"``), a
        dtype, or a unit roundoff as a number in (0, 0.01].

    Returns
    -------
    Precision
    """
    if precision is None:
        dt = getattr(Y, "dtype", None)
        name = str(dt).replace("torch.", "") if dt is not None else "float64"
        name = name if name in UNIT_ROUNDOFF else "float64"
        return Precision(name, UNIT_ROUNDOFF[name])
    if isinstance(precision, Precision):
        return precision
    if isinstance(precision, numbers.Real) and not isinstance(precision, bool):
        if not (0 < float(precision) <= 1e-2):
            raise ValueError(f"precision as a number is a unit roundoff in (0, 0.01]; got {precision!r}")
        eps = float(precision)
        named = [n for n, e in UNIT_ROUNDOFF.items() if e == eps]
        return Precision(named[0] if named else f"eps={eps:.3g}", eps)
    try:
        name = np.dtype(precision).name if not isinstance(precision, str) or precision != "bfloat16" else "bfloat16"
    except TypeError:
        name = ""  # not a dtype: rejected just below
    if name not in UNIT_ROUNDOFF:
        raise ValueError(
            "precision must be None, one of "
            + ", ".join(repr(n) for n in UNIT_ROUNDOFF)
            + f", a float dtype or a unit roundoff; got {precision!r}"
        )
    return Precision(name, UNIT_ROUNDOFF[name])


def refine_tolerances(prec: Precision, d: int, k: int) -> dict:
    """Keyword thresholds of :func:`relufast.stages.refine.refine_rows` (BJW19 Alg. 5) at
    this precision: the null-space and verification zero tests move to the floor."""
    if prec.is_double:
        return {}
    return {"tol_null": prec.tol(1e-10, d, k), "tol_verify": prec.tol(1e-9, d, k), "tol_support": prec.tol(1e-9, d, k)}


#: Samples the float64 polish of a bias-free network uses (then U on all samples).
POLISH_ROWS = 20000


def polish_at_precision(X, Y, U, V, b=None, c=None, *, threads=0, n_iter=4, how="region"):
    """Polish a network certified at a lower precision in float64 (beyond the papers).

    Bias-free networks: the bias-free activation-region refinement
    (:func:`relufast.stages.refine.region_refine` with ``bias=False, offset=False``) on at
    most :data:`POLISH_ROWS` samples, then U by least squares on all samples. (A dense
    Gauss-Newton in (U, V) reached the same weights, 9e-10 at d = k = m = 10 from float32
    outputs, 15x to 28x slower: 10 s against 0.7 s there, 106 s against 3.8 s at
    d = k = m = 20.) Biased networks: the activation-region refinement on all samples,
    which fits (U, V, b, c) in float64. The polished network is kept only when its residual
    over all samples is not larger.

    ``how="gauss-newton"`` keeps the dense Gauss-Newton for bias-free networks: for fits that
    are not exact at any precision (a merged near-duplicate pair), where the least-squares
    optimum, not the exact network, is wanted.

    Returns (U, V, b, c, residual) with b, c None for the bias-free model.
    """
    from ..activations import RELU
    from .fit import fit_network, polish, relative_residual
    from .refine import region_refine

    r0 = relative_residual(X, Y, V, U, threads, RELU, b=b, c=c)
    if b is None and c is None and how == "gauss-newton":
        rows = slice(0, min(len(X), POLISH_ROWS))
        try:
            _, V2 = polish(X[rows], Y[rows], U, V, n_iter=n_iter)
            fit = fit_network(X, Y, V2, threads=threads)
        except np.linalg.LinAlgError:
            return U, V, b, c, r0
        if fit.residual <= r0:
            return fit.U, V2, None, None, fit.residual
        return U, V, b, c, r0
    if b is None and c is None:
        rows = slice(0, min(len(X), POLISH_ROWS))
        try:
            rr = region_refine(
                X[rows], Y[rows], V, None, U, None, max_rounds=n_iter, n_jobs=threads or None, bias=False, offset=False
            )
            fit = fit_network(X, Y, rr.V, threads=threads)
        except (np.linalg.LinAlgError, ValueError):  # e.g. more activation regions than allowed
            return U, V, b, c, r0
        if fit.residual <= r0 and not rr.undetermined:
            return fit.U, rr.V, None, None, fit.residual
        return U, V, b, c, r0
    try:
        rr = region_refine(X, Y, V, np.zeros(V.shape[0]) if b is None else b, U, c, max_rounds=n_iter, n_jobs=threads)
    except (np.linalg.LinAlgError, ValueError):  # e.g. more activation regions than allowed
        return U, V, b, c, r0
    if rr.residual <= r0:
        return rr.U, rr.V, rr.b, rr.c, rr.residual
    return U, V, b, c, r0
