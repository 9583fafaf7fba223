"""BJW19 Algorithm 3 (Theorem 4): orthonormal V via ICA of the sketched outputs."""

from __future__ import annotations

import numpy as np

from ..._blas import single_threaded_blas
from ..._deadline import check as check_deadline
from ..._protocol import recovery_method
from ..._result import Run, Status
from ..._validation import (
    InsufficientSamples,
    check_n_hidden,
    check_positive_int,
    check_random_state,
    resolve_n_jobs,
)
from ...stages.diagnostics import outputs_below_hidden_message, rank_shortfall
from ...stages.fit import check_finite_once, fit_and_certify
from ...stages.precision import polish_at_precision, refine_tolerances, resolve_precision
from ...stages.reduce import GrowingSample, Samples, check_n_estimate, start_size
from ...stages.refine import RowPool, output_basis, refine_rows

__all__ = ["fastica", "ica"]


def fastica(Z, rng, *, contrast="skew", tol=1e-12, max_iter=1000, rank_tol=1e-12):
    """Symmetric FastICA (Hyvarinen 1999), written for BJW19 Alg. 3.

    Parameters
    ----------
    Z : ndarray of shape (n, k)
        Mixed signals, samples as rows.
    contrast : {"skew", "logcosh"}, default="skew"
        "skew" uses G(u) = u^3 / 3 (g(u) = u^2): rectified-Gaussian sources have skewness
        1.64, and on 60 random mixtures of 3-5 such sources (n = 2e4) it separated all of
        them in at most 7 iterations, while "logcosh" (the usual default) stalled at a
        saddle point on 20 of the 60 (``bench/test_bench_ica_blas.py``).
    rank_tol : float, default=1e-12
        Covariance eigenvalues of Z below ``rank_tol`` times the largest mean rank < k
        (LinAlgError).

    Returns
    -------
    unmix : ndarray of shape (k, k)
        ``Z @ unmix`` are the estimated sources (up to order and scale; no centring is
        applied to Z, so a noiseless linear mixture is undone exactly).
    iterations : int
    converged : bool
    """
    if contrast not in ("skew", "logcosh"):
        raise ValueError(f"contrast must be 'skew' or 'logcosh'; got {contrast!r}")
    n, k = Z.shape
    Zc = Z - Z.mean(axis=0)
    evals, E = np.linalg.eigh(Zc.T @ Zc / n)
    if evals.min() <= rank_tol * evals.max():
        raise np.linalg.LinAlgError("the sketched outputs are rank-deficient")
    K = E / np.sqrt(evals)  # whitening: Zc @ K has identity covariance
    Xw = Zc @ K
    W = np.linalg.qr(rng.standard_normal((k, k)))[0]
    converged = False
    for it in range(1, max_iter + 1):
        check_deadline("in a FastICA iteration")
        Uw = Xw @ W.T
        if contrast == "skew":
            W_new = (Uw * Uw).T @ Xw / n - np.diag(2.0 * np.mean(Uw, axis=0)) @ W
        else:
            G = np.tanh(Uw)
            W_new = G.T @ Xw / n - np.diag(np.mean(1.0 - G * G, axis=0)) @ W
        s, Uo = np.linalg.eigh(W_new @ W_new.T)
        W_new = Uo @ np.diag(1.0 / np.sqrt(s)) @ Uo.T @ W_new  # symmetric decorrelation
        lim = np.max(np.abs(np.abs(np.sum(W_new * W, axis=1)) - 1.0))
        W = W_new
        if lim < tol:
            converged = True
            break
    return K @ W.T, it, converged


