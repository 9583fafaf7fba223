"""BJW19 Section 8, Theorem 14: sparse gross corruption of the outputs.

Principal component pursuit separates the low-rank outputs from the sparse corruption,
the Gaussian pipeline runs on the low-rank part, and a Gauss-Newton polish on the
uncorrupted entries only makes the result exact.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..._blas import single_threaded_blas
from ..._protocol import recovery_method
from ..._result import Run, Status
from ..._validation import InsufficientSamples, check_positive_int, check_problem
from ...stages.diagnostics import numerical_rank
from ...stages.fit import local_rank_deficiency, max_abs, polish, scaled_norm
from ...stages.robust_pca import principal_component_pursuit
from .gaussian import gaussian

__all__ = ["sparse_noise"]

#: Rounds of (polish on the unflagged entries, flag what the network does not fit).
SUPPORT_ROUNDS = 4


@recovery_method("bjw19-sparse-noise")
def sparse_noise(
    X,
    Y,
    n_hidden,
    *,
    lam=None,
    pcp_tol=1e-9,
    max_iter=500,
    support_tol=1e-7,
    polish_steps=10,
    tol=1e-10,
    n_jobs=None,
    random_state=None,
):
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
    0. Zero corruption first: the Gaussian pipeline on Y itself; an exact fit of every
       entry is returned with no corrupted entries (clean data are a special case).
    1. Principal component pursuit ``Y = L + S`` (:mod:`relufast.robust_pca`).
    2. The Gaussian pipeline (Alg. 4 + 5) on ``(X, L)``; L is accurate only to about
       ``pcp_tol``, so its rows are near-null-vector estimates rather than certified.
    3. Exact polish (beyond the paper): Gauss-Newton on the
       uncorrupted entries only, to machine precision; the corrupted support is then the
       set of entries the polished network does not fit (a few rounds until it settles).
    4. Certificate: exact only when the unflagged entries determine the network (every
       output's unflagged samples have k independent activations, and the masked
       Gauss-Newton matrix has rank m k + k d - k); otherwise ``failed`` with the reason.
    """
    opts = (lam, pcp_tol, max_iter, support_tol, polish_steps, tol, n_jobs, random_state)
    with single_threaded_blas():
        return _sparse_noise(X, Y, n_hidden, *opts)


