"""BJW19 Theorem 7: exact recovery for Gaussian inputs (Algorithm 4 + Algorithm 5).

Departures from the paper (``docs/bjw19.md``): the second-order moment with the output
mode kept replaces the third-order score tensor (zero for ReLU); Algorithm 5 runs in its
margin form on an orthonormal basis of the output span.
"""

from __future__ import annotations

import time

import numpy as np

from ..._blas import single_threaded_blas
from ..._native import BACKEND
from ..._result import Run, Status, recovery_method
from ..._validation import check_n_hidden, check_positive_int, check_random_state, resolve_n_jobs
from ...activations import RELU, get_activation, hermite_coefficient
from ...stages.diagnostics import (
    GAUSS_ROWS,
    RANK_TOL,
    bias_evidence,
    input_whitening,
    numerical_rank,
    outputs_below_hidden_message,
    warn_if_not_gaussian,
)
from ...stages.fit import certify, fit_and_certify, fit_from_stats, relative_residual
from ...stages.moments import SecondMomentAccumulator, moment_span
from ...stages.precision import polish_at_precision, refine_tolerances, resolve_precision
from ...stages.reduce import Samples, SampleStream
from ...stages.refine import RowPool, output_basis, refine_rows
from ...stages.tensor import draw_candidates

__all__ = ["gaussian"]

#: sigma_(k+1)/sigma_1 of the outputs (m > k) or the smallest null-space ratio (m = k) above
#: this means noisy outputs: exact outputs leave both at rounding level, about 1e-16.
NOISE_FLOOR = 1e-12


def _deflate_missing(Xs, Ys, V_known, B, Xr, threads):
    """Spec Sec. 2.5 step 9: on samples where every known unit is off, Y is rank one
    (on the in-memory probe sample Xs, Ys)."""
    off = np.all(Xs @ V_known.T <= 0.0, axis=1)
    d = Xs.shape[1]
    if off.sum() < 2 * d:
        return None
    Uy, s, _ = np.linalg.svd(Ys[off], full_matrices=False)
    a = Uy[:, 0] if Uy[:, 0].sum() >= 0 else -Uy[:, 0]
    S = a > 1e-6 * a.max()
    if S.sum() < d:
        return None
    z = np.linalg.lstsq(Xs[off][S], a[S], rcond=None)[0]
    out = refine_rows(B, Xr, z[None, :], n_jobs=threads)
    return out["rows"][0] if out["certified"][0] else None


def start_size(d, k):
    """First size of the adaptive estimation sample: ``max(2000, 10 d k)`` (5,000 at d = 50,
    k = 10, where about 5,000-10,000 samples give estimates within the ~0.3 rad that the
    exact refinement tolerates)."""
    return max(2000, 10 * d * k)


#: Certificate passes over all samples before giving up (each failure doubles the sample).
MAX_CERTIFY_PASSES = 3


#: The adaptive sample is gathered in memory only up to this fraction of n; beyond it the
#: moment is a reduction over all samples instead (no copy of the data).
GATHER_FRACTION = 0.25


def check_n_estimate(n_estimate, n_min):
    """None (adaptive), "all", or an int >= n_min."""
    if n_estimate is None or (isinstance(n_estimate, str) and n_estimate == "all"):
        return n_estimate
    if isinstance(n_estimate, str):
        raise ValueError(f"n_estimate must be None, 'all' or an integer >= {n_min}; got {n_estimate!r}")
    return check_positive_int(n_estimate, "n_estimate", minimum=n_min)