@recovery_method("bjw19-ica")
def ica(
    X,
    Y,
    n_hidden,
    *,
    n_refine=None,
    n_restarts=5,
    tol=1e-10,
    ica_tol=1e-12,
    max_iter=1000,
    n_jobs=None,
    random_state=None,
    n_estimate=None,
    comm=None,
    precision=None,
):
    """Exact recovery for orthonormal V by ICA (BJW19 Theorem 4, Algorithm 3).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Inputs i.i.d. N(0, I) (identity covariance is required: V Sigma^(1/2) would not be
        orthonormal).
    Y : array-like of shape (n_samples, n_outputs)
        Noiseless outputs, n_outputs >= n_hidden, U of rank k.
    n_hidden : int
    n_refine : int, optional
        Samples for the exact refinement (as in :func:`gaussian`).
    n_restarts : int, default=5
        Fresh sketches and FastICA starts whose certified rows are pooled until k.
    tol : float, default=1e-10
        Largest relative residual accepted as exact.
    ica_tol, max_iter
        FastICA convergence (relufast's own implementation, :func:`fastica`).
    n_estimate : None, int or "all", default=None
        Samples seen by FastICA (steps 1-3): None starts from ``max(2000, 10 d k)`` random
        samples and doubles until k rows are certified; "all" uses every sample (gathered
        in memory). The certificate always reads every sample in one pass.
    comm : mpi4py communicator, optional
        Each rank passes its own samples; every rank returns the same result.
    precision : None, str or float, optional
        Precision of the outputs (default: from Y's dtype, e.g. float32). Below float64 the
        rank test of the sketch, Alg. 5's zero tests and ``tol`` are raised to the rounding
        floor (:mod:`relufast.stages.precision`), as in :func:`gaussian`; an exact result is
        polished in float64 and ``result.precision`` names the precision.

    Returns
    -------
    RecoveryResult

    Notes
    -----
    1. Sketch ``T`` (k x m) Gaussian (Lemma 6): ``(T Y^T)`` is a noise-free mixture
       ``(T U) relu(V X)`` of k independent rectified-Gaussian sources (V orthonormal).
    2. FastICA (symmetric, skewness contrast) instead of the AGMS12 black box; the sign
       of each source is fixed by its skewness (+1.64 for a rectified Gaussian).
    3. Each source gives an approximate row: least squares of the source on its
       confidently positive samples.
    4. Algorithm 5 (margin form, C++) certifies the rows exactly; U by least squares.
    FastICA is written here rather than taken from scikit-learn: the instance is tiny
    (k x k unmixing), noise-free, and needs no optional dependency.
    """
    prec = resolve_precision(Y, precision)
    with single_threaded_blas():
        return _ica(
            X, Y, n_hidden, n_refine, n_restarts, tol, ica_tol, max_iter, n_jobs, random_state, n_estimate, comm, prec
        )


def _ica(X, Y, n_hidden, n_refine, n_restarts, tol, ica_tol, max_iter, n_jobs, random_state, n_estimate, comm, prec):
    """The body of :func:`ica`: validation, then Alg. 3 steps 1-4 on a growing sample
    (:func:`_search`) and the certificate (:func:`_certify`)."""
    run = Run("bjw19-ica")
    run.precision = prec.name
    threads = resolve_n_jobs(n_jobs)
    data = Samples.from_arrays(
        X, Y, comm=comm, n_jobs=threads, check_finite=isinstance(n_estimate, str) and n_estimate == "all"
    )
    n, d, m = data.n, data.d, data.m
    k = check_n_hidden(n_hidden, d)
    max_iter = check_positive_int(max_iter, "max_iter")
    n_restarts = check_positive_int(n_restarts, "n_restarts")
    rng = check_random_state(random_state)
    if n < 2 * (d + 1):
        raise InsufficientSamples(f"bjw19-ica needs at least 2 (d + 1) = {2 * (d + 1)} samples; got n = {n}")
    n_estimate = check_n_estimate(n_estimate, 2 * (d + 1))
    run.counts.update(n_samples=n, n_hidden=k)
    if m < k:
        check_finite_once(data)
        return run.result(
            Status.UNSUPPORTED, outputs_below_hidden_message("bjw19-ica", m, k, "Thm 4 assumes U of rank k")
        )
    ell = min(n, max(1000, 25 * d, 100 * k)) if n_refine is None else min(n, check_positive_int(n_refine, "n_refine"))
    n_est = n if n_estimate == "all" else min(n, max(ell, n_estimate or start_size(d, k, per_unit=10, minimum=2000)))
    opts = dict(n_restarts=n_restarts, ica_tol=ica_tol, max_iter=max_iter, threads=threads, prec=prec)
    try:
        pool, approx, Xr, Yr = _search(run, data, k, ell, n_est, rng, **opts)
    except np.linalg.LinAlgError as exc:  # the sketch has rank < k: rank(Y) < k only if every sample says so
        check_finite_once(data)
        rows, ratio = getattr(exc, "sample", (n_est, None))
        status, why = rank_shortfall("bjw19-ica", data, k, prec, rows=rows, sample_ratio=ratio)
        return run.result(status, why + " (BJW19 Thm 4, the sketched outputs have rank < k).")
    return _certify(run, data, pool, approx, Xr, Yr, prec.tol(tol, d, k), prec, threads)


