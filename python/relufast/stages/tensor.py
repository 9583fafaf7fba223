"""Tensor decomposition stage: input span, Jennrich's algorithm, CP-ALS polish.

These operate on small objects (k x k x k after projection), so they use NumPy/LAPACK
directly. The pipeline (``docs/bjw19.md``, "the tensor estimate") is: the span of
the rows of V from the unfolded second-order moment, projection of the moment onto that
span, simultaneous diagonalisation of two random contractions (Jennrich), and a CP-ALS
polish started from Jennrich's factors.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from .._blas import dgemm_capsule as _dgemm
from .._blas import kernel_threads, single_threaded_blas
from .._deadline import check as check_deadline
from .._native import core

__all__ = [
    "input_span",
    "project",
    "jennrich",
    "cp_als",
    "merge_symmetric_factors",
    "khatri_rao",
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


def khatri_rao(B, C):
    """Column-wise Kronecker product: row ``j * C.shape[0] + l`` is ``B[j] * C[l]``."""
    return (B[:, None, :] * C[None, :, :]).reshape(B.shape[0] * C.shape[0], B.shape[1])


def _solve_gram(T, G):
    """``T G^+`` for a symmetric Gram-type matrix G (the normal equations of an ALS step):
    by Cholesky when G is well conditioned (the usual case, ~10x cheaper than the
    pseudo-inverse's eigendecomposition), else by the pseudo-inverse."""
    try:
        L, low = scipy.linalg.cho_factor(G, check_finite=False)
        diag = np.abs(np.diag(L))
        if diag.size and diag.min() ** 2 > 1e-12 * diag.max() ** 2:
            return scipy.linalg.cho_solve((L, low), T.T, check_finite=False).T
    except (np.linalg.LinAlgError, ValueError):
        pass
    return T @ np.linalg.pinv(G, hermitian=True)


def _slices(Pm, m, k1, C, W=None, out=None):
    """``Pm @ C`` for the unfolding Pm ((m k1) x k') of a tensor, as m slices of k1 rows, and
    with W (k1, r) the mode-1 MTTKRP ``T[i, r] = sum_p (Pm @ C)[i k1 + p, r] W[p, r]``: the
    C++ kernel ``slice_products`` on the method's threads, each slice block's product by
    SciPy's dgemm on one BLAS thread (the caller holds the BLAS at one thread), written into
    ``out`` when given (the same buffers at every sweep: no pages to fault in each time)."""
    if k1 == 0:
        return np.zeros((0, C.shape[1])), np.zeros((0 if W is None else m, C.shape[1]))
    W = None if W is None else np.ascontiguousarray(W)
    return core.slice_products(Pm, k1, np.ascontiguousarray(C), W, _dgemm(), kernel_threads(), out)


def _weighted_sum(Q, k, A):
    """``sum_i Q[i, p, r] A[i, r]`` over the slices of Q ((m k) x r): (k, r) (C++ kernel
    ``slice_weighted_sum``, summed in order of i on the method's threads)."""
    if A.shape[0] == 0:
        return np.zeros((k, A.shape[1]))
    return core.slice_weighted_sum(Q, np.ascontiguousarray(A), kernel_threads())


def cp_als(P, B0, *, n_iter=100, tol=1e-13, fixed=None, factor_tol=0.0, settle=None):
    """Non-symmetric CP-ALS for P (m, k, k) with r = B0.shape[1] free components, started at
    (., B0, B0).

    Each iteration contracts P with the current input-mode factors twice (two GEMMs of
    ``m k^2 r`` flops: ``P x_3 C`` gives the updates of A and B, ``P x_2 B`` that of C), so
    the updates need no Khatri-Rao product. The fit on the mode-1 unfolding (the stopping
    test) is the explicit residual, or, with ``factor_tol``, computed from the same
    contractions while that is precise enough.

    Parameters
    ----------
    fixed : ndarray of shape (k, f), optional
        Components already known (relufast, for a completion): their input-mode factors
        stay fixed, in both B and C; their output-mode factors are refitted with the free
        ones at every step. Rows certified by the exact refinement are fixed this way, so
        the free components are drawn to the units still missing.
    factor_tol : float, default=0.0
        Also stop when no free column of B or C moved by more than this (1 - |cos|); 0
        stops on the fit alone. The pipelines that refine the result exactly need angles
        of about 0.1 rad, not a converged fit.

    Returns A (m, f + r), B (k, r), C (k, r): the fixed components come first in A; B and C
    hold the free components, with unit-norm columns.
    """
    # SciPy's dgemm runs on the kernels' threads, each call on one BLAS thread.
    with single_threaded_blas():
        return _cp_als(P, B0, n_iter, tol, fixed, factor_tol, settle)


def _cp_als(P, B0, n_iter, tol, fixed, factor_tol, settle=None):
    P = np.asarray(P, dtype=np.float64)
    # ALS is scale-equivariant in P (A scales, B and C are unit): work at max |P| = 1 so that
    # the squared norms of the fit neither overflow nor underflow.
    scale = float(np.max(np.abs(P))) if P.size else 0.0
    if not (np.isfinite(scale) and scale > 0):
        scale = 1.0
    P = P / scale
    m, k1, k2 = P.shape
    Pc = P.reshape(m * k1, k2)  # P x_3 C
    Pb = np.ascontiguousarray(P.transpose(0, 2, 1)).reshape(m * k2, k1)  # P x_2 B
    p2 = float(np.vdot(P, P))
    B = np.array(B0, dtype=np.float64)
    C = B.copy()
    r = B.shape[1]
    if fixed is None:
        F, f = np.zeros((k1, 0)), 0
    else:
        F = np.asarray(fixed, dtype=np.float64)
        f = F.shape[1]
    # The fixed components' contractions do not change: P x_3 F and P x_2 F.
    PF = (Pc @ F).reshape(m, k1, f)
    T1F = np.einsum("ipf,pf->if", PF, F)

    def a_update(T1):
        Bt, Ct = np.concatenate([F, B], axis=1), np.concatenate([F, C], axis=1)
        return _solve_gram(np.concatenate([T1F, T1], axis=1), (Bt.T @ Bt) * (Ct.T @ Ct))

    QC, QB = np.empty((m * k1, r)), np.empty((m * k2, r))
    PC, T1 = _slices(Pc, m, k1, C, B, QC)
    A = a_update(T1)
    prev = np.inf
    for _ in range(n_iter):
        check_deadline("in a CP-ALS iteration")
        A = a_update(T1)
        Af, Ar = A[:, :f], A[:, f:]
        AtA = Ar.T @ Ar
        B_old, C_old = B, C
        T2 = _weighted_sum(PC, k1, Ar)
        if f:
            T2 -= F @ ((Af.T @ Ar) * (F.T @ C))
        B = _solve_gram(T2, AtA * (C.T @ C))
        B /= np.maximum(np.linalg.norm(B, axis=0), 1e-300)
        T3 = _weighted_sum(_slices(Pb, m, k2, B, None, QB)[0], k2, Ar)
        if f:
            T3 -= F @ ((Af.T @ Ar) * (F.T @ B))
        C = _solve_gram(T3, AtA * (B.T @ B))
        C /= np.maximum(np.linalg.norm(C, axis=0), 1e-300)
        PC, T1 = _slices(Pc, m, k1, C, B, QC)
        # ||P - model||^2 = ||P||^2 - 2 <P, model> + ||model||^2 (model: A with the new B, C).
        Bt, Ct = np.concatenate([F, B], axis=1), np.concatenate([F, C], axis=1)
        inner = float(np.sum(T1F * Af)) + float(np.sum(T1 * Ar))
        model2 = float(np.sum((A.T @ A) * (Bt.T @ Bt) * (Ct.T @ Ct)))
        sq = p2 - 2.0 * inner + model2
        # That difference carries an absolute error of a few eps ||P||^2: precise enough for
        # the stopping test only while it is large. Otherwise the explicit residual (always
        # without factor_tol, so such callers stop where the textbook iteration stops).
        if factor_tol > 0 and sq * tol > 1e3 * np.finfo(float).eps * p2:
            fit = float(np.sqrt(sq))
        elif factor_tol > 0:
            fit = None
        else:
            fit = float(np.linalg.norm(P.reshape(m, -1) - A @ khatri_rao(Bt, Ct).T))
        if fit is not None and abs(prev - fit) <= tol * max(fit, 1e-300):
            break
        if factor_tol > 0 and r:
            moved = np.maximum(1.0 - np.abs(np.sum(B * B_old, axis=0)), 1.0 - np.abs(np.sum(C * C_old, axis=0)))
            if np.sort(moved)[min(r, settle or r) - 1] <= factor_tol:
                break
        prev = np.inf if fit is None else fit
    return A * scale, B, C


def merge_symmetric_factors(B, C):
    """Average the two input-mode factors column by column after aligning signs; unit columns."""
    s = np.sign(np.sum(B * C, axis=0))
    s[s == 0] = 1.0
    Z = B + s * C
    return Z / np.maximum(np.linalg.norm(Z, axis=0), 1e-300)


def draw_candidates(P, W, rng, *, factor_tol=0.0):
    """One Jennrich draw and its CP-ALS polish (``factor_tol``: see :func:`cp_als`).

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
    A, Bf, Cf = cp_als(P, Z, factor_tol=factor_tol)
    fit = float(np.linalg.norm(P.reshape(P.shape[0], -1) - A @ khatri_rao(Bf, Cf).T) / max(np.linalg.norm(P), 1e-300))
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


def _array_operator(T):
    """The contraction ``U -> (T(I, u, ..., u), T(u, ..., u))`` row by row, for an array T."""

    def apply(U):
        G = np.array([contract(T, u) for u in U])
        return G, np.einsum("ij,ij->i", G, U)

    return apply


def power_iteration(
    T,
    n_components,
    rng,
    *,
    n_starts=10,
    n_iter=100,
    tol=1e-12,
    n_features=None,
    order=None,
    sign=None,
    shift=0.0,
    deflation=None,
):
    """Robust tensor power method with deflation for a symmetric tensor of order 3 or 4.

    For ``T = sum_j w_j v_j^(x)p`` with orthonormal v_j (after whitening), each component
    is a fixed point of ``u <- T(I, u, ..., u) / |T(I, u, ..., u)|``; of ``n_starts``
    random starts (iterated together, one operator call per iteration for all of them)
    the one with the largest |T(u, ..., u)| is kept, then deflated (Anandkumar et al.,
    JMLR 2014, Alg. 1). Order 4 keeps the sign of w_j (u and -u are the same component);
    order 3 fixes the sign of v_j by that of w_j.

    Parameters
    ----------
    T : ndarray of shape (k,) * p (p = 3 or 4), or callable
        The tensor, or an operator that applies it: ``T(U) -> (G, values)`` for unit rows
        U (r, k), with G (r, k) the rows ``T(I, u, ..., u)`` and values (r,) the
        ``T(u, ..., u)`` (both up to one common positive factor). A callable lets the
        tensor stay implicit, e.g. contracted from the samples in one streamed pass per
        call (GP19 Step 1: ``relufast.algorithms.gp19``).
    n_components : int
    rng : numpy Generator
    n_starts, n_iter : int
        Random starts per component and iterations per component.
    tol : float
        Stop a component's iterations once every start moved by less than ``tol`` (in
        norm; for order 4 up to the sign of the step).
    n_features : int, optional
        k for a callable T (an array gives its own).
    order : {3, 4}, optional
        The order p for a callable T (default 4; an array gives its own).
    sign : {None, 1, -1}
        None: components of either sign (order 4: the iterate's sign is aligned with the
        previous one; the start with the largest ``|T(u, ..., u)|`` wins). +-1: components
        whose weights have this sign: iterate ``sign T(I, u, ..., u) + shift u`` and keep
        the start with the largest ``sign T(u, ..., u)`` (the SS-HOPM form).
    shift : float, default=0.0
        SS-HOPM shift (with ``sign``).
    deflation : {None, "subtract", "project"}
        "subtract": ``T <- T - w u^(x)p`` (arrays only); "project": keep the starts and
        iterates orthogonal to the components found (for an implicit T). None:
        "subtract" for arrays, "project" for callables.

    Returns
    -------
    weights : ndarray of shape (n_components,)
        ``T(v_j, ..., v_j)`` (in the callable's scale).
    vectors : ndarray of shape (n_components, k)
        Unit-norm components, one per row.
    """
    if callable(T):
        if n_features is None:
            raise TypeError("power_iteration needs n_features= with a callable T")
        apply, k, p = T, int(n_features), 4 if order is None else int(order)
        deflation = "project" if deflation is None else deflation
        if deflation != "project":
            raise ValueError(f"a callable T can only be deflated by 'project'; got deflation={deflation!r}")
    else:
        T = np.array(T, dtype=np.float64)
        p, k = T.ndim, T.shape[0]
        if p not in (3, 4) or any(n != k for n in T.shape):
            raise ValueError(f"expected a symmetric tensor of order 3 or 4; got shape {T.shape}")
        deflation = "subtract" if deflation is None else deflation
        apply = _array_operator(T)
    if p not in (3, 4) or deflation not in ("subtract", "project") or sign not in (None, 1, -1, 1.0, -1.0):
        raise ValueError(
            f"order must be 3 or 4, deflation 'subtract' or 'project', sign None or +-1; got {p}, "
            f"{deflation!r}, {sign!r}"
        )
    weights, found = [], np.zeros((0, k))
    for _ in range(n_components):
        keep_out = found if deflation == "project" else found[:0]
        U = _power_starts(rng, n_starts, k, keep_out)
        for _ in range(n_iter):
            G = apply(U)[0]
            U, change = _power_step(U, G, keep_out, p, sign, shift)
            if change < tol:
                break
        lam = apply(U)[1]
        best = int(np.argmax(np.abs(lam) if sign is None else sign * lam))
        lam, u = float(lam[best]), U[best]
        if p == 3 and lam < 0:
            lam, u = -lam, -u
        weights.append(lam)
        found = np.vstack([found, u])
        if deflation == "subtract":
            outer = u
            for _ in range(p - 1):
                outer = np.multiply.outer(outer, u)
            T -= lam * outer
    return np.array(weights), found


def _power_starts(rng, n_starts, k, found):
    """Unit random starts, orthogonal to the rows of ``found`` (projection deflation)."""
    U = rng.standard_normal((n_starts, k))
    U -= (U @ found.T) @ found
    return U / np.linalg.norm(U, axis=1, keepdims=True)


def _power_step(U, G, found, p, sign, shift):
    """One power step of every start; returns the new unit rows and the largest move."""
    if sign is not None:
        G = sign * G + shift * U
    G = G - (G @ found.T) @ found
    nrm = np.linalg.norm(G, axis=1, keepdims=True)
    still = nrm[:, 0] == 0  # T(I, u, ..., u) = 0: the start stays where it is
    Un = np.where(still[:, None], U, G / np.where(still, 1.0, nrm[:, 0])[:, None])
    cos = np.einsum("ij,ij->i", Un, U)
    if p == 4 and sign is None:  # order 4: T(I,u,u,u) keeps the sign of w
        Un = np.where((cos < 0)[:, None], -Un, Un)
        cos = np.abs(cos)
    moved = Un - np.where(cos < 0, -1.0, 1.0)[:, None] * U if p == 4 else Un - U
    change = float(np.max(np.linalg.norm(moved, axis=1)))
    return Un, change
