"""BJW19 under noise: sub-Gaussian noise (Thm 10, Alg. 6) and the shared polish.

Kept apart from ``bjw19.py`` for length; ``bjw19.py`` is the public module.
"""
from __future__ import annotations

import time

import numpy as np

from .._blas import single_threaded_blas
from .._native import BACKEND
from .._result import Run, Status, warn
from .._validation import check_positive_int, check_problem, check_random_state, resolve_n_jobs
from ..refine import output_basis, relu_stats
from ._bjw19_tensor import draw_candidates, moment_span

__all__ = ["noisy", "sign_by_projection", "polish"]


def sign_by_projection(X, Y, V):
    """BJW19 Algorithm 6: choose the sign of each approximate row by projections.

    For row i, ``S_{i,+}`` holds relu(+-X v_j) for j != i and relu(X v_i); ``S_{i,-}`` the
    same with relu(-X v_i). The row keeps its sign when the outputs lie closer to
    span(S_{i,+}) than to span(S_{i,-}) (paper's step 3 writes A for the first line and
    drops a parenthesis: spec errata 6).

    Parameters
    ----------
    X : ndarray of shape (l, d)
    Y : ndarray of shape (l, m)
    V : ndarray of shape (k, d)
        Approximate rows, signs unknown.

    Returns
    -------
    V_signed : ndarray of shape (k, d)
    margins : ndarray of shape (k,)
        ``(a_wrong - a_chosen) / max(a_+, a_-)`` with a_+- the squared projection
        residuals: the confidence of each sign (<= 0 means a guess).
    """
    k = V.shape[0]
    Z = X @ V.T
    pos, neg = np.maximum(Z, 0.0), np.maximum(-Z, 0.0)
    ny2 = float(np.sum(Y * Y))
    V_out = V.copy()
    margins = np.empty(k)
    for i in range(k):
        others = [pos[:, j] for j in range(k) if j != i] + [neg[:, j] for j in range(k) if j != i]
        res = []
        for extra in (pos[:, i], neg[:, i]):
            Q = np.linalg.qr(np.column_stack(others + [extra]))[0]
            res.append(ny2 - float(np.sum((Q.T @ Y) ** 2)))
        a_plus, a_minus = res
        if a_minus < a_plus:
            V_out[i] = -V[i]
        margins[i] = abs(a_minus - a_plus) / max(a_plus, a_minus, 1e-300) * (1.0 if a_plus != a_minus else 0.0)
    return V_out, margins


def _masked_residual(X, Y, U, V, M):
    R = Y - np.maximum(X @ V.T, 0.0) @ U.T
    return R if M is None else M * R


def polish(X, Y, U, V, *, n_iter=10, mask=None, tol=1e-15):
    """Gauss-Newton on ``||M o (Y - relu(X V^T) U^T)||_F^2`` jointly in (U, V) (beyond the paper).

    With the activation pattern of X V^T fixed the model is bilinear; each step solves the
    Gauss-Newton normal equations (minimum-norm, since positive rescaling of a unit is a
    symmetry) with step halving when the residual would grow, then updates the pattern.
    Quadratic convergence on noiseless data; the statistical optimum on noisy data.
    ``mask`` (n, m) of 0/1 weights restricts the fit to trusted entries (the sparse-noise
    pipeline passes the uncorrupted ones).

    Returns (U, V) with unit-norm rows of V.
    """
    n, d = X.shape
    k, m = V.shape[0], Y.shape[1]
    M = None if mask is None else mask.astype(np.float64)
    Mf = np.ones((n, m)) if M is None else M
    U, V = np.array(U, dtype=np.float64), np.array(V, dtype=np.float64)
    R = _masked_residual(X, Y, U, V, M)
    cost = float(np.sum(R * R))
    for _ in range(n_iter):
        if cost <= tol * tol * max(float(np.sum(Y * Y)), 1e-300):
            break
        Z = X @ V.T
        A = (Z > 0).astype(np.float64)
        F = A * Z
        nu, nv = m * k, k * d
        H = np.zeros((nu + nv, nu + nv))
        g = np.zeros(nu + nv)
        for j in range(m):  # U block: rows of U are independent given V
            Fj = F * Mf[:, j : j + 1]
            H[j * k : (j + 1) * k, j * k : (j + 1) * k] = Fj.T @ F
            g[j * k : (j + 1) * k] = Fj.T @ R[:, j]
        for i in range(k):
            Xi = X * A[:, i : i + 1]
            g[nu + i * d : nu + (i + 1) * d] = Xi.T @ (R @ U[:, i])
            for l in range(k):
                # U(j, i) x v_l coupling: sum_s M_sj F_si U_jl A_sl x_s
                C = (Mf * (F[:, i] * A[:, l])[:, None]).T @ X  # (m, d)
                H[np.arange(m) * k + i, nu + l * d : nu + (l + 1) * d] = U[:, l][:, None] * C
                if l >= i:
                    w = (Mf * (U[:, i] * U[:, l])[None, :]).sum(axis=1) * A[:, l]
                    blk = Xi.T @ (X * w[:, None])
                    H[nu + i * d : nu + (i + 1) * d, nu + l * d : nu + (l + 1) * d] = blk
                    H[nu + l * d : nu + (l + 1) * d, nu + i * d : nu + (i + 1) * d] = blk.T
        H[nu:, :nu] = H[:nu, nu:].T
        step = np.linalg.lstsq(H, g, rcond=1e-13)[0]
        t = 1.0
        for _ in range(30):
            U_new = U + t * step[:nu].reshape(m, k)
            V_new = V + t * step[nu:].reshape(k, d)
            R_new = _masked_residual(X, Y, U_new, V_new, M)
            c_new = float(np.sum(R_new * R_new))
            if c_new < cost:
                break
            t *= 0.5
        else:
            break
        U, V, R, cost = U_new, V_new, R_new, c_new
    s = np.linalg.norm(V, axis=1)
    return U * s[None, :], V / s[:, None]


