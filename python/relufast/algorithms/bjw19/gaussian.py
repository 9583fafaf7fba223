"""BJW19 Theorem 7: exact recovery for Gaussian inputs (Algorithm 4 + Algorithm 5).

Departures from the paper (``docs/bjw19.md``): the second-order moment with the output
mode kept replaces the third-order score tensor (zero for ReLU); Algorithm 5 runs in its
margin form on an orthonormal basis of the output span.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..._blas import single_threaded_blas
from ..._deadline import check as check_deadline
from ..._native import BACKEND
from ..._protocol import recovery_method
from ..._result import Run, Status
from ..._validation import (
    InsufficientSamples,
    check_n_hidden,
    check_positive_int,
    check_random_state,
    resolve_n_jobs,
)
from ...activations import RELU, get_activation
from ...stages.candidates import certify_candidates
from ...stages.diagnostics import (
    GAUSS_ROWS,
    RANK_TOL,
    bias_evidence,
    input_whitening,
    numerical_rank,
    outputs_below_hidden_message,
    rank_shortfall,
    warn_if_not_gaussian,
)
from ...stages.fit import certify, check_finite_once, fit_and_certify, fit_from_stats, relative_residual
from ...stages.hermite import activation_coefficient
from ...stages.moments import SecondMomentAccumulator, moment_span, use_mean_span
from ...stages.pool import RowPool
from ...stages.precision import polish_at_precision, refine_tolerances, resolve_precision
from ...stages.reduce import GATHER_FRACTION, GrowingSample, Samples, check_n_estimate
from ...stages.refine import output_basis, refine_rows

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
    """First size of the adaptive estimation sample.

    ``max(2000, 10 d k)``, except at the sizes where the moment is taken in the span from
    the first moment (:func:`relufast.stages.moments.use_mean_span`, with the outputs'
    constant and linear part as control variates): there
    ``max(2000, min(10 d k, 2 k^2 + 20 d))``. The sampling error of the projected moment
    relative to its signal grows like k / sqrt(n_e), CP-ALS with the completion rounds of
    :func:`relufast.stages.candidates.certify_candidates` finds every unit up to about 0.25 of it, which 2 k^2
    samples reach (measured: exact from 5,000 samples at d = 100, k = 50 and from 20,000
    at d = 200, k = 100); the span needs a multiple of d."""
    if use_mean_span(d, k, k):
        return max(2000, min(10 * d * k, 2 * k * k + 20 * d))
    return max(2000, 10 * d * k)


#: Certificate passes over all samples before giving up (each failure doubles the sample).
MAX_CERTIFY_PASSES = 3


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

    This entry point is long only by its documentation: the body is :func:`_gaussian` with
    one function per step (:func:`_prepare`, :func:`_moment`, :func:`_candidates`,
    :func:`_fit`, :func:`_finish`).
    """
    prec = resolve_precision(Y, precision)
    with single_threaded_blas():
        run = Run("bjw19-gaussian")
        run.precision = prec.name
        s = _validate(
            run,
            X,
            Y,
            n_hidden,
            n_restarts=n_restarts,
            tol=tol,
            n_jobs=n_jobs,
            random_state=random_state,
            block_size=block_size,
            activation=activation,
            whiten=whiten,
            n_estimate=n_estimate,
            comm=comm,
        )
        return _gaussian(run, s, n_refine, whiten, tol, n_jobs, prec)


class _Setup(NamedTuple):
    """Validated inputs of one :func:`gaussian` run."""

    data: Samples
    n: int
    d: int
    m: int
    k: int
    threads: int
    n_restarts: int
    block_size: int
    n_estimate: object
    rng: np.random.Generator
    act: object
    act_out: object


