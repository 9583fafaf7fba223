"""The tensor estimate shared by the BJW19 Gaussian pipelines (Alg. 4 with the spec's fix).

``moment_span`` accumulates the second-order moment of the (compressed) outputs in C++ and
returns the span of V and the projected k x k x k tensor; ``draw_candidates`` runs one
Jennrich draw plus a CP-ALS polish and returns candidate rows (up to sign).
"""
from __future__ import annotations

import numpy as np

from .._native import core
from .._validation import check_positive_int
from ..refine import relu_stats
from ..tensor import cp_als, input_span, jennrich, merge_symmetric_factors, project

__all__ = ["moment_span", "draw_candidates", "refinement_subset", "relative_residual"]


def moment_span(X, Y, k, Q, threads, block_size, whitener=None):
    """Moment of ``Y Q`` (Q None: Y itself), span W (d, k), projected tensor P (k, k, k).

    With ``whitener`` (d, d symmetric, E[x x^T]^{-1/2}) the moment is that of the whitened
    inputs ``x_w = whitener x`` (BJW19 Remark 3), obtained from the raw sums without a
    whitened copy of X: ``T_w[i] = Wh (S_i / n) Wh - mean(y_i) I``.

    Returns (W, P, eigenvalues of sum_i T[i]^2 in descending order).
    """
    d = X.shape[1]
    acc = core.SecondMoment(d, k)
    acc.update(X, Y, threads, block_size, Q)
    T = acc.tensor().reshape(k, d, d)
    if whitener is not None:
        ybar = acc.sum_y / acc.count
        raw = T + ybar[:, None, None] * np.eye(d)  # S_i / n
        T = np.einsum("ab,ibc,cd->iad", whitener, raw, whitener) - ybar[:, None, None] * np.eye(d)
    W, evals = input_span(T, k)
    return W, project(T, W), evals


def draw_candidates(P, W, rng):
    """One Jennrich draw and its CP-ALS polish.

    Returns
    -------
    cand : ndarray of shape (2k, d)
        Rows 0..k-1 from the polished factors, rows k..2k-1 from Jennrich alone (unit
        norm, sign unknown).
    gap : float
        Jennrich's minimum relative eigen-gap.
    fit : float
        Relative error of the polished CP model of P (small: a good draw).
    """
    Z, gap = jennrich(P, rng)
    A, Bf, Cf = cp_als(P, Z)
    fit = float(np.linalg.norm(P - np.einsum("ir,jr,kr->ijk", A, Bf, Cf)) / max(np.linalg.norm(P), 1e-300))
    cand = np.vstack([(W @ merge_symmetric_factors(Bf, Cf)).T, (W @ Z).T])
    cand /= np.maximum(np.linalg.norm(cand, axis=1, keepdims=True), 1e-300)
    return cand, gap, fit


def refinement_subset(X, Y, k, n_refine, rng, minimum=1):
    """The l samples used by the exact refinement (default ``min(n, max(1000, 25 d, 100 k))``),
    drawn at random without replacement. Returns (X_l, Y_l)."""
    n, d = X.shape
    if n_refine is None:
        ell = min(n, max(1000, 25 * d, 100 * k))
    else:
        ell = min(n, check_positive_int(n_refine, "n_refine", minimum=minimum))
    idx = np.sort(rng.choice(n, size=ell, replace=False)) if ell < n else np.arange(n)
    return np.ascontiguousarray(X[idx]), np.ascontiguousarray(Y[idx])


def relative_residual(X, Y, V, U, threads, activation):
    """``||Y - f(X V^T) U^T||_F / ||Y||_F`` over all samples (one threaded pass)."""
    st = relu_stats(X, Y, V, U, n_jobs=threads, activation=activation)
    return float(np.sqrt(st["sq_residual"] / st["sq_norm"])) if st["sq_norm"] > 0 else float("nan")
