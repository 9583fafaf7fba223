"""GP19's pipeline for the lowest layer (:func:`lowest_layer`): Steps 1 and 2 and the result."""

from __future__ import annotations

import math

import numpy as np

from ..._blas import single_threaded_blas
from ..._protocol import recovery_method
from ..._result import Run, Status
from ..._validation import check_positive_int, check_random_state, resolve_n_jobs
from ...stages.hermite import gaussian_pdf
from ...stages.reduce import Samples, median
from .coefficients import (
    _DEGENERATE_RATIO,
    _KAPPA_WARN,
    _LANDSCAPE_GTOL,
    _STEP1_ACTIVATIONS,
    _TPM_TOL,
    _Unit,
    hermite_coeffs,
)
from .data import _BandData, _BandQueries, _Data
from .step1 import _landscape_one, _landscape_simultaneous, _step1_tpm, _whiten
from .step2 import estimate_tan_alpha, refine_estimate


def _draw_queries(f, n, n_queries, rng, chunk=100000):
    """Draw Gaussian queries, evaluate f, keep only rows off the constant c0 (P0/P1)."""
    Xs, fs, c0 = [], [], None
    done = 0
    while done < n_queries:
        m = min(chunk, n_queries - done)
        Xq = rng.standard_normal((m, n))
        fq = np.asarray(f(Xq), dtype=np.float64).reshape(-1)
        if fq.shape[0] != m or not np.isfinite(fq).all():
            raise ValueError(f"f must return {m} finite values for an array of shape ({m}, {n}); got shape {fq.shape}")
        if c0 is None:
            c0 = float(np.median(fq))
        keep = fq != c0
        Xs.append(Xq[keep])
        fs.append(fq[keep])
        done += m
    return np.ascontiguousarray(np.vstack(Xs)), np.ascontiguousarray(np.concatenate(fs)), c0


def _jobs(n_jobs):
    """Validated n_jobs in the accumulators' convention (None: all cores)."""
    resolve_n_jobs(n_jobs)
    return n_jobs


def _check_common(n_hidden, threshold, activation, allowed):
    if activation not in allowed:
        raise ValueError(f"activation must be one of {allowed}; got {activation!r}")
    if threshold is None:
        raise TypeError("threshold is required: GP19's threshold t is known (pass threshold=t)")
    t = float(threshold)
    if not np.isfinite(t):
        raise ValueError(f"threshold must be finite; got {threshold!r}")
    return t


def _prepare_data(X, y, f, n_features, n_queries, rng, n_jobs, comm):
    """Samples (validated on every rank) or queries (drawn); returns (_Data, input mode, n)."""
    if f is not None:
        if X is not None or y is not None:
            raise ValueError("pass either samples (X, y) or a callable f (query mode), not both")
        if not callable(f):
            raise TypeError(f"f must be callable (a teacher f(X) -> y); got {type(f).__name__}")
        if comm is not None:
            raise ValueError(
                "comm= splits samples over MPI ranks; query mode (f=) draws its own samples, so pass "
                "comm only with samples X, y"
            )
        n = check_positive_int(n_features, "n_features")
        nq = check_positive_int(n_queries, "n_queries")
        Xa, fa, c0 = _draw_queries(f, n, nq, rng)
        return _Data(Samples(Xa, fa[:, None]), c0, n_total=nq, n_jobs=n_jobs), "queries", n
    if X is None or y is None:
        raise TypeError("pass samples X and Y, or X=None, Y=None and a callable f (query mode)")
    samples = _samples(X, y, comm, n_jobs)
    return _Data(samples, median(samples), n_jobs=n_jobs), "samples", samples.d


def _samples(X, y, comm, n_jobs):
    """X, y as :class:`relufast.stages.reduce.Samples` with one output (checked on every rank)."""
    samples = Samples.from_arrays(X, y, comm=comm, n_jobs=resolve_n_jobs(n_jobs))
    if samples.m != 1:
        raise ValueError(f"y must have one output (shape (n,) or (n, 1)); got shape {tuple(samples.Y.shape)}")
    return samples