def _sparse_noise(X, Y, n_hidden, lam, pcp_tol, max_iter, support_tol, polish_steps, tol, n_jobs, random_state):
    """The body of :func:`sparse_noise`: step 0 (:func:`_zero_corruption`), 1 (PCP), 2 (the
    Gaussian pipeline on the low-rank part), 3 (:func:`_polish_on_support`) and 4
    (:func:`_certify_support`)."""
    run = Run("bjw19-sparse-noise")
    X, Y, n, d, m, k = check_problem(X, Y, n_hidden)
    polish_steps = check_positive_int(polish_steps, "polish_steps", minimum=0)
    if n < 2 * (d + 1):  # checked here: the error must name the method the caller chose
        raise InsufficientSamples(
            f"bjw19-sparse-noise needs at least 2 (d + 1) = {2 * (d + 1)} samples for d = {d} "
            f"(its Gaussian pipeline, BJW19 Thm 7, estimates a d x d moment); got n = {n}"
        )
    run.counts.update(n_samples=n, n_hidden=k)
    direct = _zero_corruption(run, X, Y, k, tol, n_jobs, random_state)
    if direct is not None:
        return direct
    with run.stage("pcp"):
        pcp = principal_component_pursuit(Y, lam=lam, tol=pcp_tol, max_iter=max_iter)
    scale = max_abs(Y)
    corrupted = np.abs(pcp.S) > support_tol * scale
    run.counts.update({"pcp_iterations": pcp.iterations})
    run.diag.update({"pcp_rank": pcp.rank, "pcp_residual": pcp.relative_residual})
    if not pcp.converged or pcp.rank != k:
        run.diag["corrupted"] = corrupted
        run.counts["corrupted_entries"] = int(corrupted.sum())
        return run.result(
            Status.FAILED,
            f"principal component pursuit did not separate a rank-{k} part (rank {pcp.rank}, "
            f"converged {pcp.converged} after {pcp.iterations} iterations): the corruption "
            "may be too dense, U too coherent, or k too large for m (BJW19 Thm 14)",
        )
    with run.stage("gaussian"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            base = gaussian(X, pcp.L, k, n_jobs=n_jobs, random_state=random_state)
    run.diag["gaussian_status"] = base.status.value
    if base.V is None:
        run.diag["corrupted"] = corrupted
        return run.result(Status.FAILED, f"the Gaussian pipeline failed on the low-rank part: {base.message}")
    with run.stage("polish"):
        U, V, corrupted, residual = _polish_on_support(
            run, X, Y, base.U, base.V, corrupted, polish_steps, support_tol * scale
        )
    return _certify_support(run, X, U, V, corrupted, residual, tol)


def _zero_corruption(run, X, Y, k, tol, n_jobs, random_state):
    """Step 0: clean outputs are the zero-corruption case. When the Gaussian pipeline (Thm 7,
    Alg. 4 + 5) certifies the outputs as they are (residual over every entry), nothing is
    corrupted and its result is returned; else None."""
    with run.stage("zero_corruption"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            direct = gaussian(X, Y, k, tol=tol, n_jobs=n_jobs, random_state=random_state)
    run.diag["zero_corruption_status"] = direct.status.value
    if direct.status != Status.EXACT:
        return None
    run.diag["corrupted"] = np.zeros(Y.shape, dtype=bool)
    run.counts["corrupted_entries"] = 0
    return run.result(
        Status.EXACT,
        f"no corrupted entries: the Gaussian pipeline fits every entry of the "
        f"outputs exactly (relative residual {direct.residual:.2e})",
        U=direct.U,
        V=direct.V,
        exact=True,
        residual=direct.residual,
    )


def _polish_on_support(run, X, Y, U, V, corrupted, polish_steps, threshold):
    """Step 3 (beyond BJW19 Sec. 8): Gauss-Newton on the entries PCP left unflagged (this
    makes V exact), U refitted column by column in L1 (a sparse corruption does not move an
    L1 fit), the entries that network does not fit (above ``threshold``) flagged, and the
    polish repeated on the rest until the flags settle (at most :data:`SUPPORT_ROUNDS`).
    Returns (U, V, corrupted support, residual on the unflagged entries)."""
    U, V = polish(X, Y, U, V, n_iter=polish_steps, mask=~corrupted)
    U = _l1_output_layer(np.maximum(X @ V.T, 0.0), Y, U)
    corrupted = np.abs(Y - np.maximum(X @ V.T, 0.0) @ U.T) > threshold
    for rounds in range(1, SUPPORT_ROUNDS + 1):
        U, V = polish(X, Y, U, V, n_iter=polish_steps, mask=~corrupted)
        R = Y - np.maximum(X @ V.T, 0.0) @ U.T
        flagged = np.abs(R) > threshold
        if np.array_equal(flagged, corrupted):
            break
        corrupted = flagged
    run.counts.update(corrupted_entries=int(corrupted.sum()), support_rounds=rounds)
    run.diag["corrupted"] = corrupted
    return U, V, corrupted, _masked_relative_residual(R, Y, ~corrupted)


def _certify_support(run, X, U, V, corrupted, residual, tol):
    """Step 4: exact only when the unflagged entries determine the network: every output's
    unflagged samples see k independent hidden activations (U given V), and the masked fit
    has no flat direction besides the k rescalings (U and V jointly, to first order)."""
    clean = ~corrupted
    m, k = U.shape
    with run.stage("identifiability"):
        F = np.maximum(X @ V.T, 0.0)
        weak = [j for j in range(m) if numerical_rank(np.linalg.svd(F[clean[:, j]], compute_uv=False)) < k]
        flat = local_rank_deficiency(X, U, V, clean.astype(np.float64)) if not weak else -1
    run.diag.update(undetermined_outputs=tuple(weak), flat_directions=flat)
    fits = bool(residual <= tol)
    if fits and not weak and flat == 0:
        return run.result(
            Status.EXACT,
            f"recovered {k} units exactly from outputs with {int(corrupted.sum())} corrupted "
            f"entries ({corrupted.mean():.1%}); residual on the others {residual:.2e}, and "
            "the others determine the network",
            U=U,
            V=V,
            exact=True,
            residual=residual,
        )
    if fits:
        why = (
            f"the unflagged samples of output(s) {list(weak)[:10]} do not see {k} independent hidden units"
            if weak
            else f"the masked fit has {flat} flat direction(s) besides the rescalings"
        )
        return run.result(
            Status.FAILED,
            f"a network fits the {int(clean.sum())} unflagged entries (residual {residual:.2e}) "
            f"but {int(corrupted.sum())} entries ({corrupted.mean():.1%}) are flagged and {why}: "
            "the unflagged entries do not determine the network, so it is not certified",
            U=U,
            V=V,
            residual=residual,
        )
    return run.result(
        Status.APPROXIMATE,
        f"approximate network: residual on uncorrupted entries {residual:.2e} > tol = "
        f"{tol:.1e} (noise besides the sparse corruption?)",
        U=U,
        V=V,
        residual=residual,
    )


def _masked_relative_residual(R, Y, mask):
    """``||M o R||_F / ||M o Y||_F`` with scaled norms (NaN when the masked outputs are zero)."""
    den = scaled_norm(np.where(mask, Y, 0.0))
    if not (np.isfinite(den) and den > 0):
        return float("nan")
    return float(scaled_norm(np.where(mask, R, 0.0)) / den)


#: Iteratively reweighted least-squares steps of the L1 fit of the output layer.
L1_STEPS = 50


def _l1_output_layer(F, Y, U0):
    """``U[j] = argmin_u ||Y[:, j] - F u||_1`` per output, by iteratively reweighted least
    squares from U0 (beyond the paper). With V right, a sparse corruption of a column does
    not move its L1 fit, so the entries it leaves unexplained are the corrupted ones."""
    U = np.array(U0, dtype=np.float64)
    scale = max(max_abs(Y), 1e-300)
    for j in range(Y.shape[1]):
        u = U[j]
        for _ in range(L1_STEPS):
            r = np.abs(Y[:, j] - F @ u)
            w = 1.0 / np.maximum(r, 1e-12 * scale)
            Fw = F * w[:, None]
            u_new = np.linalg.lstsq(Fw.T @ F, Fw.T @ Y[:, j], rcond=None)[0]
            if np.allclose(u_new, u, rtol=1e-15, atol=0.0):
                u = u_new
                break
            u = u_new
        U[j] = u
    return U
