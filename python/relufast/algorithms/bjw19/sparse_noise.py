"""BJW19 Section 8, Theorem 14: sparse gross corruption of the outputs.

Principal component pursuit separates the low-rank outputs from the sparse corruption,
the Gaussian pipeline runs on the low-rank part, and a Gauss-Newton polish on the
uncorrupted entries only makes the result exact.
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from ..._blas import single_threaded_blas
from ..._result import Run, Status
from ..._validation import check_positive_int, check_problem, check_random_state, resolve_n_jobs
from ...stages.fit import polish
from ...stages.robust_pca import principal_component_pursuit
from .gaussian import gaussian

__all__ = ["sparse_noise"]


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
    3. Exact polish (beyond the paper): Gauss-Newton on the
       uncorrupted entries only, to machine precision.
    """
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