@recovery_method("bjw19-gaussian")
def gaussian(
    X,
    Y,
    n_hidden,
    *,
    n_refine=None,
    n_restarts=10,
    tol=1e-10,
    n_jobs=None,
    random_state=None,
    block_size=256,
    activation="relu",
    whiten="auto",
    n_estimate=None,
    comm=None,
    precision=None,
):
    """Exact recovery of ``Y = relu(X V^T) U^T`` for Gaussian X (BJW19 Thm 7; Alg. 4 + 5).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Inputs, i.i.d. N(0, I_d) for the guarantee. Integer arrays are converted.
    Y : array-like of shape (n_samples, n_outputs) or (n_samples,)
        Outputs; noiseless for an exact result (BJW19's A is ``Y.T``, its X is ``X.T``).
    n_hidden : int
        Number of hidden units k, with k <= n_features and k <= n_outputs.
    n_refine : int, optional
        Samples used by the exact refinement and the fit of U (default
        ``min(n, max(1000, 25 d, 100 k))``).
    n_restarts : int, default=10
        Maximum number of Jennrich draws (each with a CP-ALS polish) whose candidate rows
        are pooled until k distinct rows are certified.
    tol : float, default=1e-10
        Largest relative residual ``||Y - relu(X V^T) U^T||_F / ||Y||_F`` accepted as exact.
    n_jobs : int or None, default=None
        Threads for the C++ kernels (None or -1: all cores).
    random_state : None, int or numpy Generator
        Seeds the choice of refinement samples and the random contractions.
    block_size : int, default=256
        Samples per block in the moment kernel.
    activation : str, float or Activation, default="relu"
        Rectified activation (BJW19 Sec. 9.1): "relu", "relu2", a power p (relu^p),
        "expm1" (exp(t) - 1 on t > 0), or ``relufast.activations.custom(phi, phi_inverse)``.
        The refinement solves with the inverse of phi; for non-homogeneous phi the scale
        of each row is found by a one-dimensional search and the rows keep their norms.
    whiten : {"auto", True, False}, default="auto"
        For x ~ N(0, Sigma) (BJW19 Remark 3): whiten with E[x x^T]^{-1/2}, estimated on all
        samples, in the moment and the refinement, and map the rows back. "auto" whitens
        when the second-moment matrix of X is not the identity within sampling error.
        In adaptive mode the whitener comes from the probe sample (any invertible
        whitener keeps certified rows exact).
    n_estimate : None, int or "all", default=None
        Samples used by the moment estimate (steps 2-4). None: adaptive, starting from
        :func:`start_size` random samples and doubling until k rows are certified (or all
        samples are used); an int forces that size (still escalated when it fails);
        "all": the moment over every sample. The certificate (step 5) always reads every
        sample, so no setting can call a wrong network exact.
    comm : mpi4py communicator, optional
        Each rank passes its own samples; every rank returns the same result, that of
        one process on the concatenated samples (``docs/scale.md``).
    precision : None, str or float, optional
        Precision of the outputs (default: from Y's dtype, e.g. float32). Below float64
        every zero test and the residual tolerance are raised to the rounding floor
        (:mod:`relufast.stages.precision`) and an exact result is polished in float64;
        ``result.precision`` names it.

    X and Y may be NumPy memmaps (read in place) or dask arrays (row blocks).

    Returns
    -------
    RecoveryResult
        ``status`` is ``exact`` when all k rows were certified and the residual is at most
        ``tol``; ``approximate`` when the outputs are noisy (the rows then come from the
        near-null vectors, with errors that shrink with the noise); ``failed``,
        ``rank_deficient`` or ``unsupported`` otherwise, each with a warning.

    Notes
    -----
    Steps, with their place in BJW19:

    1. Rank of Y on the refinement samples (Thm 7 needs rank(U) = k) and an orthonormal
       basis B of its column span; outputs compressed to k columns ``Y Q``.
    2. Moment ``T[i] = mean_s (YQ)[s, i] (x_s x_s^T - I)`` (C++, replaces Alg. 4 step 3).
    3. Span of V from ``sum_i T[i]^2``; projected k x k x k tensor; Jennrich + CP-ALS
       (Alg. 4 step 4, with the decomposition in docs/bjw19.md).
    4. Alg. 5 on every candidate (C++): certified rows are exact.
    5. U by least squares (Thm 1 proof, "Gaussian elimination"), residual over all samples.

    Adaptive estimation (relufast, beyond the paper): steps 2-4 run on a growing prefix of
    a random sample (``counts["n_estimate"]``, ``counts["doublings"]``); only step 5 and
    the finiteness check of the inputs read every sample, in one fused C++ pass
    (``counts["certify_passes"]``). A certificate that fails on all samples doubles the
    estimation and refinement samples and tries again (``counts["escalations"]``). Noisy
    outputs (not certifiable at any size) put the moment over every sample.

    Cost: one pass over the data, O(n (d k + m k)) flops, plus 2 n_e k d^2 for the moment
    on n_e estimation samples (n_e = n with ``n_estimate="all"``).
    """
    prec = resolve_precision(Y, precision)
    with single_threaded_blas():
        return _gaussian(
            X,
            Y,
            n_hidden,
            n_refine=n_refine,
            n_restarts=n_restarts,
            tol=tol,
            n_jobs=n_jobs,
            random_state=random_state,
            block_size=block_size,
            activation=activation,
            whiten=whiten,
            n_estimate=n_estimate,
            comm=comm,
            prec=prec,
        )