def _refusal(run, activation, t, u):
    """The result ``unsupported`` when u_4 or u_2 vanishes (before any optimisation), else None."""
    if abs(u[4]) <= _DEGENERATE_RATIO * abs(u[2]) or activation == "square":
        return run.result(
            Status.UNSUPPORTED,
            (
                f"the fourth Hermite coefficient of {activation}(a - t) vanishes at t = {t:g} "
                f"(u_4 = {u[4]:.3g}, u_2 = {u[2]:.3g}): GP19's Step 1 has no signal there "
                "(DegenerateHermite4: ReLU at t = 1, step at t = sqrt(3), sigmoid near t = 3.03, "
                "any u = a^2); use another threshold"
            ),
        )
    if abs(u[2]) < 1e-12:
        return run.result(
            Status.UNSUPPORTED,
            (
                f"the second Hermite coefficient of {activation}(a - t) vanishes at t = {t:g} "
                "(DegenerateHermite2): the whitening of Step 1 is undefined"
            ),
        )
    return None


def _whitening_step(run, data, k, u2, check_median, notes):
    """GP19 Step 1, preprocessing P2: M_2, its top-k eigenpairs and the warnings they raise.

    Returns the eigenvectors U (n, k), |eigenvalues| (k,) and M_2; appends the causes of
    concern (ThresholdTooLow, NonPositiveLinearTerms, IllConditioned, WrongHiddenWidth)
    to ``notes``.
    """
    with run.stage("whitening"):
        U, ev, info = _whiten(data, k, u2)
    M2 = info.pop("M2")
    run.diag.update(info)
    run.counts["n_active"] = int(round(info["active_fraction"] * data.N))
    if check_median and 1.0 - info["active_fraction"] < 0.5:
        notes.append(
            f"ThresholdTooLow: only {1 - info['active_fraction']:.2f} of the rows equal the median (needs >= 0.5)"
        )
    if not info["signs_ok"]:
        notes.append(
            "NonPositiveLinearTerms: the top eigenvalues of M_2 have mixed signs (or the hidden "
            "width is wrong); GP19 needs positive linear coefficients"
        )
    if info["kappa"] >= _KAPPA_WARN:
        notes.append(
            f"IllConditioned: kappa(T W) ~ {info['kappa']:.1f} >= {_KAPPA_WARN:g} from the top "
            "block of M_2; GP19 assumes kappa(W) = O(1) and Step 1 may fail"
        )
    if info["eigengap"] > 0.3:
        notes.append(
            f"WrongHiddenWidth or ThresholdTooLow: eigen-gap |ev_(k+1)| / |ev_k| = {info['eigengap']:.2f} > 0.3"
        )
    return U, ev, M2


def _step1(run, data, landscape, U, ev, M2, u, rng, opts, notes):
    """GP19 Step 1 (Sec. 2.1, App. B.1-B.4): unit rows of W up to sign, then their signs.

    ``landscape`` picks the whitened TPM (:func:`_step1_tpm`), the one-by-one G(z)
    (:func:`_landscape_one`) or the simultaneous G(B) of App. B.4
    (:func:`_landscape_simultaneous`); ``opts`` holds restarts, max_iter, tol, shift,
    kappa_lambda and gamma. The sign step is not in the paper (G is even in z):
    ``E[f H_3(w.x)] = u_3 sum_j c_j (w.w_j)^3`` fixes it.
    """
    k = U.shape[1]
    s4 = float(np.sign(u[4]))
    if landscape == "tpm":
        R, Q, iters = _step1_tpm(data, U, ev, s4, rng, opts["restarts"], opts["max_iter"], opts["tol"], opts["shift"])
        run.diag["c_hat_alt"] = u[4] / (u[2] ** 2 * Q)
    elif landscape == "one-by-one":
        R, iters = _landscape_one(
            data, U, M2, u[2], u[4], opts["kappa_lambda"], rng, opts["restarts"], opts["max_iter"], opts["tol"]
        )
    else:
        R, iters = _landscape_simultaneous(
            data, U, M2, u[2], u[4], opts["kappa_lambda"], opts["gamma"], rng, opts["max_iter"] * 10, opts["tol"]
        )
    run.counts["step1_passes"] = int(iters)
    norms = np.linalg.norm(R, axis=1)
    Vh = R / norms[:, None]
    run.diag["c_hat"] = norms**2 / u[2] if landscape == "tpm" else norms**2
    st = data.stats(Vh)
    margin = st["A3"] / (u[3] * run.diag["c_hat"]) if u[3] != 0 else np.full(k, np.nan)
    sign = np.where(np.sign(u[3] * st["A3"]) < 0, -1.0, 1.0)
    run.diag["sign_margin"] = np.abs(margin)
    ambiguous = np.abs(margin) < 0.25
    if np.any(ambiguous):
        notes.append(
            f"SignAmbiguous: rows {np.flatnonzero(ambiguous).tolist()} have a third-order sign margin below 0.25"
        )
    return Vh * sign[:, None]