def noisy(X, Y, n_hidden, *, n_sign=20000, n_restarts=5, polish_steps=0, n_jobs=None,
          random_state=None, block_size=256):
    """Approximate recovery under i.i.d. sub-Gaussian output noise (BJW19 Thm 10; Alg. 6).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Standard Gaussian inputs.
    Y : array-like of shape (n_samples, n_outputs)
        Outputs ``relu(X V^T) U^T + E`` with E i.i.d., mean zero; n_outputs >= n_hidden.
    n_hidden : int
    n_sign : int, default=20000
        Samples used by the sign test (Alg. 6, step 1: l = min(n, n_sign)).
    n_restarts : int, default=5
        Jennrich draws; the one whose CP-ALS model fits the projected moment best is used.
    polish_steps : int, default=0
        Alternating least-squares steps on all samples after the paper's estimate (opt-in;
        reaches the statistical optimum, beyond the paper).
    n_jobs, random_state, block_size
        As in :func:`gaussian`.

    Returns
    -------
    RecoveryResult
        Status ``approximate``. ``diagnostics['sign_margins']`` holds the per-row
        confidence of Alg. 6 (a warning is issued when one is not positive).

    Notes
    -----
    1. Tensor estimate of V up to signs (Alg. 4 with the spec's second-order moment; the
       noise is mean zero and independent of X, so the moment is unbiased).
    2. Signs by Algorithm 6 on ``min(n, n_sign)`` samples.
    3. U by least squares on all samples (Lemma 20; the paper uses l samples).
    The error of (U, V) falls like n^(-1/2) (measured in ``bench/``).
    """
    with single_threaded_blas():
        run = Run("bjw19-noisy")
        X, Y, n, d, m, k = check_problem(X, Y, n_hidden)
        n_sign = check_positive_int(n_sign, "n_sign")
        n_restarts = check_positive_int(n_restarts, "n_restarts")
        polish_steps = check_positive_int(polish_steps, "polish_steps", minimum=0)
        threads = resolve_n_jobs(n_jobs)
        rng = check_random_state(random_state)
        if n < 2 * (d + 1):
            raise ValueError(f"bjw19-noisy needs at least 2 (d + 1) = {2 * (d + 1)} samples; got n = {n}")
        seconds, counts, diag = run.seconds, run.counts, run.diag
        counts.update(n_samples=n, n_hidden=k)
        diag["backend"] = BACKEND
        if m < k:
            return run.result(Status.UNSUPPORTED,
                              f"bjw19-noisy needs at least as many outputs as hidden units (U of rank k); "
                              f"got m = {m} < k = {k}")
        ell = min(n, n_sign)
        idx = np.sort(rng.choice(n, size=ell, replace=False)) if ell < n else np.arange(n)
        Xs, Ys = np.ascontiguousarray(X[idx]), np.ascontiguousarray(Y[idx])
        _, sv, Q = output_basis(Ys, k)
        diag["output_singular_values"] = sv

        t = time.perf_counter()
        W, P, _ = moment_span(X, Y, k, None if m == k else Q, threads, block_size)
        best = None
        for _ in range(n_restarts):
            cand, gap, fit = draw_candidates(P, W, rng)
            if best is None or fit < best[2]:
                best = (cand[:k], gap, fit)
        Vhat, gap, fit = best
        diag.update({"tensor_fit": fit, "jennrich_gap": gap})
        seconds["tensor"] = time.perf_counter() - t

        t = time.perf_counter()
        V, margins = sign_by_projection(Xs, Ys, Vhat)
        diag["sign_margins"] = margins
        seconds["signs"] = time.perf_counter() - t

        t = time.perf_counter()
        st = relu_stats(X, Y, V, n_jobs=threads)
        U = np.linalg.lstsq(st["gram"], st["cross"], rcond=None)[0].T
        if polish_steps:
            U, V = polish(X, Y, U, V, n_iter=polish_steps)
        st = relu_stats(X, Y, V, U, n_jobs=threads)
        residual = float(np.sqrt(st["sq_residual"] / st["sq_norm"])) if st["sq_norm"] > 0 else float("nan")
        seconds["fit"] = time.perf_counter() - t
        counts.update({"n_sign": ell, "restarts": n_restarts, "polish_steps": polish_steps})
        message = (f"approximate network (BJW19 Thm 10): relative residual {residual:.3e}, "
                   f"smallest sign margin {margins.min():.3f}")
        if margins.min() <= 0:
            warn(f"a sign of Alg. 6 is a guess (margin {margins.min():.3g} <= 0): use more samples "
                 "(n_sign) or less noise")
        return run.result(Status.APPROXIMATE, message, U=U, V=V, residual=residual, warn_user=False)


