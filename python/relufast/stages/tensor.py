"""Tensor decomposition stage: input span, Jennrich's algorithm, CP-ALS polish.

These operate on small objects (k x k x k after projection), so they use NumPy/LAPACK
directly. The pipeline (``docs/bjw19.md``, "the tensor estimate") is: the span of
the rows of V from the unfolded second-order moment, projection of the moment onto that
span, simultaneous diagonalisation of two random contractions (Jennrich), and a CP-ALS
polish started from Jennrich's factors.
"""
from __future__ import annotations

import numpy as np

__all__ = ["input_span", "project", "jennrich", "cp_als", "merge_symmetric_factors", "draw_candidates"]


def input_span(T, k):
    """Orthonormal basis (d, k) of the span of the rows of V from moments T (m, d, d).

    Each slice T[i] has range inside span(V^T); the top-k eigenvectors of
    ``sum_i T[i] T[i]^T`` span it.

    Returns
    -------
    W : ndarray of shape (d, k)
    eigenvalues : ndarray of shape (d,)
        Eigenvalues of ``sum_i T[i]^2``, descending (their decay shows the rank).
    """
    T = np.asarray(T, dtype=np.float64)
    G = np.einsum("iab,icb->ac", T, T)
    w, Q = np.linalg.eigh(0.5 * (G + G.T))
    order = np.argsort(w)[::-1]
    return Q[:, order[:k]], w[order]


def project(T, W):
    """Project the input modes of T (m, d, d) onto the columns of W (d, k): (m, k, k)."""
    return np.einsum("iab,ap,bq->ipq", T, W, W)


def _relative_gap(eigvals):
    lam = np.asarray(eigvals)
    if lam.size < 2:
        return 1.0
    scale = np.max(np.abs(lam))
    if not scale > 0:
        return 0.0
    diff = np.abs(lam[:, None] - lam[None, :])
    np.fill_diagonal(diff, np.inf)
    return float(diff.min() / scale)


def jennrich(P, rng, *, n_draws=5):
    """Jennrich's simultaneous diagonalisation of a 3-way tensor P (m, k, k).

    For ``P = sum_j a_j (x) z_j (x) z_j`` with linearly independent z_j and pairwise
    non-parallel a_j, ``P(alpha) P(beta)^{-1} = Z D Z^{-1}`` for random contractions of the
    first mode, so the eigenvectors are the z_j. Of ``n_draws`` random pairs the one with
    the largest minimum relative eigen-gap is kept (better conditioned).

    Returns
    -------
    Z : ndarray of shape (k, k)
        Unit-norm columns, the estimated z_j (up to sign).
    gap : float
        Minimum relative eigen-gap of the chosen draw (small means ill-conditioned).
    """
    P = np.asarray(P, dtype=np.float64)
    k = P.shape[1]
    best_Z, best_gap = None, -1.0
    for _ in range(n_draws):
        alpha = rng.standard_normal(P.shape[0])
        beta = rng.standard_normal(P.shape[0])
        Ma = np.tensordot(alpha, P, axes=1)
        Mb = np.tensordot(beta, P, axes=1)
        try:
            M = np.linalg.solve(Mb.T, Ma.T).T  # Ma Mb^{-1}
            lam, Z = np.linalg.eig(M)
        except np.linalg.LinAlgError:
            continue
        if not np.all(np.isfinite(lam)):
            continue
        # Eigenvalues are real in exact arithmetic; a large imaginary part is a bad draw.
        imag = np.max(np.abs(lam.imag)) / max(np.max(np.abs(lam)), 1e-300)
        gap = _relative_gap(lam.real) * (1.0 if imag < 1e-6 else 0.1)
        if gap > best_gap:
            Zr = np.real(Z)
            norms = np.linalg.norm(Zr, axis=0)
            norms[norms == 0] = 1.0
            best_Z, best_gap = Zr / norms, gap
    if best_Z is None:
        best_Z, best_gap = np.linalg.qr(rng.standard_normal((k, k)))[0], 0.0
    return best_Z, float(best_gap)


def cp_als(P, B0, *, n_iter=100, tol=1e-13):
    """Non-symmetric CP-ALS for P (m, k, k) with rank r = B0.shape[1], started at (., B0, B0).

    Returns factors A (m, r), B (k, r), C (k, r) with unit-norm columns in B and C.
    """
    P = np.asarray(P, dtype=np.float64)
    B = np.array(B0, dtype=np.float64)
    C = B.copy()
    A = np.einsum("ijk,jr,kr->ir", P, B, C) @ np.linalg.pinv((B.T @ B) * (C.T @ C))
    prev = np.inf
    for _ in range(n_iter):
        A = np.einsum("ijk,jr,kr->ir", P, B, C) @ np.linalg.pinv((B.T @ B) * (C.T @ C))
        B = np.einsum("ijk,ir,kr->jr", P, A, C) @ np.linalg.pinv((A.T @ A) * (C.T @ C))
        B /= np.maximum(np.linalg.norm(B, axis=0), 1e-300)
        C = np.einsum("ijk,ir,jr->kr", P, A, B) @ np.linalg.pinv((A.T @ A) * (B.T @ B))
        C /= np.maximum(np.linalg.norm(C, axis=0), 1e-300)
        fit = np.linalg.norm(P - np.einsum("ir,jr,kr->ijk", A, B, C))
        if abs(prev - fit) <= tol * max(fit, 1e-300):
            break
        prev = fit
    return A, B, C


def merge_symmetric_factors(B, C):
    """Average the two input-mode factors column by column after aligning signs; unit columns."""
    s = np.sign(np.sum(B * C, axis=0))
    s[s == 0] = 1.0
    Z = B + s * C
    return Z / np.maximum(np.linalg.norm(Z, axis=0), 1e-300)


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