def _band_oracle(run, data, mode, f, t, label_tol, band_queries, band_width, eps, notes):
    """The band oracle of Algorithm 2 (queries or samples) and Step 2's target angle.

    With samples the bands are wide enough for about 2000 rows each; band-averaged
    estimates do not resolve angles below ~0.4 band widths, and steps driven by them below
    that floor make rows worse, so Step 2 stops there (the returned eps).
    """
    if mode == "queries":
        width = 1e-3 if band_width is None else float(band_width)
        return _BandQueries(f, data.c0, label_tol, check_positive_int(band_queries, "band_queries"), width), eps
    width = band_width if band_width is not None else float(np.clip(2000.0 / (data.N * gaussian_pdf(t)), 1e-3, 0.25))
    oracle = _BandData(data.samples, data.c0, label_tol, width, 200, t)
    run.diag["band_width"] = width
    if 0.5 * width > eps:
        notes.append(
            f"Step 2 stops at {0.5 * width:.3g} rad, not eps = {eps:g}: the bands of "
            f"EstimateTanAlpha are {width:.3g} wide with {data.N} samples (more samples or "
            "query mode resolve smaller angles)"
        )
        eps = 0.5 * width
    return oracle, eps


def _step2(run, oracle, Vh, t, rng, refine, eps, max_refine_iter, notes):
    """GP19 Step 2 (Sec. 2.2): Algorithm 1 (RefineEstimate) or the Stein update per row.

    Updates the rows of Vh in place and returns the angle estimates of Algorithm 2
    (EstimateTanAlpha) per row (NaN where its bisection bracket failed).
    """
    k = len(Vh)
    angle = np.full(k, np.nan)
    history = []
    with run.stage("step2"):
        for i in range(k):
            if refine is None:
                ta = estimate_tan_alpha(oracle, Vh[i], t, rng)[0]
                history.append({"iterations": 0, "accepted": 0})
            else:
                z, ta, h = refine_estimate(
                    oracle,
                    Vh[i],
                    t,
                    rng,
                    eps=eps,
                    max_iter=max_refine_iter,
                    method=refine,
                    stein_width=oracle.eps,
                )
                Vh[i] = z
                history.append(h)
            angle[i] = math.atan(ta) if np.isfinite(ta) else np.nan
    run.diag["refine"] = history
    run.counts["refine_iterations"] = int(sum(h["iterations"] for h in history))
    run.diag["band_rows"] = int(np.median(oracle.counts)) if oracle.counts else 0
    if np.any(~np.isfinite(angle)):
        notes.append(
            f"BisectionBracketFailed for rows {np.flatnonzero(~np.isfinite(angle)).tolist()}: "
            "no angle estimate (a row is near no unit, or t is too low)"
        )
    return angle


def _lowest_layer_result(run, data, mode, Vh, angle, t, activation, landscape, refine, eps, negate, notes):
    """The network ``f_lin = c_0 + sum_i c_i u(w_i . x - t)`` and the message of GP19 Sec. 2."""
    k = len(Vh)
    c_hat = np.asarray(run.diag["c_hat"], dtype=np.float64).reshape(1, k)
    if negate:
        # g = 1 - f ~ 1 - c0 - sum_i c_i step(-(w_i . x + t)), with w_i = -v_i.
        Vh = -Vh
        net = dict(U=-c_hat, b=np.full(k, t), c=np.array([1.0 - data.c0]), activation=_Unit(activation, True))
    else:
        net = dict(
            U=c_hat,
            b=np.full(k, -t),
            c=np.array([data.c0]),
            activation=None if activation == "relu" else _Unit(activation),
        )
    steps = f"Step 1 ({landscape})"
    if refine is not None and activation in ("relu", "step"):
        steps += f" + Step 2 ({refine}, eps = {eps:g})"
    finite = np.isfinite(angle)
    msg = f"GP19 {steps} on {data.N} {mode}: " + (
        f"estimated angle per row in diagnostics['angle_estimate'], max {np.max(angle[finite]):.3g} rad"
        if finite.any()
        else "no angle estimate (EstimateTanAlpha needs ReLU or step)"
    )
    if notes:
        msg += "; " + "; ".join(notes)
    run.diag["notes"] = notes
    return run.result(Status.APPROXIMATE, msg, V=Vh, **net)