def _unmix(Xe, Ye, k, rng, ica_tol, max_iter, rank_tol):
    """Alg. 3 steps 1-3: a Gaussian sketch ``T`` (k x m) of the outputs (Lemma 6), FastICA,
    the sign of each source from its skewness, and an approximate row per source by least
    squares on its confidently positive samples. Returns (rows (k, d), FastICA iterations)."""
    T = rng.standard_normal((k, Ye.shape[1]))
    Zs = Ye @ T.T
    unmix, iters, _ = fastica(Zs, rng, tol=ica_tol, max_iter=max_iter, rank_tol=rank_tol)
    S = Zs @ unmix
    Sc = S - S.mean(axis=0)
    skew = np.mean(Sc**3, axis=0) / np.mean(Sc**2, axis=0) ** 1.5
    S *= np.where(skew < 0, -1.0, 1.0)
    cand = np.empty((k, Xe.shape[1]))
    for i in range(k):
        pos = S[:, i] > 0.2 * S[:, i].max()
        cand[i] = np.linalg.lstsq(Xe[pos], S[pos, i], rcond=None)[0]
    return cand, iters


def _search(run, data, k, ell, n_est, rng, *, n_restarts, ica_tol, max_iter, threads, prec):
    """Steps 1-4 on a growing random sample (relufast: it doubles until k rows are certified
    or every sample is used): per restart a fresh sketch and FastICA start, Alg. 5 on the
    candidates, certified rows pooled. Returns (pool, approximate rows, X_r, Y_r); raises
    LinAlgError when the sketched outputs have rank < k."""
    n, d = data.n, data.d
    sample = GrowingSample(data, n_est, rng, where="in the estimation sample")
    Xe, Ye = sample.rows()
    Xr, Yr = Xe[:ell], Ye[:ell]
    B, _, _ = output_basis(Yr, k)
    pool, approx, iters_all = RowPool(k), None, []
    restart = 0
    rank_tol = max(1e-12, prec.floor(d, k) ** 2)  # covariance eigenvalues: squared amplitudes
    while True:
        for restart in range(n_restarts):
            check_deadline("in a bjw19-ica restart")
            with run.stage("ica"):
                try:
                    cand, iters = _unmix(Xe, Ye, k, rng, ica_tol, max_iter, rank_tol)
                except np.linalg.LinAlgError as exc:  # the sample's sigma_k / sigma_1 says why
                    sv = np.linalg.svd(Ye, compute_uv=False)
                    exc.sample = (len(Ye), float(sv[k - 1] / sv[0]) if len(sv) >= k and sv[0] > 0 else 0.0)
                    raise
                iters_all.append(iters)
            with run.stage("refine"):  # Step 4: Algorithm 5 certifies.
                out = refine_rows(B, Xr, cand, n_jobs=threads, **refine_tolerances(prec, d, k))
            if approx is None:
                approx = np.where(
                    out["solved"][:, None], out["rows"], cand / np.linalg.norm(cand, axis=1, keepdims=True)
                )
            pool.add_certified(out)
            if pool.full:
                break
        if pool.full or len(Xe) >= n:
            break
        sample.double()
        Xe, Ye = sample.rows()  # the new rows checked finite before any LAPACK call
    run.counts.update(n_estimate=len(Xe), doublings=sample.doublings, n_refine=ell, n_certify=n, certify_passes=1)
    run.diag.update({"ica_iterations": tuple(iters_all), "restarts": restart + 1})
    run.counts["certified_rows"] = len(pool)
    return pool, approx, Xr, Yr


def _certify(run, data, pool, approx, Xr, Yr, tol, prec, threads):
    """U by least squares and the residual over all samples (one pass): ``exact`` when all k
    rows are certified and the residual is at most ``tol`` (already at the outputs'
    precision); an exact result below float64 is polished in float64."""
    k = pool.k
    certified = pool.rows
    rows = np.array(certified) if len(certified) == k else approx
    with run.stage("fit"):
        U, residual, _ = fit_and_certify(data, None, rows, subset=(Xr, Yr), threads=threads)
    if len(certified) == k and residual <= tol:
        message = f"recovered {k} units exactly via ICA (Alg. 3); residual {residual:.2e}"
        if not prec.is_double and not (data.distributed or data.lazy):
            with run.stage("polish"):
                U, rows, _, _, residual = polish_at_precision(data.X, data.Y, U, rows, threads=threads)
            message += f" (certified at {prec.name} precision, floor {prec.floor(data.d, k):.1e}; polished in float64)"
        return run.result(Status.EXACT, message, U=U, V=rows, exact=True, residual=residual)
    return run.result(
        Status.FAILED,
        f"{len(certified)} of {k} rows certified after {run.diag['restarts']} ICA restarts; "
        "Alg. 3 needs orthonormal V, standard Gaussian X and noiseless outputs: try "
        "bjw19-gaussian for general V",
        U=U,
        V=rows,
        residual=residual,
    )
