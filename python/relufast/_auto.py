"""``method="auto"``: the facts of the data, the plan of methods in order of cost, the
attempts within a time budget and the choice of the best result."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from ._causes import AUTO_CHECK_ROWS, MEAN_Z_LIMIT, _mean_statistic
from ._deadline import check_time_limit
from ._protocol import _Outputs, check_options, settle
from ._result import (
    Run,
    Status,
    warn,
)
from ._units import rescale
from ._validation import InsufficientSamples
from .algorithms import gklw19
from .methods import METHODS, run_method

#: Default wall-time budget (seconds) of ``auto``'s enumeration stage (``time_limit=``).
AUTO_TIME_LIMIT = 60.0
#: ``auto`` runs gklw19 only while its detector has at most this many rows (d (d + 1) / 2):
#: the streaming covariance costs O(n d^4).
GKLW19_MAX_FEATURES = 2000
#: Symmetry statistic above which inputs do not look symmetric (gklw19 warns at the same level).
SYMMETRY_LIMIT = 6.0

#: Order of preference of statuses (best first); ties go to the smaller residual.
_PREFERENCE = (
    Status.EXACT,
    Status.NON_IDENTIFIABLE,
    Status.APPROXIMATE,
    Status.FAILED,
    Status.RANK_DEFICIENT,
    Status.INSUFFICIENT_SAMPLES,
    Status.UNSUPPORTED,
)


def _rank_key(res):
    """Order of ``auto``'s attempts (smaller is better): exact, then a non-identifiable fit,
    then every estimate with finite parameters ranked by what it explains (its relative
    residual; an ``approximate`` status wins only a tie), then results without a usable
    fit in the order of :data:`_PREFERENCE`."""
    s = res.status
    has = res.U is not None and res.V is not None and res.has_finite_parameters
    r = res.residual if np.isfinite(res.residual) else np.inf
    if s == Status.EXACT:
        return (0.0, r, 0)
    if s == Status.NON_IDENTIFIABLE and has:
        return (1.0, r, 0)
    if has and s in (Status.APPROXIMATE, Status.FAILED) and r < 1.0:
        return (2.0, r, 0 if s == Status.APPROXIMATE else 1)
    pos = float(_PREFERENCE.index(s) if s in _PREFERENCE else len(_PREFERENCE)) + 1.0
    if s in (Status.NON_IDENTIFIABLE, Status.APPROXIMATE) and not has:
        pos = _PREFERENCE.index(Status.FAILED) + 1.5
    if has and not r < 1.0:  # a fit that explains no more than Y = 0 does
        pos = len(_PREFERENCE) + 0.5
    return (pos, r, 1)


def _why_chosen(name, best, results):
    """Why ``auto`` returned ``best`` among its attempts (a sentence for ``diagnostics["auto"]``)."""
    key = _rank_key(best)
    if key[0] != 2.0 or len(results) < 2:
        return ""
    others = [f"{n} {r.status.value} {r.residual:.2g}" for n, r in results if r is not best]
    return (
        f"; no attempt was exact, so the attempts are ranked by the relative residual they leave: "
        f"{name} {best.status.value} {best.residual:.2g} against " + ", ".join(others)
    )


def _choose(X, Y, n_hidden):
    """The methods ``auto`` would try, in order (a name, or a tuple of names), and why."""
    plan = _auto(X, Y, n_hidden, {}, plan_only=True)
    names = tuple(name for name, _ in plan)
    return (names[0] if len(names) == 1 else names), "; ".join(reason for _, reason in plan)


def _auto(X, Y, n_hidden, options, *, plan_only=False):
    """``method="auto"``: the certified methods in order of cost, best status wins.

    Five steps: check the options (:func:`_auto_options`), look at the data
    (:func:`_auto_facts`), plan the methods (:func:`_auto_plan`), try them in order
    (:func:`_auto_try`) and return the best result (:func:`_auto_best`). With ``comm=`` or
    dask arrays the facts come from the same first rows one process would look at,
    gathered on every rank, so every rank plans and chooses the same methods; each method
    then runs on the caller's samples with the same ``comm``.
    """
    t0 = time.perf_counter()
    options, budget = _auto_options(options)
    options = _with_precision(Y, options)
    k, facts, law, data = _auto_facts(X, Y, n_hidden, options.get("comm"), budget, options.get("precision"))
    plan = _auto_plan(facts, law, distributed=data.distributed or data.lazy)
    if plan_only:
        return plan
    if not (data.distributed or data.lazy):
        X, Y = data.X, data.Y  # validated float64 arrays
    attempts, results, errors = _auto_try(plan, X, Y, k, options, budget, t0, data)
    return _auto_best(attempts, results, errors, facts)


def _with_precision(Y, options):
    """Options with the precision of the caller's outputs made explicit: ``auto`` converts
    the data to float64 once, and every method it runs must still certify float32 outputs
    at their precision (their thresholds and messages follow ``precision``)."""
    from .stages.precision import resolve_precision

    if options.get("precision") is not None:
        return options
    prec = resolve_precision(Y)
    return options if prec.is_double else dict(options, precision=prec.name)


def _auto_options(options):
    """The options of ``auto``: its budget ``time_limit`` and the options of its methods,
    with the shared ones (n_jobs, random_state, tol) checked before any method runs."""
    from ._validation import check_random_state, resolve_n_jobs

    options = dict(options)
    budget = check_time_limit(options.pop("time_limit", None))
    budget = AUTO_TIME_LIMIT if budget is None else budget
    known = sorted({o for spec in METHODS.values() for o in spec.options} - {"time_limit"})
    check_options("auto", known + ["time_limit"], options, listing="the options of its methods are")
    resolve_n_jobs(options.get("n_jobs"))
    check_random_state(options.get("random_state"))
    tol = options.get("tol", 1e-10)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not (np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive number; got {tol!r}")
    return options, budget


def _auto_probe(X, Y, comm):
    """The samples (a :class:`relufast.stages.reduce.Samples`) and the probe ``auto`` looks
    at: the first :data:`AUTO_CHECK_ROWS` rows of the concatenated data, in memory and
    identical on every rank (gathered for MPI ranks and dask arrays), so every rank takes
    the decisions one process would take on the concatenated data."""
    from ._validation import check_xy
    from .stages.reduce import Samples, is_dask

    if comm is None and not (is_dask(X) or is_dask(Y)):
        Xc, Yc = check_xy(X, Y)
        return Samples(Xc, Yc), Xc[:AUTO_CHECK_ROWS], Yc[:AUTO_CHECK_ROWS]
    data = Samples.from_arrays(X, Y, comm=comm)
    Xh, Yh = data.take(np.arange(min(data.n, AUTO_CHECK_ROWS)))
    bad = int(np.count_nonzero(~np.isfinite(Xh)) + np.count_nonzero(~np.isfinite(Yh)))
    if bad:  # dask arrays are checked lazily: the probe (the same rows on every rank) is read now
        raise ValueError(f"X and Y must contain only finite values; found {bad} NaN or infinite entries")
    return data, Xh, Yh


def _auto_facts(X, Y, n_hidden, comm, budget, precision=None):
    """The cheap facts ``auto`` decides on (rank of Y, Gaussianity, centring, symmetry,
    biases), from the probe of :func:`_auto_probe`. Returns (k, facts, law, samples)."""
    from ._validation import check_positive_int
    from .stages.diagnostics import (
        RANK_FLOOR,
        RANK_TOL,
        gaussianity,
        numerical_rank,
        output_singular_values,
        whitener,
    )
    from .stages.precision import resolve_precision

    k = check_positive_int(n_hidden, "n_hidden")
    data, Xh, Yh = _auto_probe(X, Y, comm)
    n, d, m = data.n, data.d, data.m
    if n < 2:
        raise ValueError(f"X and Y must hold at least 2 samples (rows); got n = {n}")
    Xh_s, Yh_s, _, _ = rescale(Xh, Yh, {})
    Xh_s, Yh_s = np.asarray(Xh_s, dtype=np.float64), np.asarray(Yh_s, dtype=np.float64)
    prec = resolve_precision(None, precision)
    rank = numerical_rank(np.linalg.svd(Yh_s[:2000], compute_uv=False), prec.tol(RANK_TOL, d, k))
    rank_floor = rank
    if rank < min(k, m):  # rank(Y) < k only if every sample says so (a unit may be weak or rare)
        sv = output_singular_values(data)
        rank = numerical_rank(sv, prec.tol(RANK_TOL, d, k))
        rank_floor = numerical_rank(sv, prec.tol(RANK_FLOOR, d, k))
    mean_z, mean_rel = _mean_statistic(Xh_s) if len(Xh_s) > 2 else (0.0, 0.0)
    centred = not (mean_z > MEAN_Z_LIMIT and mean_rel > 0.05)
    g = gaussianity(Xh_s)
    gaussian = g["gaussian_ok"] and centred
    gaussian_sigma = False
    if not g["gaussian_ok"] and centred:
        W, _ = whitener(Xh_s)
        gaussian_sigma = W is not None and gaussianity(Xh_s, W)["gaussian_ok"]
    Zh = Xh_s if gaussian else _affine_whitened(Xh_s)  # atv21 whitens any mean and covariance
    gaussian_affine = Zh is not None and (gaussian or gaussianity(Zh)["gaussian_ok"])
    facts = {
        "n": n,
        "d": d,
        "m": m,
        "k": k,
        "rank_Y": rank,
        "rank_Y_floor": rank_floor,
        "standard_gaussian": gaussian,
        "gaussian_other_covariance": gaussian_sigma,
        "gaussian_any_mean_covariance": gaussian_affine,
        "centred": centred,
        "largest_mean_over_sd": mean_rel,
        "symmetry_statistic": gklw19.symmetry_statistic(Xh_s),
        "time_limit": float(budget),
        "biased": False,
        "precision": prec.name,
    }
    if data.distributed:
        facts["ranks"] = int(comm.Get_size())
    if gaussian_affine and k <= d and "atv21" in METHODS:
        from .stages.diagnostics import bias_evidence

        bias = bias_evidence(Zh, Yh_s)  # a mean of X acts as hidden biases: atv21's model
        facts["biased"] = bool(bias["biased"])
        facts["bias_statistic"] = float(np.max(np.abs(bias["z"])))
    if gaussian:
        law = "X looks standard Gaussian"
    elif gaussian_sigma:
        law = "X looks Gaussian with a non-identity covariance (whitened, BJW19 Remark 3)"
    elif not centred:
        law = f"X is not centred (largest |mean| / sd = {mean_rel:.2f}; the methods assume centred inputs)"
        if gaussian_affine:
            law += "; it looks Gaussian about its mean (atv21 whitens it)"
    elif gaussian_affine:
        law = "X looks Gaussian with a non-identity covariance (whitened)"
    else:
        law = "X does not look Gaussian"
    return k, facts, law, data


def _affine_whitened(X):
    """(X - mean) Sigma^-1/2 of the probe, or None when its covariance is singular: the
    inputs atv21 sees after :func:`relufast._units.whiten_inputs`."""
    if len(X) < 2 * (X.shape[1] + 1):
        return None
    C = np.cov(X, rowvar=False, bias=True).reshape(X.shape[1], X.shape[1])
    w, E = np.linalg.eigh(C)
    if not (w[0] > 1e-10 * w[-1] and w[-1] > 0):
        return None
    return (X - X.mean(axis=0)) @ ((E / np.sqrt(w)) @ E.T)


def _auto_plan(facts, law, *, distributed=False):
    """The methods to try, in order of cost, each with the reason (see :func:`recover`).

    ``distributed`` (MPI ranks or dask arrays): only the methods that take ``comm`` (and
    therefore read their samples through :class:`relufast.stages.reduce.Samples`)."""
    from ._validation import check_n_hidden

    n, d, m, k, rank = facts["n"], facts["d"], facts["m"], facts["k"], facts["rank_Y"]
    # rank(Y) < k is claimed only at the rounding floor over every sample: between it and
    # RANK_TOL a unit is weak or rarely active, which atv21 handles and Alg. 7 does not.
    full = facts.get("rank_Y_floor", rank)
    gaussian, biased, sym = facts["standard_gaussian"], facts["biased"], facts["symmetry_statistic"]
    budget = facts["time_limit"]
    plan = []
    if biased:
        why = f"|z| = {facts['bias_statistic']:.1f} > 6"
        plan.append(
            ("atv21", f"{law}, and the outputs have an offset or hidden biases (bias statistic {why}): ATV21's model")
        )
    if k <= d and m >= k and not biased:
        plan.append(
            (
                "bjw19-gaussian",
                f"{law}; tried first whatever X is (a certified row is exact for any input law), cost O(n k d^2)",
            )
        )
    if k <= d and full < k and m >= 2:
        why = (
            f"m = {m} < k = {k} outputs: U has rank below k, which Alg. 7 handles"
            if m < k
            else f"rank(Y) = {full} < k = {k} over all samples: rank-deficient U needs Alg. 7"
        )
        plan.append(("bjw19-fpt", why))
    any_gaussian = gaussian or facts.get("gaussian_any_mean_covariance", False)
    if any_gaussian and k <= d and m < k and not biased and "atv21" in METHODS:
        plan.append(
            (
                "atv21",
                f"{law} and m = {m} < k = {k}: ATV21 handles any number of outputs "
                "(after bjw19-fpt, which is exact from fewer samples when it applies)",
            )
        )
    if any_gaussian and k <= d and full >= k and "atv21" in METHODS and not any(n == "atv21" for n, _ in plan):
        plan.append(
            (
                "atv21",
                f"{law}: ATV21's model (hidden biases, an offset, any mean and covariance) in case "
                "the bias-free methods before it are not exact",
            )
        )
    n_feat = d * (d + 1) // 2
    # GKLW19 needs A of full column rank.
    if k <= d and m >= k and full >= k and sym <= SYMMETRY_LIMIT and n > n_feat and n_feat <= GKLW19_MAX_FEATURES:
        plan.append(("gklw19", f"X looks symmetric (statistic {sym:.1f} <= {SYMMETRY_LIMIT})"))
    if rank == k and n >= k:
        plan.append(
            (
                "bjw19-enumeration",
                f"rank(Y) = k = {k}: Thm 1 holds for any X (time budget {budget:g} s, on a subsample first)",
            )
        )
    if distributed:
        plan = [(name, why) for name, why in plan if METHODS[name].takes_comm]
    if not any(name == "bjw19-enumeration" for name, _ in plan):
        check_n_hidden(k, d)  # only Thm 1 (rank(Y) = k) allows k > d
    return plan


def _auto_try(plan, X, Y, k, options, budget, t0, data):
    """Run the planned methods in order until one is exact; returns (attempts, results,
    errors). A method that refuses the data (ValueError, TypeError) is recorded and skipped."""
    attempts, results, errors = [], [], []
    for name, reason in plan:
        opts = {o: v for o, v in options.items() if o in METHODS[name].options}
        t = time.perf_counter()
        entry = {"method": name, "note": reason}
        try:
            if name == "bjw19-enumeration":
                res = _auto_enumeration(X, Y, k, opts, budget - (t - t0), data)
            else:
                res = run_method(name, X, Y, k, opts, quiet=True)
        except (ValueError, TypeError) as exc:  # the method refuses these data: recorded, next one
            entry.update(seconds=time.perf_counter() - t, status="refused", residual=float("nan"), message=str(exc))
            attempts.append(entry)
            errors.append(exc)
            continue
        entry.update(seconds=time.perf_counter() - t, status=res.status.value, residual=float(res.residual))
        entry["message"] = res.message
        attempts.append(entry)
        results.append((name, res))
        if res.status == Status.EXACT:
            break
    return attempts, results, errors


def _auto_best(attempts, results, errors, facts):
    """The best result (status preference, then residual), with every attempt and the facts
    in its diagnostics; raises the first refusal when every method refused the data."""
    if not results and errors and all(isinstance(e, InsufficientSamples) for e in errors):
        # Degenerate data, not bad input: a status and a warning, not an exception.
        run = Run("auto")
        run.diag.update(auto_attempts=tuple(attempts), auto_facts=facts, auto="too few samples for every method")
        res = run.result(
            Status.INSUFFICIENT_SAMPLES,
            f"auto: too few samples ({facts['n']}) for every applicable method: " + "; ".join(str(e) for e in errors),
        )
        warn(res.message)
        return res
    if not results and errors:
        raise errors[0]  # every applicable method refused these data: the first refusal says why
    if not results:
        run = Run("auto")
        run.diag.update(auto_attempts=tuple(attempts), auto_facts=facts, auto="no method could run on these data")
        why = "; ".join(f"{a['method']}: {a['message']}" for a in attempts) or (
            f"no method applies (k = {facts['k']}, d = {facts['d']}, m = {facts['m']}, rank(Y) = {facts['rank_Y']})"
        )
        return run.result(Status.UNSUPPORTED, f"auto: no method could run: {why}")
    name, best = min(results, key=lambda nr: _rank_key(nr[1]))
    diag = dict(best.diagnostics)
    diag["auto_attempts"] = tuple(attempts)
    diag["auto_facts"] = facts
    reason = next(a["note"] for a in attempts if a["method"] == name)
    why = _why_chosen(name, best, results)
    diag["auto"] = f"chose {name}: {reason}" + why
    tried = ", ".join(f"{a['method']} -> {a['status']}" for a in attempts)
    message = best.message if len(attempts) == 1 else f"{best.message} [auto tried: {tried}{why}]"
    best = dataclasses.replace(best, diagnostics=diag, message=message)
    if best.status != Status.EXACT:
        warn(best.message)
    return best


def _auto_enumeration(X, Y, k, opts, budget, data):
    """Enumeration on a subsample first (cheap, C(n, k-1) grows fast), certified on all samples;
    then, if time is left and the subsample did not settle it, on all samples.

    The subsample (the same rows on every rank) is gathered from MPI ranks or dask blocks;
    with ``comm`` each rank passes its share of it, so the enumeration splits its patterns
    across the ranks, and the certificate is a reduction over every rank's samples."""
    if budget <= 0:
        raise ValueError("no time left in auto's budget for bjw19-enumeration")
    n, d = data.n, data.d
    n_sub = min(n, max(4 * d, 20 * k, 200))
    opts = dict(opts)
    opts.setdefault("progress", False)
    t = time.perf_counter()
    if n_sub < n:
        idx = np.sort(np.random.default_rng(0).choice(n, size=n_sub, replace=False))
        Xsub, Ysub = _auto_subsample(X, Y, idx, data)
        small = run_method("bjw19-enumeration", Xsub, Ysub, k, dict(opts, time_limit=budget / 2), quiet=True)
        if (
            small.V is not None
            and small.has_finite_parameters
            and small.status in (Status.EXACT, Status.NON_IDENTIFIABLE)
        ):
            res = _auto_certify_subsample(X, Y, small, idx, data, opts.get("tol", 1e-10), opts.get("precision"))
            if res is not None:
                return res
        if budget - (time.perf_counter() - t) <= 0:
            return small
    return run_method(
        "bjw19-enumeration", X, Y, k, dict(opts, time_limit=budget - (time.perf_counter() - t)), quiet=True
    )