def _gaussian(
    X,
    Y,
    n_hidden,
    *,
    n_refine,
    n_restarts,
    tol,
    n_jobs,
    random_state,
    block_size,
    activation,
    whiten,
    n_estimate,
    comm,
    prec,
):
    run = Run("bjw19-gaussian")
    run.precision = prec.name
    threads = resolve_n_jobs(n_jobs)
    n_restarts = check_positive_int(n_restarts, "n_restarts")
    block_size = check_positive_int(block_size, "block_size")
    if not (np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive number; got {tol!r}")
    if whiten not in ("auto", True, False):
        raise ValueError(f"whiten must be 'auto', True or False; got {whiten!r}")
    if not (n_estimate is None or isinstance(n_estimate, str) or np.ndim(n_estimate) == 0):
        raise TypeError(f"n_estimate must be None, 'all' or an integer; got {type(n_estimate).__name__}")
    # Finiteness: checked now when every sample is read anyway by the moment, else by the
    # certificate pass (one read of the data instead of two).
    data = Samples.from_arrays(
        X, Y, comm=comm, n_jobs=threads, check_finite=isinstance(n_estimate, str) and n_estimate == "all"
    )
    n, d, m = data.n, data.d, data.m
    k = check_n_hidden(n_hidden, d)
    n_min = 2 * (d + 1)
    if n < n_min:
        raise ValueError(f"bjw19-gaussian needs at least 2 (d + 1) = {n_min} samples for d = {d}; got n = {n}")
    n_estimate = check_n_estimate(n_estimate, n_min)
    rng = check_random_state(random_state)
    act = get_activation(activation)
    act_out = None if act is RELU else act
    run.seconds["validation"] = time.perf_counter() - run.t_start
    run.counts.update(n_samples=n, n_hidden=k)
    run.diag.update(backend=BACKEND, activation=act.name)
    diag = run.diag

    def early(status, message):
        if not data.finite_checked:  # a status on data that holds NaN would hide the error
            certify(data, np.zeros((1, d)))
        return run.result(status, message, activation=act_out)

    in_memory = not (data.distributed or data.lazy)
    if m < k and act is RELU and whiten is not True and in_memory:
        if not data.finite_checked:
            certify(data, np.zeros((1, d)))
        return _fewer_outputs(run, data.X, data.Y, k, prec.tol(tol, d, k), n_jobs, rng, block_size, threads)
    if m < k:
        return early(
            Status.UNSUPPORTED,
            outputs_below_hidden_message(
                "bjw19-gaussian",
                m,
                k,
                "BJW19 Thm 7 assumes U of rank k, and both the output mode of "
                "the moment and the exact refinement (Alg. 5 works in the span of the outputs) rely on it",
            ),
        )
    if act is not RELU:
        c = np.array([hermite_coefficient(act, r) for r in range(5)])
        diag["hermite_c2"] = float(c[2])
        if abs(c[2]) < 1e-3 * np.abs(c).max():
            return early(
                Status.UNSUPPORTED,
                f"the second Hermite coefficient of {act.name} vanishes "
                f"(c2 = {c[2]:.2e}): the second-order moment carries no information",
            )

    # Step 1: one random sample, gathered once (on every rank): its prefixes are the probe
    # of the diagnostics, the refinement sample and the adaptive estimation sample.
    with run.stage("prepare"):
        ell = (
            min(n, max(1000, 25 * d, 100 * k))
            if n_refine is None
            else min(n, check_positive_int(n_refine, "n_refine", minimum=n_min))
        )
        n_probe = min(n, GAUSS_ROWS)
        adaptive = n_estimate != "all"
        n_est = min(n, max(ell, start_size(d, k) if n_estimate is None else n_estimate)) if adaptive else n
        stream = SampleStream(n, rng)
        Xp, Yp = data.extend(stream, max(ell, n_probe, n_est if adaptive and n_est <= GATHER_FRACTION * n else 0))
        bad = int(Xp.size + Yp.size - np.count_nonzero(np.isfinite(Xp)) - np.count_nonzero(np.isfinite(Yp)))
        if bad:
            raise ValueError(
                f"X and Y must contain only finite values; found {bad} NaN or infinite entries "
                "in a random sample of the rows"
            )
        Xr, Yr = Xp[:ell], Yp[:ell]
        B, sv, Q = output_basis(Yr, k)
        diag["output_singular_values"] = sv
        rank = numerical_rank(sv, prec.tol(RANK_TOL, d, k))
        noise_ratio = float(sv[k] / sv[0]) if (m > k and sv[0] > 0) else 0.0
        diag["noise_ratio"] = noise_ratio
        Wh = input_whitening(Xp[:n_probe] if adaptive else data, whiten, diag, probe=Xp[:n_probe])
        if Wh is False:
            return early(
                Status.NON_IDENTIFIABLE,
                "the second-moment matrix of X is singular: the inputs lie in a "
                "subspace, so V is not identifiable along its complement",
            )
        # Refinement and candidates live in whitened coordinates; rows map back by v = Wh v_w.
        to_x = (lambda R: R) if Wh is None else (lambda R: R @ Wh)
    if rank < k:
        return early(
            Status.RANK_DEFICIENT,
            f"the outputs have numerical rank {rank} < n_hidden = {k} (sigma_k / sigma_1 = "
            f"{sv[k - 1] / sv[0] if sv[0] > 0 else 0.0:.2e} on {len(Xr)} samples); BJW19 Thm 7 needs "
            "U of rank k. Check n_hidden, or use bjw19-fpt for rank-deficient U.",
        )
    warn_if_not_gaussian(diag, "bjw19-gaussian", "N(0, Sigma)" if Wh is not None else "N(0, I)")
    # Noisy outputs cannot be certified at any size: their estimate uses every sample.
    noise_tol, tol_p = prec.tol(NOISE_FLOOR, d, k), prec.tol(tol, d, k)
    if adaptive and noise_ratio > noise_tol:
        adaptive, n_est = False, n
        diag["adaptive_stopped"] = "noisy outputs: the moment uses every sample"

    acc = SecondMomentAccumulator(d, k, n_jobs=threads or None, block_size=block_size, compress=None if m == k else Q)
    n_in_acc = 0
    full_moment = None
    doublings = escalations = certify_passes = restarts = candidates = 0
    gaps = []
    while True:
        # Step 2: the moment tensor on the compressed outputs (a growing random sample,
        # or every sample); step 3: span and projection.
        with run.stage("moments"):
            if adaptive and n_est <= GATHER_FRACTION * n:
                if n_est > len(Xp):
                    Xp, Yp = data.extend(stream, n_est, (Xp, Yp))
                acc.add(Xp[n_in_acc:n_est], Yp[n_in_acc:n_est])
                n_in_acc = n_est
                W, P, evals = moment_span(None, None, k, None, threads, block_size, whitener=Wh, acc=acc)
            else:
                n_est = n
                if full_moment is None:
                    full_moment = moment_span(data, None, k, None if m == k else Q, threads, block_size, whitener=Wh)
                W, P, evals = full_moment
        diag["span_eigenvalue_ratio"] = float(evals[k - 1] / evals[0]) if evals[0] > 0 else 0.0
        # Step 4: candidates pooled over restarts and certified.
        Xref = Xr if Wh is None else np.ascontiguousarray(Xr @ Wh)
        pool, approx_rows, min_null = _certify_candidates(
            run,
            P,
            W,
            B,
            Xref,
            to_x,
            k,
            n_restarts,
            rng,
            threads,
            act,
            whitened=Wh is not None,
            tols=refine_tolerances(prec, d, k),
        )
        restarts += run.counts["restarts"]
        candidates += run.counts["candidates"]
        gaps.extend(run.diag["jennrich_gaps"])
        if len(pool) == k - 1 and k > 1 and noise_ratio < noise_tol and act is RELU and Wh is None:
            with run.stage("refine"):
                row = _deflate_missing(Xp[:n_probe], Yp[:n_probe], np.array(pool.rows), B, Xr, threads)
            if row is not None and pool.add(row, {"deflation": True}):
                diag["deflation_used"] = True
        if not pool.full and adaptive and n_est < n:
            n_est, doublings = min(n, 2 * n_est), doublings + 1
            continue
        if not pool.full and noise_ratio <= noise_tol and ell < n and escalations < MAX_CERTIFY_PASSES:
            # Noiseless but rows missing with the estimate at full size: Alg. 5's null-space
            # test needs more confidently-off samples (e.g. nearly parallel rows), so the
            # refinement sample doubles (the moment estimate is kept).
            escalations += 1
            ell = min(n, 2 * ell)
            Xp, Yp = data.extend(stream, max(ell, len(Xp)), (Xp, Yp))
            Xr, Yr = Xp[:ell], Yp[:ell]
            B = output_basis(Yr, k)[0]
            continue
        # Step 5: the output layer and the certificate over all samples (one fused pass).
        with run.stage("fit"):
            U, V, residual, passes = _fit(data, Xr, Yr, pool, approx_rows, threads, act, diag)
        certify_passes += passes
        if pool.full and not residual <= tol_p and certify_passes < MAX_CERTIFY_PASSES and ell < n:
            # Escalate: rows certified on the refinement sample but not on all samples.
            escalations += 1
            ell = min(n, 2 * ell)
            n_est = min(n, 2 * n_est) if adaptive else n
            Xp, Yp = data.extend(stream, max(ell, len(Xp)), (Xp, Yp))
            Xr, Yr = Xp[:ell], Yp[:ell]
            B = output_basis(Yr, k)[0]
            continue
        break
    run.counts.update(
        candidates=candidates,
        restarts=restarts,
        certified_rows=len(pool),
        n_refine=ell,
        n_estimate=n_est,
        doublings=doublings,
        escalations=escalations,
        certify_passes=certify_passes,
        n_certify=n,
    )
    diag["jennrich_gaps"] = np.array(gaps)
    diag["row_certificates"] = tuple(pool.certificates)
    status, message = _outcome(
        pool, k, residual, tol_p, n, len(Xr), noise_ratio, m, min_null, restarts, noise_tol, prec.tol(NOISE_FLOOR, d, k)
    )
    exact = status == Status.EXACT
    if exact and not prec.is_double and act is RELU and in_memory:
        with run.stage("polish"):
            U, V, _, _, residual = polish_at_precision(data.X, data.Y, U, V, threads=threads)
        message += f" (certified at {prec.name} precision, floor {prec.floor(d, k):.1e}; polished in float64)"
    if not exact and act is RELU:
        message += _bias_note(data.X, data.Y, Wh) if in_memory else _bias_note(Xp[:n_probe], Yp[:n_probe], Wh)
    return run.result(
        status, message, U=U, V=V, exact=exact, residual=residual, activation=act_out, warn_user=not exact
    )


def _bias_note(X, Y, Wh):
    """Say so when the outputs look like a network with an offset or hidden biases (not
    the bias-free model of BJW19); empty otherwise."""
    rows = min(X.shape[0], 200000)
    ev = bias_evidence(X[:rows], Y[:rows], Wh)
    if not ev["biased"]:
        return ""
    return (
        f". The outputs look like those of a network with an output offset or hidden biases "
        f"(mean(y) - tr E[y (x x^T - I)] has |z| = {np.max(np.abs(ev['z'])):.1f}; it is 0 without "
        "biases), which the bias-free model of BJW19 cannot fit: use method='atv21'"
    )


def _certify_candidates(run, P, W, B, Xref, to_x, k, n_restarts, rng, threads, act, whitened, tols=None):
    """Alg. 4 step 4 + Alg. 5: Jennrich/CP-ALS draws whose candidates are certified and
    pooled until k distinct rows are found.

    Returns (pool, approximate rows from the first draw, smallest null-space ratio seen).
    """
    pool, gaps = RowPool(k), []
    approx_rows, min_null, n_candidates, restarts = None, np.inf, 0, 0
    for restarts in range(1, n_restarts + 1):
        with run.stage("tensor"):
            cand, gap, _ = draw_candidates(P, W, rng)
        gaps.append(gap)
        with run.stage("refine"):
            out = refine_rows(B, Xref, cand, n_jobs=threads, activation=act, **(tols or {}))
        rows_x = to_x(out["rows"])
        if act.homogeneous and whitened:
            rows_x = rows_x / np.linalg.norm(rows_x, axis=1, keepdims=True)
        n_candidates += cand.shape[0]
        min_null = min(min_null, float(np.min(out["null_ratio"])))
        if approx_rows is None:
            # Noise-tolerant estimate from the polished draw: near-null-vector rows where
            # solved, else the tensor direction with the better-supported sign.
            approx_rows = to_x(
                np.where(
                    out["solved"][:k, None], out["rows"][:k], np.where(out["sign"][:k, None] < 0, -1.0, 1.0) * cand[:k]
                )
            )
        pool.add_certified(out, rows_x)
        if pool.full:
            break
    run.counts.update(candidates=n_candidates, restarts=restarts)
    run.diag["jennrich_gaps"] = np.array(gaps)
    return pool, approx_rows, min_null


def _fit(data, Xr, Yr, pool, approx_rows, threads, act, diag):
    """Step 5: U by least squares and the residual over all samples (``data``, a
    :class:`relufast.stages.reduce.Samples`); with fewer than k certified rows the
    approximate rows fill in (U then from all samples). Returns (U, V, residual, passes
    over the data)."""
    k = pool.k
    if pool.full:
        V = np.array(pool.rows)
        U, residual, cond = fit_and_certify(data, None, V, subset=(Xr, Yr), threads=threads, activation=act)
        passes = 1
    else:
        fill = [
            r / np.linalg.norm(r) for r in approx_rows if all(abs(r @ c) < 0.9 * np.linalg.norm(r) for c in pool.rows)
        ]
        V = np.array(pool.rows + fill[: k - len(pool)])
        if V.shape[0] < k:  # approximate rows collapsed onto certified ones: keep the draw
            V = approx_rows / np.linalg.norm(approx_rows, axis=1, keepdims=True)
        U, cond = fit_from_stats(certify(data, V, activation=act))
        residual = relative_residual(data, None, V, U, threads, act)
        passes = 2
    diag["fit_condition"] = cond
    order = np.argsort(-np.linalg.norm(U, axis=0), kind="stable")
    return U[:, order], V[order], residual, passes


def _outcome(
    pool, k, residual, tol, n, n_refine, noise_ratio, m, min_null, restarts, noise_tol=NOISE_FLOOR, null_tol=NOISE_FLOOR
):
    """Status and message of the run."""
    if pool.full and residual <= tol:
        return Status.EXACT, (
            f"recovered {k} hidden units exactly: every row certified by Alg. 5, "
            f"relative residual {residual:.2e} over {n} samples"
        )
    if pool.full:
        # Every row is certified, so the network is a sound estimate: the rest is noise or a
        # few bad samples, not a failure of the method.
        return Status.APPROXIMATE if np.isfinite(residual) else Status.FAILED, (
            f"all {k} rows were certified on {n_refine} refinement samples but the residual "
            f"over all {n} samples is {residual:.2e} > tol = {tol:.1e}: the outputs are "
            "not exactly those of one network (noise, or outliers / a few corrupted samples: "
            "bjw19-sparse-noise handles sparse corruption)"
        )
    # With m > k the (k+1)-th singular value of the outputs measures the noise; with
    # m = k only the absence of any exact null vector can tell. Exact outputs leave both at
    # rounding level; anything above the noise floor is noise, however small (1e-9 noise is
    # approximate, not failed).
    if (noise_ratio > noise_tol) if m > k else (min_null > null_tol):
        return Status.APPROXIMATE, (
            f"outputs are not exactly realizable (sigma_(k+1)/sigma_1 = {noise_ratio:.2e}, "
            f"smallest null-space ratio {min_null:.2e}): returning an approximate network with "
            f"relative residual {residual:.2e}; {len(pool)} of {k} rows certified"
        )
    return Status.FAILED, (
        f"only {len(pool)} of {k} rows could be certified after {restarts} restarts: the moment "
        "estimate is too crude. Try more samples, more n_restarts, or check that X is standard "
        "Gaussian and that rows of V are not nearly parallel. Outputs of a network with hidden "
        "biases or an output offset (y = U relu(V x + b) + c) are outside this model: use atv21"
    )


#: |b| and |c| (relative to the outputs) below which the m < k route reports a bias-free net.
BIAS_FREE_TOL = 1e-8


def _fewer_outputs(run, X, Y, k, tol, n_jobs, rng, block_size, threads):
    """m < k, beyond the paper (BJW19 Thm 7 needs rank(U) = k): the rows of V from the
    fourth-order moment in the span of V (the ATV21 estimate, which for b = 0 uses T_4 only),
    made exact by the activation-region refinement; certified bias-free at the end."""
    import warnings

    from ..._result import RelufastWarning
    from ..atv21 import atv21 as atv21_estimate

    with run.stage("atv21"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RelufastWarning)
        res = atv21_estimate(
            X, Y, k, tol=tol, n_jobs=n_jobs, random_state=rng, block_size=block_size, precision=run.precision
        )
    run.diag["m_below_k"] = (
        "m < k: rows of V from the fourth-order moment in the span of V "
        "(ATV21 estimate) and the activation-region refinement"
    )
    run.diag["atv21_status"] = res.status.value
    run.counts["refine_rounds"] = res.counts.get("refine_rounds", 0)
    m = Y.shape[1]
    if res.exact:
        scale = max(float(np.sqrt(np.mean(Y * Y))), 1e-300)
        bias_tol = max(BIAS_FREE_TOL, tol)  # at float32 precision the rounding floor
        if np.max(np.abs(res.b)) <= bias_tol and np.max(np.abs(res.c)) <= bias_tol * scale:
            residual = relative_residual(X, Y, res.V, res.U, threads, RELU)
            if residual <= tol:
                return run.result(
                    Status.EXACT,
                    f"recovered {k} hidden units exactly from m = {m} < k outputs (beyond "
                    "BJW19 Thm 7: fourth-order moment in the span of V, then activation-region "
                    f"refinement); relative residual {residual:.2e} over {X.shape[0]} samples",
                    U=res.U,
                    V=res.V,
                    exact=True,
                    residual=residual,
                )
        return run.result(
            Status.FAILED,
            f"the outputs are exactly those of a network with hidden biases or an output offset "
            f"(max |b| = {np.max(np.abs(res.b)):.2e}, max |c| = {np.max(np.abs(res.c)):.2e}), "
            "not BJW19's bias-free model: use method='atv21'",
            U=res.U,
            V=res.V,
            residual=res.residual,
        )
    return run.result(
        Status.FAILED,
        f"m = {m} < k = {k}: BJW19 Thm 7 needs m >= k; the fourth-order route (ATV21 estimate "
        f"and activation-region refinement) ended {res.status.value}: {res.message}. For "
        "m >= 2 with pairwise independent columns of U, bjw19-fpt (Alg. 7) may work",
        U=res.U,
        V=res.V,
        residual=res.residual,
    )
