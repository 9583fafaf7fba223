"""Tensor decomposition stage: input span, Jennrich's algorithm, CP-ALS polish.

These operate on small objects (k x k x k after projection), so they use NumPy/LAPACK
directly. The pipeline (``docs/bjw19.md``, "the tensor estimate") is: the span of
the rows of V from the unfolded second-order moment, projection of the moment onto that
span, simultaneous diagonalisation of two random contractions (Jennrich), and a CP-ALS
polish started from Jennrich's factors.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "input_span",
    "project",
    "jennrich",
    "cp_als",
    "merge_symmetric_factors",
    "draw_candidates",
    "as_third_order",
    "contract",
    "power_iteration",
]


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


def as_third_order(T):
    """A 3-way view of a tensor of order 3 or 4 for :func:`jennrich`.

    Order 3 is returned as is; an order-4 tensor ``sum_j w_j v_j^(x)4`` of shape (k, k, k, k)
    becomes ``sum_j w_j (v_j (x) v_j) (x) v_j (x) v_j`` of shape (k^2, k, k), whose first
    factors v_j (x) v_j are pairwise non-parallel whenever the v_j are.
    """
    T = np.asarray(T, dtype=np.float64)
    if T.ndim == 3:
        return T
    if T.ndim == 4:
        a, b = T.shape[0], T.shape[1]
        return T.reshape(a * b, T.shape[2], T.shape[3])
    raise ValueError(f"expected a tensor of order 3 or 4; got order {T.ndim}")


def contract(T, v, times=None):
    """Contract the last ``times`` modes of T (default all but the first) with v."""
    T = np.asarray(T, dtype=np.float64)
    times = T.ndim - 1 if times is None else times
    for _ in range(times):
        T = T @ v
    return T


def power_iteration(T, n_components, rng, *, n_starts=10, n_iter=100, tol=1e-12):
    """Robust tensor power method with deflation for a symmetric tensor of order 3 or 4.

    For ``T = sum_j w_j v_j^(x)p`` with orthonormal v_j (after whitening), each component
    is a fixed point of ``u <- T(I, u, ..., u) / |T(I, u, ..., u)|``; of ``n_starts``
    random starts the one with the largest |T(u, ..., u)| is kept, then deflated
    (Anandkumar et al., JMLR 2014, Alg. 1). Order 4 keeps the sign of w_j (u and -u are the
    same component); order 3 fixes the sign of v_j by that of w_j.

    Returns
    -------
    weights : ndarray of shape (n_components,)
        ``T(v_j, ..., v_j)``.
    vectors : ndarray of shape (n_components, k)
        Unit-norm components, one per row.
    """
    T = np.array(T, dtype=np.float64)
    p, k = T.ndim, T.shape[0]
    if p not in (3, 4) or any(n != k for n in T.shape):
        raise ValueError(f"expected a symmetric tensor of order 3 or 4; got shape {T.shape}")
    weights, vectors = [], []
    for _ in range(n_components):
        best = None
        for _ in range(n_starts):
            u = rng.standard_normal(k)
            u /= np.linalg.norm(u)
            for _ in range(n_iter):
                g = contract(T, u)
                nrm = np.linalg.norm(g)
                if nrm == 0:
                    break
                u_new = g / nrm
                if p == 4 and u_new @ u < 0:  # order 4: T(I,u,u,u) keeps the sign of w
                    u_new = -u_new
                done = np.linalg.norm(u_new - u) < tol
                u = u_new
                if done:
                    break
            lam = float(contract(T, u, p))
            if best is None or abs(lam) > abs(best[0]):
                best = (lam, u)
        lam, u = best
        if p == 3 and lam < 0:
            lam, u = -lam, -u
        weights.append(lam)
        vectors.append(u)
        outer = u
        for _ in range(p - 1):
            outer = np.multiply.outer(outer, u)
        T -= lam * outer
    return np.array(weights), np.array(vectors)