def _validate(
    run, X, Y, n_hidden, *, n_restarts, tol, n_jobs, random_state, block_size, activation, whiten, n_estimate, comm
):
    """Check the options of :func:`gaussian` and wrap the samples (finiteness is checked by
    the moment when it reads every sample, else by the certificate pass: one read of the
    data instead of two)."""
    threads = resolve_n_jobs(n_jobs)
    n_restarts = check_positive_int(n_restarts, "n_restarts")
    block_size = check_positive_int(block_size, "block_size")
    if not (np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive number; got {tol!r}")
    if whiten not in ("auto", True, False):
        raise ValueError(f"whiten must be 'auto', True or False; got {whiten!r}")
    if not (n_estimate is None or isinstance(n_estimate, str) or np.ndim(n_estimate) == 0):
        raise TypeError(f"n_estimate must be None, 'all' or an integer; got {type(n_estimate).__name__}")
    data = Samples.from_arrays(
        X, Y, comm=comm, n_jobs=threads, check_finite=isinstance(n_estimate, str) and n_estimate == "all"
    )
    n, d, m = data.n, data.d, data.m
    k = check_n_hidden(n_hidden, d)
    n_min = 2 * (d + 1)
    if n < n_min:
        raise InsufficientSamples(f"bjw19-gaussian needs at least 2 (d + 1) = {n_min} samples for d = {d}; got n = {n}")
    n_estimate = check_n_estimate(n_estimate, n_min)
    rng = check_random_state(random_state)
    act = get_activation(activation)
    run.seconds["validation"] = time.perf_counter() - run.t_start
    run.counts.update(n_samples=n, n_hidden=k)
    run.diag.update(backend=BACKEND, activation=act.name)
    return _Setup(data, n, d, m, k, threads, n_restarts, block_size, n_estimate, rng, act, None if act is RELU else act)


def _early(run, s, status, message):
    """A result before any estimate (a status on data holding NaN would hide the error, so
    the finiteness check runs first when it has not yet)."""
    check_finite_once(s.data)
    return run.result(status, message, activation=s.act_out)


def _gaussian(run, s, n_refine, whiten, tol, n_jobs, prec):
    """The body of :func:`gaussian` (BJW19 Thm 7) after validation: the shapes outside
    Alg. 4 + 5, step 1, steps 2-5 with adaptive escalation, and the outcome."""
    data, d, m, k = s.data, s.d, s.m, s.k
    in_memory = not (data.distributed or data.lazy)
    if m < k:
        return _early(
            run,
            s,
            Status.UNSUPPORTED,
            outputs_below_hidden_message(
                "bjw19-gaussian",
                m,
                k,
                "BJW19 Thm 7 assumes U of rank k, and both the output mode of "
                "the moment and the exact refinement (Alg. 5 works in the span of the outputs) rely on it",
            ),
        )
    if s.act is not RELU:
        c = np.array([activation_coefficient(r, s.act) for r in range(5)])
        run.diag["hermite_c2"] = float(c[2])
        if abs(c[2]) < 1e-3 * np.abs(c).max():
            return _early(
                run,
                s,
                Status.UNSUPPORTED,
                f"the second Hermite coefficient of {s.act.name} vanishes "
                f"(c2 = {c[2]:.2e}): the second-order moment carries no information",
            )
    p = _prepare(run, s, n_refine, whiten, prec)
    if not isinstance(p, _Probe):
        return p
    found = _estimate(run, s, p, prec.tol(tol, d, k), prec)
    return _finish(run, s, p, found, prec.tol(tol, d, k), prec, in_memory)


@dataclass
class _Probe:
    """The one random sample of a run (step 1), gathered once on every rank: its prefixes
    are the probe of the diagnostics (``n_probe``), the refinement sample (``ell``: Xr, Yr
    and their output basis B) and the adaptive estimation sample (``n_est``)."""

    sample: GrowingSample  #: its size is the estimation size n_est
    ell: int
    n_probe: int
    adaptive: bool
    noise_ratio: float = 0.0
    Wh: object = None
    B: np.ndarray | None = None
    Q: np.ndarray | None = None  #: the compression of the outputs to k columns (from step 1, kept)

    @property
    def Xp(self):
        return self.sample.X

    @property
    def Yp(self):
        return self.sample.Y

    @property
    def n_est(self):
        return self.sample.size

    @n_est.setter
    def n_est(self, size):
        self.sample.size = int(size)

    @property
    def Xr(self):
        return self.Xp[: self.ell]

    @property
    def Yr(self):
        return self.Yp[: self.ell]

    def to_x(self, R):
        """Rows in whitened coordinates mapped back to those of X (v = Wh v_w)."""
        return R if self.Wh is None else R @ self.Wh

    def grow_refinement(self, data, k):
        """Double the refinement sample (drawing more rows if needed) and rebuild B."""
        self.ell = min(data.n, 2 * self.ell)
        self.sample.rows(self.ell)
        self.B = output_basis(self.Yr, k)[0]


def _prepare(run, s, n_refine, whiten, prec):
    """Step 1 (BJW19 Thm 7 needs rank(U) = k): the random sample, the numerical rank of the
    outputs on the refinement samples with an orthonormal basis B of their span, the noise
    ratio sigma_(k+1)/sigma_1 and the whitener (Remark 3). Returns a :class:`_Probe`, or
    the result when the data stop the run (inputs in a subspace, rank(Y) < k)."""
    data, n, d, m, k, diag = s.data, s.n, s.d, s.m, s.k, run.diag
    with run.stage("prepare"):
        n_min = 2 * (d + 1)
        ell = (
            min(n, max(1000, 25 * d, 100 * k))
            if n_refine is None
            else min(n, check_positive_int(n_refine, "n_refine", minimum=n_min))
        )
        n_probe = min(n, GAUSS_ROWS)
        adaptive = s.n_estimate != "all"
        n_est = min(n, max(ell, start_size(d, k) if s.n_estimate is None else s.n_estimate)) if adaptive else n
        bound = int(GATHER_FRACTION * n)
        if adaptive and s.n_estimate is None and bound < n_est <= 2 * bound:
            # Just above the gathered fraction: estimate on that fraction first (a moment
            # over every sample costs up to four times more).
            n_est = max(ell, bound)
        sample = GrowingSample(data, n_est, s.rng)
        Xp, _ = sample.rows(max(ell, n_probe, n_est if adaptive and sample.gathered else 0))
        p = _Probe(sample, ell, n_probe, adaptive)
        p.B, sv, p.Q = output_basis(p.Yr, k)
        diag["output_singular_values"] = sv
        rank = numerical_rank(sv, prec.tol(RANK_TOL, d, k))
        p.noise_ratio = float(sv[k] / sv[0]) if (m > k and sv[0] > 0) else 0.0
        diag["noise_ratio"] = p.noise_ratio
        p.Wh = input_whitening(Xp[:n_probe] if adaptive else data, whiten, diag, probe=Xp[:n_probe])
        if p.Wh is False:
            return _early(
                run,
                s,
                Status.NON_IDENTIFIABLE,
                "the second-moment matrix of X is singular: the inputs lie in a "
                "subspace, so V is not identifiable along its complement",
            )
    if rank < k:  # rank(Y) < k only if every sample says so; else a unit too weak or too rare
        check_finite_once(data)
        status, why = rank_shortfall(
            "bjw19-gaussian", data, k, prec, rows=ell, sample_ratio=float(sv[k - 1] / sv[0]) if sv[0] > 0 else 0.0
        )
        return _early(run, s, status, why + " (BJW19 Thm 7).")
    warn_if_not_gaussian(diag, "bjw19-gaussian", "N(0, Sigma)" if p.Wh is not None else "N(0, I)")
    # Noisy outputs cannot be certified at any size: their estimate uses every sample.
    if adaptive and p.noise_ratio > prec.tol(NOISE_FLOOR, d, k):
        p.adaptive, p.n_est = False, n
        diag["adaptive_stopped"] = "noisy outputs: the moment uses every sample"
    return p


class _Found(NamedTuple):
    """What steps 2-5 found: the pool of certified rows, the fitted network and the counts."""

    pool: RowPool
    min_null: float
    U: np.ndarray
    V: np.ndarray
    residual: float
    counts: dict
    gaps: list


def _moment(run, s, p, acc, full):
    """Steps 2-3: the moment ``T[i] = mean_s (YQ)[s, i] (x_s x_s^T - I)`` on a growing random
    sample (in the accumulator ``acc``) or on every sample (cached in ``full``), then the span
    of V and the projected k x k x k tensor (replaces Alg. 4 step 3, docs/bjw19.md)."""
    data, n, k = s.data, s.n, s.k
    with run.stage("moments"):
        if p.adaptive and p.n_est <= GATHER_FRACTION * n:
            p.sample.rows(p.n_est)
            if not full["mean_span"]:
                acc.add(p.Xp[full["n_in_acc"] : p.n_est], p.Yp[full["n_in_acc"] : p.n_est])
                full["n_in_acc"] = p.n_est
                return moment_span(None, None, k, None, s.threads, s.block_size, whitener=p.Wh, acc=acc)
            Q, Xe, Ye = None if s.m == k else p.Q, p.Xp[: p.n_est], p.Yp[: p.n_est]
            return moment_span(Xe, Ye, k, Q, s.threads, s.block_size, whitener=p.Wh, mean_span=True)
        p.n_est = n
        if full.get("moment") is None:
            Q = None if s.m == k else p.Q
            full["moment"] = moment_span(
                data, None, k, Q, s.threads, s.block_size, whitener=p.Wh, mean_span=full["mean_span"]
            )
        return full["moment"]


def _candidates(run, s, p, P, W, prec):
    """Step 4: CP-ALS candidates certified by Alg. 5
    (:func:`relufast.stages.candidates.certify_candidates`), and, when one row
    is missing, the rank-one deflation of relufast (spec of the missing row from the
    samples where every known unit is off). Returns (pool, approximate rows, smallest
    null-space ratio)."""
    Xref = p.Xr if p.Wh is None else np.ascontiguousarray(p.Xr @ p.Wh)
    pool, approx_rows, min_null = certify_candidates(
        run,
        P,
        W,
        p.B,
        Xref,
        p.to_x,
        s.k,
        s.n_restarts,
        s.rng,
        s.threads,
        s.act,
        whitened=p.Wh is not None,
        tols=refine_tolerances(prec, s.d, s.k),
    )
    noiseless = p.noise_ratio < prec.tol(NOISE_FLOOR, s.d, s.k)
    if len(pool) == s.k - 1 and s.k > 1 and noiseless and s.act is RELU and p.Wh is None:
        with run.stage("refine"):
            Xs, Ys = p.Xp[: p.n_probe], p.Yp[: p.n_probe]
            row = _deflate_missing(Xs, Ys, np.array(pool.rows), p.B, p.Xr, s.threads)
        if row is not None and pool.add(row, {"deflation": True}):
            run.diag["deflation_used"] = True
    return pool, approx_rows, min_null


def _estimate(run, s, p, tol_p, prec):
    """Steps 2-5 with adaptive escalation (relufast, beyond the paper): the estimation
    sample doubles until k rows are certified; with the estimate at full size a noiseless
    run missing rows doubles the refinement sample (Alg. 5 needs more confidently-off
    samples, e.g. for nearly parallel rows); rows certified on the refinement sample whose
    network fails the certificate over all samples double both. Returns :class:`_Found`."""
    n, k = s.n, s.k
    noise_tol = prec.tol(NOISE_FLOOR, s.d, k)
    # At size (ReLU units) the span of V comes from the first moment and P from the moment
    # in that span (stages.moments.moment_span): the full (k, d, d) moment costs k d^2 a
    # sample. No accumulator is made then (zeroing its k d^2 sums alone took 0.25 s at
    # d = 784, k = 128).
    mean_span = s.act is RELU and use_mean_span(s.d, k, k)
    acc: SecondMomentAccumulator | None = None
    if not mean_span:
        acc = SecondMomentAccumulator(
            s.d, k, n_jobs=s.threads or None, block_size=s.block_size, compress=None if s.m == k else p.Q
        )
    moment_state = {"n_in_acc": 0, "mean_span": mean_span}
    run.diag["span_from_first_moment"] = mean_span
    c = dict(doublings=0, escalations=0, certify_passes=0, restarts=0, candidates=0)
    gaps = []
    while True:
        check_deadline("in a bjw19-gaussian estimation round")
        W, P, evals = _moment(run, s, p, acc, moment_state)
        run.diag["span_eigenvalue_ratio"] = float(evals[k - 1] / evals[0]) if evals[0] > 0 else 0.0
        pool, approx_rows, min_null = _candidates(run, s, p, P, W, prec)
        c["restarts"] += run.counts["restarts"]
        c["candidates"] += run.counts["candidates"]
        gaps.extend(run.diag["jennrich_gaps"])
        if not pool.full and p.adaptive and p.sample.double():
            c["doublings"] += 1
            continue
        if not pool.full and p.noise_ratio <= noise_tol and p.ell < n and c["escalations"] < MAX_CERTIFY_PASSES:
            c["escalations"] += 1
            p.grow_refinement(s.data, k)
            continue
        # Step 5: the output layer and the certificate over all samples (one fused pass).
        with run.stage("fit"):
            U, V, residual, passes = _fit(s.data, p.Xr, p.Yr, pool, approx_rows, s.threads, s.act, run.diag)
        c["certify_passes"] += passes
        if pool.full and not residual <= tol_p and c["certify_passes"] < MAX_CERTIFY_PASSES and p.ell < n:
            c["escalations"] += 1
            p.n_est = min(n, 2 * p.n_est) if p.adaptive else n
            p.grow_refinement(s.data, k)
            continue
        return _Found(pool, min_null, U, V, residual, c, gaps)


def _finish(run, s, p, f, tol_p, prec, in_memory):
    """The counts, the status (:func:`_outcome`), the float64 polish of a result certified at
    a lower precision, and the bias note of a result that is not exact."""
    d, k = s.d, s.k
    run.counts.update(
        candidates=f.counts["candidates"],
        restarts=f.counts["restarts"],
        certified_rows=len(f.pool),
        n_refine=p.ell,
        n_estimate=p.n_est,
        doublings=f.counts["doublings"],
        escalations=f.counts["escalations"],
        certify_passes=f.counts["certify_passes"],
        n_certify=s.n,
    )
    run.diag["jennrich_gaps"] = np.array(f.gaps)
    run.diag["row_certificates"] = tuple(f.pool.certificates)
    noise_tol = prec.tol(NOISE_FLOOR, d, k)
    status, message = _outcome(
        f.pool,
        k,
        f.residual,
        tol_p,
        s.n,
        p.ell,
        p.noise_ratio,
        s.m,
        f.min_null,
        f.counts["restarts"],
        noise_tol,
        noise_tol,
    )
    U, V, residual = f.U, f.V, f.residual
    if not f.pool.full:
        status, message = _off_centre(p.Xp[: p.n_probe], len(f.pool), k, f.counts["restarts"], status, message)
    exact = status == Status.EXACT
    if exact and not prec.is_double and s.act is RELU and in_memory:
        with run.stage("polish"):
            U, V, _, _, residual = polish_at_precision(s.data.X, s.data.Y, U, V, threads=s.threads)
        # the message quotes the residual of the network returned (result.residual)
        message = message.replace(
            f"relative residual {f.residual:.2e}",
            f"relative residual {residual:.2e} ({f.residual:.2e} when certified, before the polish)",
        )
        message += f" (certified at {prec.name} precision, floor {prec.floor(d, k):.1e}; polished in float64)"
    if not exact and s.act is RELU:
        Xb, Yb = (s.data.X, s.data.Y) if in_memory else (p.Xp[: p.n_probe], p.Yp[: p.n_probe])
        message += _bias_note(Xb, Yb, p.Wh)
    return run.result(
        status, message, U=U, V=V, exact=exact, residual=residual, activation=s.act_out, warn_user=not exact
    )


def _off_centre(Xp, found, k, restarts, status, message):
    """The status and message of a run that did not certify every row when X is not centred
    (its probe's mean more than 6 standard errors and 5% of a standard deviation from 0):
    the cause is then the input offset, which acts as hidden biases ``b = V mu`` outside
    BJW19's model, not a crude moment or noise. Others are returned unchanged."""
    from ..._causes import MEAN_Z_LIMIT, _mean_statistic

    if len(Xp) < 3:
        return status, message
    z, rel = _mean_statistic(np.asarray(Xp, dtype=np.float64))
    if not (z > MEAN_Z_LIMIT and rel > 0.05):
        return status, message
    return Status.FAILED, (
        f"only {found} of {k} rows could be certified after {restarts} restarts: X is not centred (largest "
        f"|mean| / sd = {rel:.2f}), and BJW19's moment assumes x ~ N(0, Sigma); an input offset mu acts as "
        "hidden biases b = V mu, outside this model (not noise, and not a moment too crude for the sample "
        "size): use atv21, which centres and whitens X"
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
            V = (approx_rows / np.linalg.norm(approx_rows, axis=1, keepdims=True))[:k]
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