@recovery_method("gp19", units_free=False)
def lowest_layer(
    X,
    Y,
    n_hidden,
    *,
    threshold=None,
    activation="relu",
    landscape="tpm",
    refine="paper",
    eps=0.02,
    max_refine_iter=200,
    f=None,
    n_features=None,
    n_queries=1_000_000,
    band_queries=20000,
    band_width=None,
    restarts=5,
    max_iter=100,
    tol=None,
    shift=0.0,
    kappa_lambda=4.0,
    gamma=0.01,
    label_tol=0.0,
    random_state=None,
    n_jobs=None,
    comm=None,
    _negate=False,
):
    """Recover W of ``f(x) = P(u(W x - t))`` from Gaussian samples or queries (GP19 Sec. 2).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features) or None
        Standard Gaussian inputs (None in query mode).
    Y : array-like of shape (n_samples,) or (n_samples, 1) or None
        Outputs f(X) (None in query mode).
    n_hidden : int
        Hidden width d (rows of W).
    threshold : float
        The common threshold t (known, as in the paper).
    activation : {"relu", "step", "sigmoid"}, default="relu"
        ``"square"`` (an even u) is accepted only to be refused: its u_4 vanishes.
    landscape : {"tpm", "one-by-one", "simultaneous"}, default="tpm"
        Step 1: the whitened fourth-order tensor power method (the change of variables of
        Claim 1's proof: its fixed points are the minimisers of the landscape G), the paper's
        one-by-one landscape G(z) (Sec. 2.1) with deflation, or the simultaneous G(B) of
        App. B.4 with the corrected psi.
    refine : {"paper", "stein", None}, default="paper"
        Step 2: "paper" is Algorithm 1 (RefineEstimate) with Algorithm 2 (EstimateTanAlpha);
        "stein" is NOT from the paper: a Stein-direction update, about 10x per step (see
        :func:`refine_estimate`); None skips Step 2. ReLU and step only (Step 2 needs
        ``sgn(f - c0)`` to be the OR of the units).
    eps : float, default=0.02
        Target angle of Step 2 (the paper's epsilon_2, radians).
    max_refine_iter : int, default=200
        Iterations of Step 2 per row.
    f : callable, optional
        Query mode: a teacher ``f(X) -> y`` on arrays of shape (m, n_features); the method
        then draws ``n_queries`` Gaussian queries for Step 1 (keeping only rows off the
        constant) and ``band_queries`` per EstimateTanAlpha call in Step 2 (oracle mode).
        Reached as ``relufast.recover(None, None, n_hidden=k, method="gp19", f=teacher,
        n_features=n, threshold=t)``.
    n_features : int, optional
        Input dimension (query mode).
    n_queries : int, default=1_000_000
        Gaussian queries for Step 1 (query mode).
    band_queries : int, default=20000
        Queries per EstimateTanAlpha call (query mode).
    band_width : float, optional
        Width epsilon of the bands of Algorithm 2. Default: 1e-3 in query mode; with samples,
        wide enough for about 2000 rows per band (at most 0.25). Angles below ~0.4 band_width
        are not resolved, so with samples Step 2 stops at ``max(eps, band_width / 2)`` (the
        row count per band is in ``diagnostics["band_rows"]``).
    restarts, max_iter, tol, shift
        Step 1 restarts per row, iterations, convergence tolerance and SS-HOPM shift.
        ``tol`` (default None): for "tpm" the largest ``1 - |cos|`` between iterates,
        default ``_TPM_TOL`` = 1e-24 (a move below 1.4e-12, near the fixed point: looser
        stops leave the rows on paths that differ by rounding between one process, ranks and
        dask blocks, up to 1e-8 at d = 10; see docs/gp19.md); for the landscapes L-BFGS's
        ``gtol``, default 1e-10.
    kappa_lambda : float, default=4.0
        lambda / (|u_4| / u_2^2) of the landscapes (normalised form; must exceed 2 / c_min).
    gamma : float, default=0.01
        gamma of the simultaneous landscape (Thm 11: a small constant).
    label_tol : float, default=0.0
        Step 2 counts a query as active when ``f > c0 + label_tol`` (label noise).
    random_state : None, int or numpy Generator
    n_jobs : int or None
        Threads of the moment kernel.
    comm : mpi4py communicator, optional
        Each rank passes its own samples; every pass over the data (the median c0, the
        contractions of Step 1, the bands of Step 2) is reduced over the ranks, and every
        rank returns the same result, that of one process on the concatenated samples (up
        to rounding). X and y may also be NumPy memmaps or dask arrays (read block by
        block). Not with ``f=`` (query mode draws its own samples).

    Returns
    -------
    RecoveryResult
        ``V`` (n_hidden, n_features) unit rows with signs resolved (Step 1's sign is fixed by
        ``sgn(u_3 E[ft He_3(w.x)])``, not in the paper); ``U`` (1, n_hidden) the estimated
        linear coefficients c_i, ``b = -t``, ``c = [c_0]`` (the median), so ``predict`` is the
        one-hidden-layer part ``f_lin = c_0 + sum_i c_i u(w_i . x - t)`` (P's higher terms are
        not recovered; the c_i carry Step 1's scale bias, see docs/gp19.md); status ``approximate``
        with ``diagnostics["angle_estimate"]`` (per row, from EstimateTanAlpha),
        ``c_hat``, ``sign_margin``, eigenvalues of M_2, ``kappa`` and the active fraction;
        ``unsupported`` (before any optimisation) when u_4 vanishes (ReLU t = 1, step
        t = sqrt(3), sigmoid t ~ 3.03, u = a^2) or u_2 vanishes.

    Notes
    -----
    Step 1 streams the fourth-order statistic through the C++ kernel of
    :class:`relufast.stages.moments.Hermite4Accumulator`, contracting it with the current
    directions (never a d^4 tensor), on active rows only. Each iteration of Step 1 costs
    O(N_act n restarts). Step 2 costs two EstimateTanAlpha calls per iteration (about 60
    probes each); GP19's Theorem 5 gives O(n log(1/eps)) iterations, measured ~20 n per
    halving of the angle.
    """
    run = Run("gp19-halfspaces" if _negate else "gp19")
    k = check_positive_int(n_hidden, "n_hidden")
    restarts = check_positive_int(restarts, "restarts")
    t = _check_common(k, threshold, activation, _STEP1_ACTIVATIONS)
    if landscape not in ("tpm", "one-by-one", "simultaneous"):
        raise ValueError(f"landscape must be 'tpm', 'one-by-one' or 'simultaneous'; got {landscape!r}")
    if refine not in ("paper", "stein", None):
        raise ValueError(f"refine must be 'paper', 'stein' or None; got {refine!r}")
    if not (np.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a positive angle in radians; got {eps!r}")
    rng = check_random_state(random_state)
    u = hermite_coeffs(activation, t, 4)
    run.diag["u_hat"] = u.copy()
    # Refusal before any optimisation (data validated first, so caller errors still raise).
    with run.stage("data"):
        data, mode, n = _prepare_data(X, Y, f, n_features, n_queries, rng, _jobs(n_jobs), comm)
    run.counts.update(n_samples=data.N, n_active=data.samples.n if mode == "queries" else -1)
    if k > n:
        raise ValueError(f"n_hidden must be <= n_features; got n_hidden={k}, n_features={n}")
    refused = _refusal(run, activation, t, u)
    if refused is not None:
        return refused
    notes: list[str] = []
    if tol is None:
        tol = _TPM_TOL if landscape == "tpm" else _LANDSCAPE_GTOL
    opts = dict(restarts=restarts, max_iter=max_iter, tol=tol, shift=shift, kappa_lambda=kappa_lambda, gamma=gamma)
    with single_threaded_blas():
        check_median = mode == "samples" and activation in ("relu", "step")
        U, ev, M2 = _whitening_step(run, data, k, u[2], check_median, notes)
        with run.stage("step1"):
            Vh = _step1(run, data, landscape, U, ev, M2, u, rng, opts, notes)
        run.diag["V_step1"] = -Vh if _negate else Vh.copy()
        angle = np.full(k, np.nan)
        if activation in ("relu", "step"):
            oracle, eps = _band_oracle(run, data, mode, f, t, label_tol, band_queries, band_width, eps, notes)
            angle = _step2(run, oracle, Vh, t, rng, refine, eps, max_refine_iter, notes)
        elif refine is not None:
            notes.append(f"Step 2 skipped: RefineEstimate needs a ReLU or step activation, not {activation}")
        run.diag["angle_estimate"] = angle
    return _lowest_layer_result(run, data, mode, Vh, angle, t, activation, landscape, refine, eps, _negate, notes)
