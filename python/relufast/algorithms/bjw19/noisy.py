"""BJW19 Theorem 10, Algorithm 6: i.i.d. sub-Gaussian output noise."""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from ..._blas import single_threaded_blas
from ..._deadline import check as check_deadline
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
from ...stages.diagnostics import outputs_below_hidden_message
from ...stages.fit import certify, fit_from_stats, polish, refine_to_exact, residual_from_stats
from ...stages.moments import moment_span
from ...stages.precision import polish_at_precision, resolve_precision
from ...stages.reduce import Samples, SampleStream
from ...stages.refine import output_basis
from ...stages.tensor import draw_candidates

__all__ = ["noisy", "sign_by_projection"]


def sign_by_projection(X, Y, V):
    """BJW19 Algorithm 6: choose the sign of each approximate row by projections.

    For row i, ``S_{i,+}`` holds relu(+-X v_j) for j != i and relu(X v_i); ``S_{i,-}`` the
    same with relu(-X v_i). The row keeps its sign when the outputs lie closer to
    span(S_{i,+}) than to span(S_{i,-}) (paper's step 3 writes A for the first line and
    drops a parenthesis: docs/bjw19.md, erratum 6).

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


#: sigma_(k+1)/sigma_1 of the outputs (m > k) at or below this (raised to the rounding floor
#: below float64) reads as noiseless: exact outputs leave it at rounding level, about 1e-16.
NOISE_FLOOR = 1e-12
#: With m > k, ``exact_refine="auto"`` runs the activation-region refinement while
#: sigma_(k+1)/sigma_1 is at most this (relufast): outputs with noise of 1e-11..1e-6 leave
#: the Alg. 6 estimate at a residual of 6e-2..8e-2, and the refinement (0.2-0.4 s at
#: n = 2e4, d = 10) reaches the noise level, exact when that is below tol.
REFINE_NOISE_MAX = 1e-4


@recovery_method("bjw19-noisy")
def noisy(
    X,
    Y,
    n_hidden,
    *,
    n_sign=20000,
    n_restarts=5,
    polish_steps=0,
    exact_refine="auto",
    tol=1e-10,
    n_jobs=None,
    random_state=None,
    block_size=256,
    comm=None,
    precision=None,
):
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
        Gauss-Newton steps on all parameters and all samples after the paper's estimate
        (opt-in, :func:`relufast.stages.fit.polish`; reaches the statistical rate, beyond the
        paper).
    exact_refine : {"auto", True, False}, default="auto"
        Beyond the paper: the activation-region refinement from the estimate
        (:func:`relufast.stages.fit.refine_to_exact`), ``exact`` when the certificate over
        all samples holds. "auto" tries it when sigma_(k+1)/sigma_1 of the outputs is at most
        ``REFINE_NOISE_MAX`` = 1e-4 (m > k) or when m = k (the certificate decides). The
        refinement reads the ``n_sign`` samples of the sign test; the certificate reads every
        sample. On noisy outputs the refined network is returned (``approximate``) when it
        fits better than the Alg. 6 estimate.
    tol : float, default=1e-10
        Largest relative residual accepted as exact after the refinement.
    n_jobs, random_state, block_size
        As in :func:`gaussian`.
    comm : mpi4py communicator, optional
        Each rank passes its own samples; every rank returns the same result.
    precision : None, str or float, optional
        As in :func:`gaussian`: below float64 the noiseless test and ``tol`` are raised to
        the rounding floor; ``result.precision`` names it.

    No stage is adaptive here: the noise averages out only over every sample, so the
    moment and the fit of U read all of them (the sign test reads ``n_sign``). X and Y may
    be memmaps or dask arrays; ``polish_steps`` needs the samples in memory on one process.

    Returns
    -------
    RecoveryResult
        ``approximate``, or ``exact`` when the refinement certified noiseless data
        (``diagnostics['exact_refinement']`` says how it ended). ``diagnostics['sign_margins']``
        holds the per-row confidence of Alg. 6 (a warning when one is not positive).

    Notes
    -----
    1. Tensor estimate of V up to signs (Alg. 4 with the second-order moment of docs/bjw19.md; the
       noise is mean zero and independent of X, so the moment is unbiased).
    2. Signs by Algorithm 6 on ``min(n, n_sign)`` samples.
    3. U by least squares on all samples (Lemma 20; the paper uses l samples).
    4. (relufast) On noiseless data, the activation-region refinement and the certificate.
    The error of (U, V) falls like n^(-1/2) (measured in ``bench/``).
    """
    prec = resolve_precision(Y, precision)
    opts = (n_sign, n_restarts, polish_steps, exact_refine, tol, n_jobs, random_state, block_size, comm, prec)
    with single_threaded_blas():
        return _noisy(X, Y, n_hidden, *opts)


