"""The sample pipeline of ATV21 Theorem 3.1 (:func:`atv21`): span, Hermite tensors in the
span, Algorithm 6, relufast's exact refinement and the certificate over all samples."""

import math
from typing import NamedTuple, Optional

import numpy as np

from ..._blas import single_threaded_blas
from ..._deadline import check as check_deadline
from ..._memory import available_bytes, gigabytes
from ..._native import BACKEND
from ..._protocol import recovery_method
from ..._result import Run, Status, warn
from ..._validation import (
    InsufficientSamples,
    check_n_hidden,
    check_positive_int,
    check_random_state,
    resolve_n_jobs,
)
from ...stages.diagnostics import GAUSS_ROWS, gaussianity
from ...stages.moments import SecondMomentAccumulator
from ...stages.precision import resolve_precision
from ...stages.reduce import GrowingSample, Samples, SampleStream, check_n_estimate
from ...stages.reduce import start_size as reduce_start_size
from ...stages.refine import RowPool, TooManyRegions, region_refine
from ...stages.tensor import input_span
from . import at_size
from .deflate import deflate
from .lift import LIFT_FIT_ROWS, LIFT_WAIT_K, _certify_all, _lift_refine, _lifted_fit, _lm_refine
from .sample_tensors import _hermite_tensors
from .tensors import NOISE_BATCHES, _algorithm6, _output_pencil

REGION_ROWS = 1 << 16

#: Where the directions of the tensor steps come from, in turn, with m >= k outputs: the
#: output pencil (T_2 of every output; relufast's own) with and without CP-ALS, then
#: ATV21's Jennrich on T_3 and T_4 with and without CP-ALS. With 2 <= m < k the T_3/T_4
#: steps come first (measured: a two-slice pencil at (d, k) = (20, 8) needed more tensor
#: steps); with one output only the T_3/T_4 steps run.
DIRECTION_MODES = ("pencil-cp", "cp", "pencil", "jennrich")

#: Rows (the first ones) whose centred outputs give the output basis Q when m > k (step 1).
COMBINATION_ROWS = 20000
#: Random output combinations g tried for y = Y g when m > 1 (step 1); the best kept.
N_COMBINATIONS = 32


class _Setup(NamedTuple):
    """Validated options of one :func:`atv21` run."""

    k: int
    tol: float
    n_restarts: int
    n_refine: Optional[int]
    n_estimate: object
    max_rounds: int
    margin: float
    n_jobs: Optional[int]
    block_size: int
    rng: np.random.Generator