def sparse_noise(X, Y, n_hidden, *, lam=None, pcp_tol=1e-9, max_iter=500, support_tol=1e-7,
                 polish_steps=10, tol=1e-10, n_jobs=None, random_state=None):
    """Exact recovery under sparse gross corruption of the outputs (BJW19 Sec. 8, Thm 14).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Standard Gaussian inputs.
    Y : array-like of shape (n_samples, n_outputs)
        ``relu(X V^T) U^T + E`` with E sparse (a random fraction of entries, arbitrary
        values). Theorem 14 assumes U with orthonormal, incoherent columns and k much
        smaller than m.
    n_hidden : int
    lam : float, optional
        PCP weight (default CLMW11's ``1 / sqrt(max(n, m))``).
    pcp_tol, max_iter
        Stopping rule of principal component pursuit.
    support_tol : float, default=1e-7
        Entries with ``|S_ij| > support_tol * max|Y|`` are reported corrupted.
    polish_steps : int, default=10
        Gauss-Newton steps on the uncorrupted entries.
    tol : float, default=1e-10
        Largest relative residual on uncorrupted entries accepted as exact.

    Returns
    -------
    RecoveryResult
        ``diagnostics['corrupted']`` is the boolean (n, m) support of the corruption;
        ``residual`` is measured on the uncorrupted entries.

    Notes
    -----
    1. Principal component pursuit ``Y = L + S`` (:mod:`relufast.robust_pca`).
    2. The Gaussian pipeline (Alg. 4 + 5) on ``(X, L)``; L is accurate only to about
       ``pcp_tol``, so its rows are near-null-vector estimates rather than certified.
    3. Exact polish (beyond the paper, spec Sec. 2.12 step 3): Gauss-Newton on the
       uncorrupted entries only, to machine precision.
    """
    import warnings

    from ..robust_pca import principal_component_pursuit
    from .bjw19 import gaussian

    with single_threaded_blas():
        run = Run("bjw19-sparse-noise")
        X, Y, n, d, m, k = check_problem(X, Y, n_hidden)
        polish_steps = check_positive_int(polish_steps, "polish_steps", minimum=0)
        seconds, counts, diag = run.seconds, run.counts, run.diag
        counts.update(n_samples=n, n_hidden=k)
        stop = run.result

        t = time.perf_counter()
        pcp = principal_component_pursuit(Y, lam=lam, tol=pcp_tol, max_iter=max_iter)
        seconds["pcp"] = time.perf_counter() - t
        corrupted = np.abs(pcp.S) > support_tol * np.abs(Y).max()
        counts.update({"pcp_iterations": pcp.iterations, "corrupted_entries": int(corrupted.sum())})
        diag.update({"corrupted": corrupted, "pcp_rank": pcp.rank, "pcp_residual": pcp.relative_residual})
        if not pcp.converged or pcp.rank != k:
            return stop(Status.FAILED,
                        f"principal component pursuit did not separate a rank-{k} part (rank {pcp.rank}, "
                        f"converged {pcp.converged} after {pcp.iterations} iterations): the corruption "
                        "may be too dense, U too coherent, or k too large for m (BJW19 Thm 14)")

        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            base = gaussian(X, pcp.L, k, n_jobs=n_jobs, random_state=random_state)
        seconds["gaussian"] = time.perf_counter() - t
        diag["gaussian_status"] = base.status.value
        if base.V is None:
            return stop(Status.FAILED, f"the Gaussian pipeline failed on the low-rank part: {base.message}")

        t = time.perf_counter()
        clean = ~corrupted
        U, V = polish(X, Y, base.U, base.V, n_iter=polish_steps, mask=clean)
        R = clean * (Y - np.maximum(X @ V.T, 0.0) @ U.T)
        residual = float(np.linalg.norm(R) / max(np.linalg.norm(clean * Y), 1e-300))
        seconds["polish"] = time.perf_counter() - t
        exact = residual <= tol
        if exact:
            return run.result(Status.EXACT,
                              f"recovered {k} units exactly from outputs with {int(corrupted.sum())} corrupted "
                              f"entries ({corrupted.mean():.1%}); residual on the others {residual:.2e}",
                              U=U, V=V, exact=True, residual=residual)
        return run.result(Status.APPROXIMATE,
                          f"approximate network: residual on uncorrupted entries {residual:.2e} > tol = "
                          f"{tol:.1e} (noise besides the sparse corruption?)", U=U, V=V, residual=residual)