def _auto_subsample(X, Y, idx, data):
    """Rows ``idx`` of the concatenated samples: this rank's share of them with ``comm``
    (rank order, so the enumeration gathers them back in the same order), all of them
    otherwise."""
    if not (data.distributed or data.lazy):
        return X[idx], Y[idx]
    Xs, Ys = data.take(idx)
    if not data.distributed:
        return Xs, Ys
    share = np.array_split(np.arange(len(idx)), int(data.comm.Get_size()))[data.rank]
    return Xs[share], Ys[share]


def _auto_certify_subsample(X, Y, small, idx, data, tol, precision=None):
    """The subsample's rows (found on rows ``idx``) certified on all samples (at the
    outputs' precision): an exact result, or None."""
    from .stages.fit import fit_and_certify, fit_network
    from .stages.precision import resolve_precision

    prec = resolve_precision(None, precision)
    tol64, tol = tol, prec.tol(tol, data.d, small.V.shape[0])

    n_sub = len(idx)
    if data.distributed or data.lazy:  # U on the gathered subsample, residual as a reduction
        fit = fit_network(data, None, small.V, subset=data.take(idx))
        U, residual, ex, ey = fit.U, fit.residual, 0, 0
    else:  # rescaled like every method's input
        Xs, Ys, _, (ex, ey, _p) = rescale(X, Y, {})
        U, residual, _ = fit_and_certify(np.asarray(Xs), np.asarray(Ys), small.V)
    if not (np.isfinite(residual) and residual <= tol):
        return None
    run = Run("bjw19-enumeration")
    run.precision = prec.name
    run.diag.update(small.diagnostics)
    run.diag["subsample"] = n_sub
    res = run.result(
        Status.EXACT,
        f"rows found by Thm 1 on {n_sub} of {data.n} samples; the fit over "
        f"all {data.n} samples has relative residual {residual:.2e}",
        U=U * 2.0 ** (ey - ex),
        V=small.V,
        exact=True,
        residual=residual,
        warn_user=False,
    )
    # The same checks as every method's result, on every sample wherever it lives: the
    # input null space (a subsample's rows are free along it too), undetermined units.
    return settle(
        "bjw19-enumeration", res, data, _Outputs(data), {"tol": tol64, "precision": precision}, span_checked=False
    )


#: Queries (the first ones) on which ``extract``'s ``method="auto"`` looks for biases.
AUTO_PROBE = 20000


def query_plan(X, Y, k):
    """The methods ``extract(method="auto")`` tries on Gaussian queries, in order: atv21 alone
    when m < k or when the first queries show biases or an offset (atv21 also fits bias-free
    networks, so a wrong call costs time, never the certificate); atv21 first at size
    (m >= k >= 20 and d >= 40, where it takes bjw19-gaussian's own route on the affine lift
    and costs the same, while bjw19-gaussian spends seconds before it gives up on biases
    too small for the first queries to show: 4.2 s at 40-20-20 with biases of 0.1);
    else bjw19-gaussian, then atv21."""
    from .algorithms.atv21 import at_size
    from .stages.diagnostics import bias_evidence

    head = slice(0, min(len(X), AUTO_PROBE))
    if Y.shape[1] < k or bias_evidence(X[head], Y[head])["biased"]:
        return ["atv21"]
    if at_size.applies(X.shape[1], k, Y.shape[1], True, None):
        return ["atv21", "bjw19-gaussian"]
    return ["bjw19-gaussian", "atv21"]