def _validate(
    X,
    Y,
    n_hidden,
    *,
    tol,
    block_size,
    n_restarts,
    n_refine,
    n_estimate,
    max_rounds,
    margin,
    n_jobs,
    random_state,
    comm,
    prec,
):
    """The samples (:class:`relufast.stages.reduce.Samples`, agreed on by every rank) and
    the checked options; raises ValueError / TypeError saying what was expected."""
    data = Samples.from_arrays(X, Y, comm=comm, n_jobs=resolve_n_jobs(n_jobs))
    n, d = data.n, data.d
    k = check_n_hidden(n_hidden, d)
    block_size = check_positive_int(block_size, "block_size")
    if not (isinstance(tol, (int, float, np.floating)) and np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive number; got {tol!r}")
    n_min = max(2 * (d + 1), 20 * k)
    if n < n_min:
        raise InsufficientSamples(
            f"atv21 needs at least max(2 (d + 1), 20 k) = {n_min} samples for d = {d}, k = {k}; got n = {n}"
        )
    n_restarts = check_positive_int(n_restarts, "n_restarts")
    if n_refine is not None:
        n_refine = check_positive_int(n_refine, "n_refine", minimum=n_min)
    if not (n_estimate is None or isinstance(n_estimate, str) or np.ndim(n_estimate) == 0):
        raise TypeError(f"n_estimate must be None, 'all' or an integer; got {type(n_estimate).__name__}")
    n_estimate = check_n_estimate(n_estimate, n_min)
    max_rounds = check_positive_int(max_rounds, "max_rounds", minimum=0)
    if not (np.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin must be a number >= 0; got {margin!r}")
    rng = check_random_state(random_state)
    setup = _Setup(
        k, prec.tol(tol, d, k), n_restarts, n_refine, n_estimate, max_rounds, float(margin), n_jobs, block_size, rng
    )
    return data, setup


def _check_gaussian(run, data):
    """Gaussianity of X on its first GAUSS_ROWS rows (gathered on every rank); warns."""
    diag = run.diag
    diag.update(gaussianity(data.take(np.arange(min(data.n, GAUSS_ROWS)))[0]))
    if not diag["gaussian_ok"]:
        warn(
            "X does not look like standard Gaussian input (second-moment deviation "
            f"{diag['second_moment_deviation']:.3g} vs {diag['second_moment_tolerance']:.3g}, kurtosis "
            f"statistic {diag['kurtosis_statistic']:.3g} vs {diag['kurtosis_tolerance']:.3g}); ATV21's "
            "Hermite moments assume x ~ N(0, I). An 'exact' status remains trustworthy (it is a "
            "residual certificate over all samples), but the estimate may fail."
        )


def _span_and_combination(run, data, s):
    """Steps 1-2: T_2 of the outputs (compressed to k when m > k), the span W (d, k) of V
    from its top-k eigenvectors (ATV21 Sec. 3.6), and the combination ``y = Y g``.

    The paper has one output. With m > 1, ``a_j = U_j . g``; of N_COMBINATIONS random unit
    g the one whose projected T_2 (``sum_j a_j phi(b_j) w_j w_j^T``) is best conditioned
    is kept, so that no unit is nearly invisible. Returns (W, g, P2): P2 (q, k, k) are the
    q >= 2 compressed outputs' T_2 in the span (:func:`_output_pencil`), None for one output.
    """
    d, m, k = data.d, data.m, s.k
    if m > k:
        Yh = data.take(np.arange(min(data.n, COMBINATION_ROWS)))[1]
        Q = np.ascontiguousarray(np.linalg.svd(Yh - Yh.mean(axis=0), full_matrices=False)[2][:k].T)
        acc2 = SecondMomentAccumulator(d, k, n_jobs=s.n_jobs, block_size=s.block_size, compress=Q)
    else:
        Q = np.eye(m)
        acc2 = SecondMomentAccumulator(d, m, n_jobs=s.n_jobs, block_size=s.block_size)
    T2all = data.accumulate(acc2).tensor()
    W, evals = input_span(T2all, k)
    W = np.ascontiguousarray(W)
    best = (-1.0, None)
    for _ in range(N_COMBINATIONS if m > 1 else 1):
        gq = s.rng.standard_normal(Q.shape[1])
        gq /= np.linalg.norm(gq)
        ev = np.abs(np.linalg.eigvalsh(W.T @ np.tensordot(gq, T2all, axes=1) @ W))
        score = float(ev.min() / max(ev.max(), 1e-300))
        if score > best[0]:
            best = (score, gq)
    g = Q @ best[1]
    g /= np.linalg.norm(g)
    P2 = np.einsum("qab,ai,bj->qij", T2all, W, W) if T2all.shape[0] >= 2 else None
    run.diag.update(
        output_combination=g,
        combination_condition=best[0],
        span_eigenvalues=evals[: min(len(evals), k + 3)],
        span_eigenvalue_ratio=float(evals[k - 1] / evals[0]) if evals[0] > 0 else 0.0,
    )
    return W, g, P2


def _refinement_sample(data, s):
    """The samples of the refinement rounds: ``n_refine`` random rows gathered on every rank
    (:meth:`Samples.take`), or all samples when there are no more. Returns ((X_s, Y_s),
    whether they are all the samples)."""
    if s.n_refine is not None and data.n > s.n_refine:
        idx = np.sort(SampleStream(data.n, s.rng).grow(s.n_refine))
        return data.take(idx), False
    if data.distributed or data.lazy:
        return data.gather_all(), True
    return (data.X, data.Y), True


def _estimate(T, W, s, noise, polish, P2=None):
    """Steps 4-6 (ATV21 Algorithm 6) in the span, mapped back to the input space; with
    ``polish`` "pencil-cp" or "pencil" the directions come from the output pencil ``P2``
    (:func:`_output_pencil`) instead of T_3 and T_4. Returns (V0 (k, d) unit rows, a, b,
    c0, diagnostics), or None when a parameter is not finite."""
    directions = None
    if polish.startswith("pencil"):
        directions = _output_pencil(P2, T[2], s.rng, 10, "cp" if polish == "pencil-cp" else "jennrich")
    Z, a, bb, c0, d6 = _algorithm6(
        T, s.k, s.rng, noise3=noise[3], noise4=noise[4], polish=polish, directions=directions
    )
    V0 = (W @ Z).T
    V0 = np.ascontiguousarray(V0 / np.linalg.norm(V0, axis=1, keepdims=True))
    if not (np.all(np.isfinite(V0)) and np.all(np.isfinite(bb)) and np.all(np.isfinite(a))):
        return None
    return V0, a, bb, c0, d6


#: Rows of the refinement sample that the affine-lift Alg. 5 reads: enough for its support
#: solves (|S| >= d + 1) and null-space tests (2 (k + 1) + 5 confidently-off samples) when
#: units are active on a few percent of the samples; more rows only add chances that an
#: estimate's confidently-off set holds a sample where the unit is on.
def _refine_and_certify(data, s, sample, covers_all, V0, b0, refine, pool=None, last=True):
    """Step 7: (U, c) for every output by least squares and the activation-region
    refinement (relufast's own, :func:`relufast.stages.refine.region_refine`) on the
    refinement sample. Returns (rr, whether rr.residual is over all samples): the
    certificate over all samples (a reduction over the blocks and ranks of ``data``) is
    only run when the refinement sample is fitted to ``tol``; a residual above it on the
    sample already rules the network out."""
    Xs, Ys = sample
    kw = dict(margin=s.margin, max_rounds=s.max_rounds if refine else 0, n_jobs=s.n_jobs, block_size=4096)
    lifted = None
    if pool is not None and refine and np.ndim(Ys) == 2 and Ys.shape[1] >= s.k:
        lifted = _lift_refine(Xs, Ys, V0, b0, s.n_jobs, pool)
    if lifted is not None:
        V0, b0 = lifted
        rr = _lifted_fit(Xs, Ys, V0, b0)
        whole = covers_all and len(Xs) <= LIFT_FIT_ROWS  # rr's residual is over all samples
        if pool.full and rr.residual <= s.tol:
            return (rr, True) if whole else (_certify_all(data, rr), True)
        if not last and s.k > LIFT_WAIT_K:
            # The next tensor step may certify the units still missing: the activation-region
            # refinement (costly at this k: most samples have their own region) waits for the
            # last step, from the pooled rows.
            return rr, whole
    if lifted is None and refine:
        lm = _lm_refine(Xs, Ys, V0, b0, s.tol)
        if lm is not None:
            V0, b0 = lm[:2]
            rr = _lifted_fit(Xs, Ys, V0, b0, rounds=lm[2])
            if rr.residual <= s.tol:
                whole = covers_all and len(Xs) <= LIFT_FIT_ROWS
                return (rr, True) if whole else (_certify_all(data, rr), True)
        if (1 if np.ndim(Ys) == 1 else Ys.shape[1]) < s.k and s.k > LIFT_WAIT_K:
            # Fewer outputs than units, many units: the region refinement costs seconds a
            # step and rarely certifies; the deflation (_tensor_steps) takes over.
            return _lifted_fit(Xs, Ys, V0, b0), False
    try:
        rr = region_refine(Xs, Ys, V0, b0, tol=min(1e-14, s.tol), **kw)
    except TooManyRegions:
        # Many units (k near 20 and more): nearly every sample has its own activation
        # pattern. The regions are never more than the rows, so refine on REGION_ROWS of
        # them; the certificate below still reads every sample.
        rows = min(len(Xs), REGION_ROWS)
        rr = region_refine(Xs[:rows], Ys[:rows], V0, b0, tol=min(1e-14, s.tol), **kw)
        covers_all = covers_all and rows == len(Xs)
    if covers_all or rr.residual > s.tol:
        return rr, covers_all
    return _certify_all(data, rr), True


def _restarts(run, data, s, T, W, noise, sample, covers_all, refine, n_restarts, P2=None):
    """Steps 4-7, restarted with new random contractions until the certificate passes:
    the residual over all samples decides, so a restart can only help. With one output
    the directions alternate between Jennrich on T_3/T_4 with and without a CP-ALS
    polish; with several (``P2``) and ``refine`` the output pencil joins them, first when
    m >= k (:data:`DIRECTION_MODES`). Returns (best (rr, diagnostics, a, b,
    c0, over_all) or None, residuals)."""
    best, attempts = None, []
    pool = RowPool(s.k)  # rows certified by the affine-lift Alg. 5, over the tensor steps
    if P2 is None or not refine:
        modes: tuple = ("cp", "jennrich")
    elif P2.shape[0] >= s.k:
        modes = DIRECTION_MODES
    else:  # 2 <= m < k: a pencil of fewer than k slices is worse conditioned; T_3/T_4 first
        modes = ("cp", "pencil-cp", "jennrich", "pencil")
    for attempt in range(n_restarts if refine else 1):
        check_deadline("in an atv21 tensor step")
        with run.stage("tensor"):
            est = _estimate(T, W, s, noise, modes[attempt % len(modes)], P2)
        if est is None:
            attempts.append(float("nan"))
            continue
        V0, a, bb, c0, d6 = est
        with run.stage("refine"):
            last = attempt == (n_restarts if refine else 1) - 1
            rr, over_all = _refine_and_certify(data, s, sample, covers_all, V0, bb, refine, pool, last)
        run.counts["certify_passes"] += over_all
        attempts.append(rr.residual)
        if best is None or rr.residual < best[0].residual:
            best = (rr, d6, a, bb, c0, over_all)
        if over_all and rr.residual <= s.tol:
            break
    return best, attempts


#: Tensor estimates the deflation starts from, in turn, until one certifies.
DEFLATION_MODES = ("cp", "jennrich")


def _certified(found, tol):
    return found is not None and found[5] and found[0].residual <= tol


def _tensor_steps(run, data, est, s, T, W, g, noise, sample, covers_all, refine, restarts, P2):
    """The tensor steps of one estimation size (:func:`_restarts`). With fewer outputs than
    units the deflation (:func:`_deflated`) follows the first failed step when k is above
    LIFT_WAIT_K (the region refinement of each further step costs seconds there and rarely
    certifies), else the last; the remaining steps run if it fails too."""
    first = 1 if (refine and data.m < s.k and s.k > LIFT_WAIT_K) else restarts
    found, attempts = _restarts(run, data, s, T, W, noise, sample, covers_all, refine, first, P2)
    for mode in DEFLATION_MODES if refine and data.m < s.k else ():
        if _certified(found, s.tol):
            break
        found = _deflated(run, data, est, s, T, W, g, noise, sample, covers_all, mode) or found
        if not _certified(found, s.tol) and restarts > first:
            more, tried = _restarts(run, data, s, T, W, noise, sample, covers_all, refine, restarts - first, P2)
            attempts += tried
            if more is not None and (found is None or more[0].residual < found[0].residual):
                found = more
    return found, attempts


def _deflated(run, data, est, s, T, W, g, noise, sample, covers_all, mode):
    """Fewer outputs than units and no tensor step certified: the distinct units of one
    tensor estimate, fitted, and the missing ones estimated from the residual
    (:func:`relufast.algorithms.atv21.deflate.deflate`). Returns the ``_restarts`` tuple of
    a network certified over all samples, or None."""
    with run.stage("tensor"):
        est0 = _estimate(T, W, s, noise, mode)
    if est0 is None:
        return None
    V0, a, bb, c0, d6 = est0
    with run.stage("deflate"):
        out = deflate(run, est, s, W, g, V0, bb, sample, s.tol)
    if out is None:
        return None
    rr = _lifted_fit(sample[0], sample[1], out[0], out[1], rounds=out[2])
    if rr.residual > s.tol:
        return None
    if not (covers_all and len(sample[0]) <= LIFT_FIT_ROWS):
        rr = _certify_all(data, rr)
        run.counts["certify_passes"] += 1
    return (rr, d6, a, bb, c0, True) if rr.residual <= s.tol else None


def _unit_notes(diag, bb, noise, n):
    """Units at the detection limit (ATV21 Sec. 1.3, the set P of Lemma D.13): |b| above
    sqrt(2 log n), or a T_2 weight ``|a phi(b)|`` within 3 noise levels of the plain
    estimator ``mean y He_2`` (``noise``; conservative: the span of V comes from it).
    Recorded in the diagnostics; returns the sentence for the message ("" when none)."""
    large = np.flatnonzero(np.abs(bb) > math.sqrt(2.0 * math.log(max(n, 3))))
    diag["units_large_bias"] = tuple(int(i) for i in large)
    weak = np.flatnonzero(np.abs(diag["zeta2"]) <= 3.0 * noise[2])
    diag["units_below_noise"] = tuple(int(i) for i in weak)
    unreliable = sorted(set(diag["units_large_bias"]) | set(diag["units_below_noise"]))
    if not unreliable:
        return ""
    return (
        f" Estimated units {unreliable} are at the detection limit (T_2 weight |a phi(b)| within 3 "
        f"noise levels = {3 * noise[2]:.1e}, or |b| > sqrt(2 log n)): a unit with |b| this large is "
        "nearly always or never active and cannot be recovered at this n"
    )


def _outcome(run, data, s, rr, attempts, note, refine, prec):
    """The status: ``exact`` only when the residual over all samples is at most ``tol``
    and the region system determined every unit; never on a wrong network."""
    n, d, k = data.n, data.d, s.k
    order = np.argsort(-np.linalg.norm(rr.U, axis=0), kind="stable")
    params = dict(U=rr.U[:, order], V=rr.V[order], b=rr.b[order], c=rr.c, residual=rr.residual)
    residual, start = rr.residual, rr.history[0]
    if not refine:
        return run.result(
            Status.APPROXIMATE,
            f"ATV21 estimate (Algorithm 6) with (U, c) by least squares: relative residual "
            f"{residual:.2e} over {n} samples; refine=True makes it exact on noiseless data" + note,
            **params,
        )
    if residual <= s.tol and not rr.undetermined:
        return run.result(
            Status.EXACT,
            f"recovered {k} hidden units with biases exactly: ATV21 estimate from "
            f"{run.counts['n_estimate']} samples (residual {start:.2e}, tensor step {len(attempts)}) made exact by "
            + (
                "BJW19 Algorithm 5 on the affine lift [x, 1]; relative residual "
                if rr.rounds == 0 and rr.n_regions == 0
                else f"{rr.rounds} rounds of activation-region refinement; relative residual "
            )
            + f"{residual:.2e} over {n} samples"
            + (
                ""
                if prec.is_double
                else f" (certified at {prec.name} precision, floor {prec.floor(d, k):.1e}; fitted in float64)"
            ),
            exact=True,
            **params,
        )
    if residual <= s.tol:
        return run.result(
            Status.NON_IDENTIFIABLE,
            f"the network fits exactly (residual {residual:.2e}) but the activation regions "
            f"populated by the samples do not determine units {list(rr.undetermined)} (the "
            "region system has rank < k: such a unit is active on all or on no samples, or "
            "always together with others); more samples, or a smaller |b|, may fix it" + note,
            **params,
        )
    judged = _noisy_outcome(run, data, s, rr, params, note)
    if judged is not None:
        return judged
    return run.result(
        Status.FAILED,
        f"the ATV21 estimate is outside the basin of the activation-region refinement: the "
        f"residual went from {start:.2e} to {residual:.2e} in {rr.rounds} rounds, best of "
        f"{len(attempts)} tensor steps (exact needs "
        f"<= {s.tol:.1e}). Try more samples (the estimate's error falls like n^-1/2), another "
        "random_state, or check that the outputs are noiseless (for noisy outputs use "
        "refine=False) and X standard Gaussian" + note,
        **params,
    )


#: The noise test of a refined estimate reads at most this many samples (its cost is
#: O(n d^2 m)) and runs for d <= NOISE_TEST_MAX_D.
NOISE_TEST_ROWS = 200_000
NOISE_TEST_MAX_D = 100


def _noisy_outcome(run, data, s, rr, params, note):
    """A refined estimate that is not exact, judged by its residual (relufast): noise when
    the residual's first two Hermite moments are at their sampling level
    (:func:`relufast.stages.noise.residual_moment_statistic`), then ``approximate`` with the
    noise level it reaches; otherwise, when the outputs show more units than n_hidden
    (:func:`relufast.units.visible_units`), ``failed`` naming that count. None
    when neither applies (the estimate is outside the basin)."""
    from ...stages.noise import NOISE_Z, residual_moment_statistic
    from ...units import visible_units

    n, d, k = data.n, data.d, s.k
    if d > NOISE_TEST_MAX_D or data.distributed or data.lazy:
        return None
    rows = np.arange(min(n, NOISE_TEST_ROWS))
    Xh, Yh = data.take(rows)
    stat = residual_moment_statistic(Samples(Xh, Yh), rr.U, rr.V, rr.b, rr.c)
    run.diag["residual_moment_z"] = stat["z"]
    if stat["z"] <= NOISE_Z:
        run.diag["noise_level"] = stat["noise_level"]
        return run.result(
            Status.APPROXIMATE,
            f"the outputs are noisy: no network fits them to tol = {s.tol:.1e}, and the refined ATV21 estimate "
            f"leaves relative residual {rr.residual:.2e} over {n} samples, which is noise: its first two Hermite "
            f"moments are at their sampling level (z = {stat['z']:.1f} <= {NOISE_Z:g} on {len(rows)} samples), "
            f"so the estimate reaches the noise level {stat['noise_level']:.2e} (relative to the outputs)." + note,
            **params,
        )
    vis = visible_units(Xh[:20000], Yh[:20000])
    count = vis.count
    at_least = "at least " if vis.output_rank >= data.m else ""  # the rank of m outputs is saturated
    if math.isfinite(count) and count > k:  # fewer visible units than k is no proof: weak ones fall below the floor
        return run.result(
            Status.FAILED,
            f"the outputs show {at_least}{int(count)} hidden units, not n_hidden = {k}: "
            f"no network of {k} units "
            f"fits them (the best estimate leaves relative residual {rr.residual:.2e}, with moments "
            f"{stat['z']:.0f} standard deviations above noise); try n_hidden = {int(count)}." + note,
            **params,
        )
    return None


def start_size(d, k):
    """First size of the adaptive estimation sample: ``max(20000, 500 d k)``
    (:func:`relufast.stages.reduce.start_size`). Measured on
    random teachers (``docs/atv21.md``): at (d, k, m) = (20, 8, 2), n = 1e6, a start of
    500 d k = 80,000 was exact after 0-1 doublings in 5 of 5 seeds, 1.3x faster than
    reading every sample; a start of 200 d k needed 2-3 doublings and was slower."""
    return reduce_start_size(d, k, per_unit=500, minimum=20000)


#: Tensor steps tried at an estimation size below all samples before doubling it (the
#: full ``n_restarts`` are tried once every sample is used).
ADAPTIVE_RESTARTS = 2

#: At an adaptive estimation size n_e, the refinement runs on the first REFINE_FACTOR n_e
#: rows of the same random sample (at most ``n_refine``).
REFINE_FACTOR = 4


def _estimation_samples(data, s, sample):
    """The samples at the estimation size of ``sample`` (a :class:`GrowingSample`): its
    first ``size`` rows for the moments, gathered in memory on every rank (a one-process
    :class:`Samples`), and its first REFINE_FACTOR ``size`` rows (at most ``n_refine``) for
    the refinement; or, once the size passes GATHER_FRACTION of n, ``data`` itself and the
    refinement sample of the last size (:func:`_refinement_sample`). Returns (moment samples,
    rows used, (refinement sample, whether it is all samples))."""
    if not sample.gathered:
        return data, data.n, _refinement_sample(data, s)
    size = sample.size
    ell = REFINE_FACTOR * size if s.n_refine is None else min(REFINE_FACTOR * size, s.n_refine)
    X, Y = sample.rows(max(size, ell))
    return Samples(X[:size], Y[:size], n_jobs=data.n_jobs), size, ((X[:ell], Y[:ell]), False)


def _estimate_and_refine(run, data, s, refine):
    """Steps 2-7 on a growing random sample (relufast's adaptive estimation, as in
    bjw19-gaussian): the moments of the first ``start_size(d, k)`` rows (or
    ``n_estimate``), the tensor steps and the refinement on the same rows (at most
    ``n_refine`` of them); while no network is certified over all samples (and
    determined), the estimation sample doubles, until it is every sample, where the
    refinement takes its own ``n_refine`` random rows. With ``refine=False`` or
    ``n_estimate="all"`` the moments read every sample at once. Returns (best or None,
    residuals of every tensor step)."""
    n, k = data.n, s.k
    adaptive = refine and s.n_estimate != "all"
    sample = GrowingSample(data, min(n, s.n_estimate or start_size(data.d, k)) if adaptive else n, s.rng)
    attempts, best = [], None
    while True:
        check_deadline("in an atv21 estimation round")
        est, size, (refine_rows, covers_all) = _estimation_samples(data, s, sample)
        final = size >= n
        with run.stage("moments"):
            W, g, P2 = _span_and_combination(run, est, s)
            T, noise = _hermite_tensors(run, est, s, W, g)
        run.counts.update(n_estimate=size, n_refine=len(refine_rows[0]))
        if run.diag["span_eigenvalue_ratio"] >= 1e-12:
            restarts = s.n_restarts if final else min(s.n_restarts, ADAPTIVE_RESTARTS)
            found, tried = _tensor_steps(
                run, data, est, s, T, W, g, noise, refine_rows, covers_all, refine, restarts, P2
            )
            attempts += tried
            if found is not None and (best is None or found[0].residual <= best[0].residual):
                best = found
            if best is not None and best[5] and best[0].residual <= s.tol and not best[0].undetermined:
                break
        if final or not sample.double():
            break
        run.counts["doublings"] += 1
    return best, attempts


#: Share of the available memory the tensor step may use.
MEMORY_SHARE = 0.8


def tensor_memory(k, n_jobs):
    """Peak bytes of :func:`.sample_tensors._hermite_tensors` at k units: its second pass
    keeps NOISE_BATCHES accumulators of order-4 raw sums for 2 outputs (16 k^4 bytes each,
    the lower orders add k^3 terms), their exchanged copies and their tensors (three
    sets), plus one accumulator a thread, the total and temporaries (at k = 36, d = 40, 2
    threads this gives 0.83 GB; ``bench/test_bench_atv21.py::test_tensor_memory_estimate``
    measured a run adding 0.65 GB of peak memory)."""
    per = 16.0 * (k**4 + k**3 + k**2 + k + 1)
    return per * (3 * NOISE_BATCHES + max(int(n_jobs or 1), 1) + 4)


def _atv21(X, Y, n_hidden, *, refine, comm, prec, **options):
    """The pipeline of :func:`atv21` (steps 1-7 of its Notes), one named step per call."""
    run = Run("atv21")
    data, s = _validate(X, Y, n_hidden, comm=comm, prec=prec, **options)
    run.precision = prec.name
    run.counts.update(n_samples=data.n, n_hidden=s.k, n_certify=data.n, doublings=0, certify_passes=0)
    diag = run.diag
    diag.update(backend=BACKEND, threads=data.n_jobs)
    _check_gaussian(run, data)
    if at_size.applies(data.d, s.k, data.m, refine, s.n_estimate):
        rr = at_size.estimate_at_size(run, data, s)
        if rr is not None:
            diag.update(directions_from="at-size", refine_history=np.array(rr.history), refine_rounds=0)
            diag.update(undetermined_units=(), n_regions=0, n_certain=rr.n_certain, n_trimmed=0)
            run.counts.update(refine_rounds=0, regions=0)
            return _outcome(run, data, s, rr, [rr.residual], "", refine, prec)
        diag["at_size"] = "no certified network; ATV21's pipeline follows"
        run.counts.update(doublings=0)
    need, avail = tensor_memory(s.k, data.n_jobs), available_bytes()
    diag.update(tensor_memory_bytes=need, memory_available_bytes=avail)
    if need > MEMORY_SHARE * avail:
        return run.result(
            Status.UNSUPPORTED,
            f"atv21's Hermite tensors up to order 4 in the span of k = {s.k} units need about {gigabytes(need)} "
            f"({NOISE_BATCHES} batches of k^4 = {s.k**4:.3g} entries for 2 outputs, with their copies), more "
            f"than {MEMORY_SHARE:.0%} of the {gigabytes(avail)} of memory available: none was allocated. With "
            "m >= k outputs the at-size path computes no tensor above order 2 (bjw19-gaussian too, bias-free); "
            "a model you can query extracts with queries='chosen'",
        )
    best, attempts = _estimate_and_refine(run, data, s, refine)
    if best is None and diag["span_eigenvalue_ratio"] < 1e-12:
        return run.result(
            Status.FAILED,
            f"T_2 has fewer than k = {s.k} nonzero eigenvalues (ratio "
            f"{diag['span_eigenvalue_ratio']:.1e}): some unit is invisible (a_i = 0 or "
            "|b_i| very large) or two units are parallel",
        )
    if best is None:
        return run.result(
            Status.FAILED,
            "the tensor step produced non-finite parameters (degenerate "
            "Jennrich pencil) in every restart; try more samples or another random_state",
        )
    rr, d6, a, bb, c0, over_all = best
    if not over_all:
        rr = _certify_all(data, rr)
        run.counts["certify_passes"] += 1
    diag.update(d6)
    diag.update(
        estimate_a=a,
        estimate_b=bb,
        estimate_c_combined=c0,
        restarts=len(attempts),
        restart_residuals=np.array(attempts),
    )
    note = _unit_notes(diag, bb, diag["tensor_noise_plain"], data.n)
    diag.update(
        refine_history=np.array(rr.history),
        refine_rounds=rr.rounds,
        undetermined_units=rr.undetermined,
        n_regions=rr.n_regions,
        n_certain=rr.n_certain,
        n_trimmed=rr.n_trimmed,
    )
    run.counts.update(refine_rounds=rr.rounds, regions=rr.n_regions, restarts=len(attempts))
    return _outcome(run, data, s, rr, attempts, note, refine, prec)


@recovery_method("atv21", whiten=True)
def atv21(
    X,
    Y,
    n_hidden,
    *,
    refine=True,
    tol=1e-10,
    max_rounds=10,
    margin=0.1,
    n_restarts=8,
    n_refine=200000,
    n_estimate=None,
    n_jobs=None,
    random_state=None,
    block_size=256,
    comm=None,
    precision=None,
):
    """Recover ``Y = relu(X V^T + b) U^T + c`` for Gaussian X, k <= d, any m (ATV21 Thm 3.1).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Inputs, i.i.d. N(0, I_d) for the guarantee.
    Y : array-like of shape (n_samples, n_outputs) or (n_samples,)
        Outputs; noiseless for an exact result.
    n_hidden : int
        Number of hidden units k <= n_features.
    refine : bool, default=True
        Run the activation-region refinement after the paper's estimate (exact on noiseless
        data). False returns the paper's estimate with status ``approximate``.
    tol : float, default=1e-10
        Largest relative residual ``||Y - f(X)||_F / ||Y||_F`` accepted as exact.
    max_rounds : int, default=10
        Rounds of the region refinement.
    margin : float, default=0.1
        First-round margin of the region refinement.
    n_refine : int or None, default=200000
        Samples (a random subset) used by the rounds of the region refinement; the final
        fit of (U, c) and the certificate use all samples. None: all samples throughout.
    n_restarts : int, default=8
        Tensor steps (new random contractions; CP-ALS polish on every other one) tried
        until the refinement certifies the network; the best is returned. At an adaptive
        estimation size below all samples at most 2 are tried before the size doubles.
    n_estimate : None, int or "all", default=None
        Samples of the moment estimate (steps 2-3). None: adaptive, starting from a random
        sample of :func:`start_size` ``= max(20000, 500 d k)`` rows and doubling it while no
        network is certified over all samples, up to all of them; an int sets the start
        size; "all" reads every sample in the moments (the behaviour before adaptive
        estimation). ``refine=False`` (noisy outputs: the statistics need every sample)
        always uses all. ``counts["n_estimate"]``, ``counts["doublings"]`` and
        ``counts["certify_passes"]`` report what was used.
    n_jobs : int or None, default=None
        Threads for the C++ kernels (None or -1: all cores).
    random_state : None, int or numpy Generator
        Seeds the output combination and Jennrich's random contractions.
    block_size : int, default=256
        Samples per block of the moment kernels.
    comm : mpi4py communicator, optional
        Each rank passes its own samples; the moments, the Gaussianity probe, the
        refinement sample and the certificate are reduced or gathered over the ranks, and
        every rank returns the same result: that of one process on the concatenated
        samples, up to rounding (``docs/scale.md``).
    precision : None, str or float, optional
        Precision of the outputs (default: from Y's dtype). Below float64 ``tol`` is raised
        to the rounding floor (:mod:`relufast.stages.precision`); the region refinement
        fits in float64.

    X and Y may be NumPy memmaps (read in place, block by block) or dask arrays (row
    blocks); only the refinement sample (``n_refine`` rows), the adaptive estimation
    sample (below a quarter of n) and the Gaussianity probe are gathered in memory.

    Which stages read every sample: the certificate (the residual of the refined network,
    one pass per network fitted to ``tol`` on the refinement sample) and the finiteness
    check always; the moments only with ``n_estimate="all"``, ``refine=False``, or once the
    adaptive sample has doubled past a quarter of n.

    Returns
    -------
    RecoveryResult
        With ``b`` and ``c``. ``exact`` when the refinement reached ``tol`` over all samples
        and the region system determined every unit; ``non_identifiable`` when the fit is
        exact but some unit is undetermined (``diagnostics["undetermined_units"]``);
        ``failed`` when the estimate was outside the refinement's basin; ``approximate``
        with ``refine=False``.

    Notes
    -----
    Steps (ATV21, Algorithm 6 = Algorithm 4 with l = 1 + Algorithm 3):

    1. ``y = Y g`` for a random unit g (the paper's single output; a = U^T g).
    2. T_2 of the outputs (C++, 2 n m d^2 flops), span W (d, k) of V from its top-k
       eigenvectors (the practical option of ATV21 Sec. 3.6).
    3. T_0..T_4 of y in the span, z = W^T x (C++, ~2 n k^4 flops), in 8 mergeable batches
       whose spread gives the noise of T_3 and T_4.
    4. Alg. 4 steps 1-4: Jennrich on the joint pencil of the flattenings of T_3 and T_4,
       CP-ALS polish: directions up to sign. With m >= k outputs (and ``refine``) the
       first tensor step takes the directions from the second moments of every output
       instead (relufast's own, beyond the paper: :func:`_output_pencil`), the later ones
       alternate (:data:`DIRECTION_MODES`); ``diagnostics["directions_from"]`` says which.
    5. Alg. 2: zeta_j = SymPowLS(T_j), ``b = -zeta_3 / zeta_2``, ``a = sqrt(2 pi) e^{b^2/2} zeta_2``.
    6. Alg. 3 (FixSigns) from T_1; ``c = T_0 - sum_i a_i c_0(b_i)``.
    7. (U, c) for all outputs by least squares; region refinement (beyond the paper);
       the residual over all samples is the certificate.

    Steps 2-3 run on the adaptive estimation sample n_e (``n_estimate``): their cost is
    2 n_e (m d^2 + k^4) flops, and steps 2-7 repeat with n_e doubled until a network is
    certified over all samples.
    """
    prec = resolve_precision(Y, precision)
    with single_threaded_blas():
        return _atv21(
            X,
            Y,
            n_hidden,
            refine=refine,
            tol=tol,
            max_rounds=max_rounds,
            margin=margin,
            n_restarts=n_restarts,
            n_refine=n_refine,
            n_estimate=n_estimate,
            n_jobs=n_jobs,
            random_state=random_state,
            block_size=block_size,
            comm=comm,
            prec=prec,
        )