def _noisy(
    X, Y, n_hidden, n_sign, n_restarts, polish_steps, exact_refine, tol, n_jobs, random_state, block_size, comm, prec
):
    """The body of :func:`noisy`: validation, Thm 10 steps 1-3 (:func:`_estimate`), and step 4
    (:func:`_refine_exact`) when the outputs may be noiseless."""
    run = Run("bjw19-noisy")
    run.precision = prec.name
    threads = resolve_n_jobs(n_jobs)
    data = Samples.from_arrays(X, Y, comm=comm, n_jobs=threads)
    n, d, m = data.n, data.d, data.m
    k = check_n_hidden(n_hidden, d)
    n_sign = check_positive_int(n_sign, "n_sign")
    n_restarts = check_positive_int(n_restarts, "n_restarts")
    polish_steps = check_positive_int(polish_steps, "polish_steps", minimum=0)
    if exact_refine not in ("auto", True, False):
        raise ValueError(f"exact_refine must be 'auto', True or False; got {exact_refine!r}")
    if not (np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive number; got {tol!r}")
    in_memory = not (data.distributed or data.lazy)
    if polish_steps and not in_memory:
        raise ValueError(
            "polish_steps needs the samples in memory on one process; got "
            + ("an MPI communicator" if data.distributed else "dask arrays")
            + ": use polish_steps=0"
        )
    rng = check_random_state(random_state)
    if n < 2 * (d + 1):
        raise InsufficientSamples(f"bjw19-noisy needs at least 2 (d + 1) = {2 * (d + 1)} samples; got n = {n}")
    run.counts.update(n_samples=n, n_hidden=k)
    run.diag["backend"] = BACKEND
    if m < k:
        return run.result(
            Status.UNSUPPORTED, outputs_below_hidden_message("bjw19-noisy", m, k, "Thm 10 assumes U of rank k")
        )
    U, V, residual, margins, noise_ratio, sign_sample = _estimate(
        run, data, k, n_sign, n_restarts, polish_steps, rng, threads, block_size
    )
    noiseless = m > k and noise_ratio <= prec.tol(NOISE_FLOOR, d, k)
    small_noise = m > k and noise_ratio <= prec.tol(REFINE_NOISE_MAX, d, k)
    try_exact = exact_refine is True or (exact_refine == "auto" and (small_noise or m == k))
    refined = None
    if try_exact:
        exact, refined = _refine_exact(run, data, sign_sample, U, V, prec.tol(tol, d, k), prec, threads)
        if exact is not None:
            return exact
    else:
        run.diag["exact_refinement"] = "not run: " + ("disabled" if exact_refine is False else "the outputs look noisy")
    message = (
        f"approximate network (BJW19 Thm 10): relative residual {residual:.3e}, "
        f"smallest sign margin {margins.min():.3f}"
    )
    if refined is not None and refined.residual < residual:  # small noise: the refined network is closer
        message = (
            f"approximate network: the outputs are noisy (sigma_(k+1) / sigma_1 = {noise_ratio:.1e}), and the "
            f"activation-region refinement (relufast, beyond BJW19 Thm 10) of the Alg. 6 estimate reaches relative "
            f"residual {refined.residual:.3e} over {n} samples (Alg. 6 alone: {residual:.3e}), smallest sign "
            f"margin {margins.min():.3f}"
        )
        U, V, residual = refined.U, refined.V, refined.residual
    if noiseless and not try_exact:
        message += "; the outputs look noiseless: exact_refine=True may make the network exact"
    if margins.min() <= 0:
        warn(f"a sign of Alg. 6 is a guess (margin {margins.min():.3g} <= 0): use more samples (n_sign) or less noise")
    return run.result(Status.APPROXIMATE, message, U=U, V=V, residual=residual, warn_user=False)


def _estimate(run, data, k, n_sign, n_restarts, polish_steps, rng, threads, block_size):
    """Thm 10 steps 1-3: the tensor estimate of V up to signs (Alg. 4 with the second-order
    moment), the signs by Alg. 6 on ``min(n, n_sign)`` samples, U by least squares on all
    samples (Lemma 20) and the optional Gauss-Newton polish. Returns (U, V, residual,
    sign margins, noise ratio sigma_(k+1)/sigma_1 of the outputs, 0 when m = k, and the
    in-memory sign sample (X_s, Y_s))."""
    n, m = data.n, data.m
    seconds, diag = run.seconds, run.diag
    ell = min(n, n_sign)
    Xs, Ys = data.extend(SampleStream(n, rng), ell)
    _, sv, Q = output_basis(Ys, k)
    diag["output_singular_values"] = sv
    noise_ratio = float(sv[k] / sv[0]) if (m > k and sv[0] > 0) else 0.0
    diag["noise_ratio"] = noise_ratio

    t = time.perf_counter()
    W, P, _ = moment_span(data, None, k, None if m == k else Q, threads, block_size)
    best = None
    for _ in range(n_restarts):
        check_deadline("in a bjw19-noisy restart")
        cand, gap, fit = draw_candidates(P, W, rng)
        if best is None or fit < best[2]:
            best = (cand[:k], gap, fit)
    assert best is not None  # n_restarts >= 1 (validated)
    Vhat, gap, fit = best
    diag.update({"tensor_fit": fit, "jennrich_gap": gap})
    seconds["tensor"] = time.perf_counter() - t

    t = time.perf_counter()
    V, margins = sign_by_projection(Xs, Ys, Vhat)
    diag["sign_margins"] = margins
    seconds["signs"] = time.perf_counter() - t

    t = time.perf_counter()
    U, _ = fit_from_stats(certify(data, V))
    if polish_steps:
        U, V = polish(data.X, data.Y, U, V, n_iter=polish_steps)
    residual = residual_from_stats(certify(data, V, U))
    seconds["fit"] = time.perf_counter() - t
    run.counts.update(
        {"n_estimate": n, "n_certify": n, "n_sign": ell, "restarts": n_restarts, "polish_steps": polish_steps}
    )
    return U, V, residual, margins, noise_ratio, (Xs, Ys)


class _Refined(NamedTuple):
    U: np.ndarray
    V: np.ndarray
    residual: float


def _refined_noisy(data, sample, U, V, threads):
    """The activation-region refinement of the Alg. 6 estimate kept on noisy data
    (relufast): bias-free rounds on the sign sample, U by least squares with the residual
    over all samples. None when the refinement cannot run."""
    from ...stages.fit import fit_network
    from ...stages.refine import TooManyRegions, region_refine

    k = V.shape[0]
    try:
        rr = region_refine(
            sample[0], sample[1], V, np.zeros(k), U, None, bias=False, offset=False, n_jobs=threads or None
        )
        fit = fit_network(data, None, rr.V, subset=sample, threads=threads)
    except (np.linalg.LinAlgError, TooManyRegions, ValueError):
        return None
    if not (np.isfinite(fit.residual) and np.all(np.isfinite(fit.U)) and np.all(np.isfinite(rr.V))):
        return None
    return _Refined(fit.U, rr.V, float(fit.residual))


def _refine_exact(run, data, sample, U, V, tol, prec, threads):
    """Step 4 (relufast, beyond BJW19): the activation-region refinement from the
    Alg. 6 estimate on the in-memory ``sample`` (the sign test's), certified over all
    samples for the bias-free model (:func:`relufast.stages.fit.refine_to_exact`; memmaps,
    dask and MPI alike). Returns the ``exact`` result, or None (the data are noisy, or fit
    only a network with biases) after noting why, and the refined bias-free network when
    the refinement ran (its residual is the noise level on noisy data), else None."""
    with run.stage("exact_refine"):
        try:
            out = refine_to_exact(data, None, U, V, tol=tol, bias_free=True, subset=sample, threads=threads)
        except (np.linalg.LinAlgError, ValueError) as exc:  # e.g. more regions than max_regions
            run.diag["exact_refinement"] = f"not certified: the refinement stopped ({exc})"
            return None, None
    run.counts["refine_rounds"] = out.rounds
    if not out.exact:
        run.diag["exact_refinement"] = (
            f"ran {out.rounds} round(s): the outputs are exactly those of a network with hidden biases or an "
            "output offset, outside BJW19's model (use method='atv21')"
            if out.biased
            else f"the refinement reached residual {out.residual:.2e} > tol = {tol:.1e}: the outputs are noisy"
        )
        return None, (None if out.biased else _refined_noisy(data, sample, U, V, threads))
    U, V, residual = out.U, out.V, out.residual
    note = ""
    if not prec.is_double and not (data.distributed or data.lazy):
        with run.stage("polish"):
            U, V, _, _, residual = polish_at_precision(data.X, data.Y, U, V, threads=threads)
        note = f" (certified at {prec.name} precision, floor {prec.floor(data.d, V.shape[0]):.1e}; polished in float64)"
    run.diag["exact_refinement"] = f"certified after {out.rounds} round(s)"
    result = run.result(
        Status.EXACT,
        f"the outputs are noiseless: the activation-region refinement (relufast, beyond BJW19 "
        f"Thm 10) made the Alg. 6 estimate exact; relative residual {residual:.2e} over "
        f"{data.n} samples{note}",
        U=U,
        V=V,
        exact=True,
        residual=residual,
    )
    return result, None
