"""BJW19 Theorem 1: exact recovery for any input when rank(Y) = k.

Lemma 1 (candidate sign patterns, C++ enumeration in the patterns stage), Algorithm 1
(Iterative LP on HiGHS, :func:`iterative_lp`) and Algorithm 2 (ExactNeuralNet), with the
exact support solve where |S| >= d.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..._blas import single_threaded_blas
from ..._result import Run, Status, recovery_method
from ..._validation import check_positive_int, check_problem, check_random_state, resolve_n_jobs
from ...activations import RELU
from ...stages.diagnostics import RANK_TOL, input_null_space, numerical_rank
from ...stages.fit import fit_and_certify, minimum_norm_rows, relative_residual, undetermined_directions
from ...stages.highs import INF, LPSession
from ...stages.patterns import PatternStream
from ...stages.precision import polish_at_precision, resolve_precision

__all__ = ["enumeration", "iterative_lp"]

#: A rectified row is in the output span when its projection residual is below this.
SPAN_TOL = 1e-9
#: A new rectified row is independent of the found ones above this projection residual.
INDEPENDENCE_TOL = 1e-8
#: Zero tests at float64 (sign of an entry, rank of B off a support, the support solve);
#: :func:`_zero_tests` raises all of them to the rounding floor of lower-precision outputs.
ZERO_TESTS = {"span": SPAN_TOL, "independence": INDEPENDENCE_TOL, "sign": 1e-9, "rank": 1e-9, "solve": 1e-9}


def _zero_tests(prec, d, k):
    return {key: prec.tol(value, d, k) for key, value in ZERO_TESTS.items()}


def _in_span(f, B, tol=SPAN_TOL):
    nf = np.linalg.norm(f)
    return nf > 0 and np.linalg.norm(f - B.T @ (B @ f)) <= tol * nf


def _independent(f, Qbasis):
    """Residual of f after projection on the orthonormal rows of Qbasis, relative to |f|."""
    if Qbasis is None or Qbasis.shape[0] == 0:
        return 1.0
    return float(np.linalg.norm(f - Qbasis.T @ (Qbasis @ f)) / np.linalg.norm(f))


def _check_row(w, X, S, B, tol_sign=1e-9, tol_span=SPAN_TOL):
    """Is y = X w a valid row for pattern S: positive exactly on S and relu(y) in span(B)?"""
    y = X @ w
    scale = np.abs(y).max()
    if not scale > 0:
        return None
    pos = y > tol_sign * scale
    if not np.array_equal(pos, S):
        return None
    f = np.where(pos, y, 0.0)
    return f if _in_span(f, B, tol_span) else None


def iterative_lp(X, S, B, found, *, rng, time_limit=None):
    """BJW19 Algorithm 1 (Iterative LP), as an LP in w (d) and z (k).

    Rows: (a) x_j.w >= 1 on S; (b) x_j.w <= 0 off S; (c) x_j.w = B_j.z on S;
    (d) B_j.z = 0 off S; (e) independence from the rows ``found`` (n,) by the two-LP
    random-vector form of Remark 1: sum_{j in S} g_j x_j.w >= 1, then <= -1, with
    g = (I - P) rho for a random rho and P the projector on span(found).

    Returns (w or None, number of LP solves).
    """
    n, d = X.shape
    k = B.shape[0]
    sess = LPSession(d + k, time_limit=time_limit)
    XS, XN = X[S], X[~S]
    BS, BN = B[:, S].T, B[:, ~S].T
    sess.add_rows(np.hstack([XS, np.zeros((XS.shape[0], k))]), 1.0, INF)
    if XN.shape[0]:
        sess.add_rows(np.hstack([XN, np.zeros((XN.shape[0], k))]), -INF, 0.0)
    sess.add_rows(np.hstack([XS, -BS]), 0.0, 0.0)
    if XN.shape[0]:
        sess.add_rows(np.hstack([np.zeros((XN.shape[0], d)), BN]), 0.0, 0.0)
    if not found:
        res = sess.solve()
        return (res.x[:d] if res.feasible else None), 1
    Q = np.linalg.qr(np.array(found).T)[0]  # n x (i-1)
    rho = rng.standard_normal(n)
    g = rho - Q @ (Q.T @ rho)
    row = np.concatenate([g[S] @ XS, np.zeros(k)])
    (idx,) = sess.add_rows(row[None, :], 1.0, INF)
    res = sess.solve()
    if res.feasible:
        return res.x[:d], 1
    sess.set_row_bounds(idx, -INF, -1.0)
    res = sess.solve()
    return (res.x[:d] if res.feasible else None), 2


def _determined(S, X, B, tol_rank=1e-9):
    """Is the row fixed by its pattern S? The non-negative span vectors with support S form
    a single ray (B[:, ~S] has a one-dimensional left null space) and X_S has rank d."""
    d, k = X.shape[1], B.shape[0]
    if S.sum() < d:
        return False
    if (~S).any():
        s = np.linalg.svd(B[:, ~S], compute_uv=False)
        rank_off = int(np.sum(s > tol_rank * max(s[0], 1e-300)))
        if k - rank_off != 1:
            return False
    return bool(np.linalg.matrix_rank(X[S]) == d)


def _try_pattern(S, coeff, X, B, found, rng, time_limit, zt=ZERO_TESTS):
    """One candidate pattern: the exact support solve when it applies, else Algorithm 1.

    Returns ((w, f, determined, path) or None, number of LPs solved).
    """
    d = X.shape[1]
    if coeff is not None and S.sum() >= d:
        r = coeff @ B
        XS = X[S]
        w = np.linalg.lstsq(XS, r[S], rcond=None)[0]
        if np.linalg.norm(XS @ w - r[S]) <= zt["solve"] * np.linalg.norm(r[S]):
            f = _check_row(w, X, S, B, zt["sign"], zt["span"])
            if f is not None:
                return (w, f, _determined(S, X, B, zt["rank"]), "support"), 0
    w, lps = iterative_lp(X, S, B, found, rng=rng, time_limit=time_limit)
    if w is None:
        return None, lps
    f = _check_row(w, X, S, B, zt["sign"], zt["span"])
    if f is None:
        return None, lps
    return (w, f, _determined(S, X, B, zt["rank"]), "lp"), lps


@recovery_method("bjw19-enumeration")
def enumeration(
    X,
    Y,
    n_hidden,
    *,
    tol=1e-10,
    max_patterns=None,
    time_limit=None,
    n_jobs=None,
    progress=None,
    random_state=None,
    precision=None,
):
    """Exact recovery for any input distribution (BJW19 Thm 1; Algorithms 1 and 2).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Inputs, from any distribution (Laplace, uniform, real data, ...).
    Y : array-like of shape (n_samples, n_outputs)
        Noiseless outputs of rank exactly ``n_hidden``.
    n_hidden : int
        Number of hidden units k.
    tol : float, default=1e-10
        Largest relative residual accepted as an exact fit.
    max_patterns : int, optional
        Stop after trying this many distinct candidate patterns.
    time_limit : float, optional
        Stop after about this many seconds: checked inside the C++ enumeration, before
        every batch of 8 candidate patterns, and as the time limit of each LP.
    n_jobs : int or None, default=None
        Threads for the enumeration kernel and for trying patterns (None or -1: all
        cores). The result does not depend on it.
    progress : bool or None, default=None
        Progress bar on stderr; None shows it only on a terminal.
    random_state : None, int or numpy Generator
        Seeds the random vectors of the independence rows (Remark 1).
    precision : None, str or float, optional
        Precision of the outputs (default: from Y's dtype). Below float64 the rank test,
        the span, sign and independence tests and ``tol`` are raised to the rounding floor
        (:mod:`relufast.stages.precision`) and an exact result is polished in float64.

    Returns
    -------
    RecoveryResult
        ``exact`` when k independent rows were found and the fit is exact. The network
        found fits Y exactly but need not be the planted one (BJW19 Thm 1 promises *a*
        factorization, docs/bjw19.md, erratum 14). ``diagnostics['determined']`` says, per row,
        whether its sign pattern fixes it (a single ray of the output span has that
        support, |S_i| >= d and X restricted to S_i has rank d); even then another set of
        rectified vectors in the span may fit, so uniqueness is not claimed.
        ``rank_deficient`` when rank(Y) < k (then the problem is NP-hard, BJW19 Thm 2).

    Notes
    -----
    1. rank(Y) must equal k; B = orthonormal basis of the column span of Y (the row span
       of the paper's A), k x n.
    2. Candidate positive sets (BJW19 Lemma 1) from the C++ enumeration: supports of
       extreme rays of {w : w B >= 0} first (the true rows are such rays, Lemma 10), from
       random (k-1)-subsets and then from all of them, then all vertices of Lemma 1 (the
       guarantee), deduplicated.
    3. For each candidate S in order (Algorithm 2, step 3): when |S| >= d, solve
       X_S w = r_S exactly (QR least squares) and verify; otherwise, or if that fails,
       Algorithm 1 (Iterative LP on HiGHS) with the independence rows of Remark 1.
       Accept the first valid row whose rectified vector is independent of those found.
    4. V = rows w (normalised), U by least squares, residual over all samples.

    Time ``poly(n, m, d) * min(n^O(k), 2^n)``: C(n, k-1) ray systems, then C(n, k)
    (2^k - 1) vertex systems of cost O(k^3 + nk) each, at most k LP pairs per pattern.
    """
    prec = resolve_precision(Y, precision)
    with single_threaded_blas():
        return _enumeration(
            X,
            Y,
            n_hidden,
            tol=tol,
            max_patterns=max_patterns,
            time_limit=time_limit,
            n_jobs=n_jobs,
            progress=progress,
            random_state=random_state,
            prec=prec,
        )


def _enumeration(X, Y, n_hidden, *, tol, max_patterns, time_limit, n_jobs, progress, random_state, prec):
    run = Run("bjw19-enumeration")
    X, Y, n, d, m, k = check_problem(X, Y, n_hidden, k_at_most_d=False)
    run.precision = prec.name
    zt = _zero_tests(prec, d, k)
    tol = prec.tol(tol, d, k)
    if k > n:
        raise ValueError(f"n_hidden must be at most n_samples = {n}; got {k}")
    if max_patterns is not None:
        max_patterns = check_positive_int(max_patterns, "max_patterns")
    if time_limit is not None and not (np.isfinite(time_limit) and time_limit > 0):
        raise ValueError(f"time_limit must be a positive number of seconds; got {time_limit!r}")
    threads = resolve_n_jobs(n_jobs)
    workers = threads if threads > 0 else (os.cpu_count() or 1)
    rng = check_random_state(random_state)
    seconds, counts, diag = run.seconds, run.counts, run.diag
    counts.update(n_samples=n, n_hidden=k)

    t = time.perf_counter()
    Uy, sv, _ = np.linalg.svd(Y, full_matrices=False)
    rank = numerical_rank(sv, prec.tol(RANK_TOL, d, k))
    diag["output_singular_values"] = sv
    seconds["rank"] = time.perf_counter() - t
    if rank < k:
        return run.result(
            Status.RANK_DEFICIENT,
            f"the outputs have rank {rank} < n_hidden = {k}: BJW19 Thm 1 needs rank(Y) = k "
            "(with rank(Y) < k, deciding whether a network exists is NP-hard, Thm 2)",
        )
    if rank > k:
        return run.result(
            Status.FAILED,
            f"the outputs have rank {rank} > n_hidden = {k}: no network with {k} hidden "
            "units fits them exactly (noisy outputs, or n_hidden too small)",
        )
    B = np.ascontiguousarray(Uy[:, :k].T)
    # Real inputs may span a subspace (pixels that are zero in every image): search in the
    # row space of X, where the rows are identifiable, and report V there (minimum norm).
    X_full, row_space, null_dirs = X, *_row_space(X, zt["rank"])
    if null_dirs.shape[0]:
        X = np.ascontiguousarray(X @ row_space.T)
    diag["input_rank"] = row_space.shape[0]
    diag["unidentifiable_directions"] = null_dirs

    t = time.perf_counter()
    deadline = None if time_limit is None else time.monotonic() + time_limit

    def remaining():
        """Seconds left of time_limit (None without one), for the LPs of one pattern."""
        return None if deadline is None else max(deadline - time.monotonic(), 1e-3)

    def out_of_time():
        if deadline is not None and time.monotonic() > deadline:
            stream.stopped_by = "time_limit"
            return True
        return False

    stream = PatternStream(
        B,
        tol=zt["sign"],
        n_jobs=threads,
        max_patterns=max_patterns,
        time_limit=time_limit,
        progress=progress,
        random_state=rng.integers(2**63),
    )
    W, F, det, paths, sources, feasible = [], [], [], [], [], []
    Qb = np.zeros((0, n))  # orthonormal basis of the rectified rows found so far

    def accept(out, src):
        """Keep a valid row if its rectified vector is independent; True once k rows."""
        nonlocal Qb
        w, f, determined, path = out
        if _independent(f, Qb) <= zt["independence"]:
            return False
        W.append(w)
        F.append(f)
        det.append(determined)
        paths.append(path)
        sources.append(src)
        Qb = np.linalg.qr(np.array(F).T)[0].T
        return len(W) == k

    tried = lps = 0
    batch_size = 8  # fixed, so that counts and random rows do not depend on n_jobs
    pool = ThreadPoolExecutor(workers) if workers > 1 else None
    try:
        for chunk in stream.chunks():
            for b0 in range(0, len(chunk), batch_size):
                if out_of_time():
                    break
                batch = chunk[b0 : b0 + batch_size]
                tried += len(batch)
                found = list(F)
                seeds = rng.integers(0, 2**63, size=len(batch))
                args = [
                    (S, c, X, B, found, np.random.default_rng(s), remaining(), zt) for (S, c, _), s in zip(batch, seeds)
                ]
                outs = list(pool.map(lambda a: _try_pattern(*a), args)) if pool else [_try_pattern(*a) for a in args]
                # First-feasible in stream order: the outcome does not depend on the thread count.
                for (S, c, src), (out, nlp) in zip(batch, outs):
                    lps += nlp
                    if out is None:
                        continue
                    feasible.append(S)
                    if accept(out, src):
                        break
                if len(W) == k:
                    break
            if len(W) == k or stream.stopped_by:
                break
        # Algorithm 2 may use one pattern for several rows (two units can share a support):
        # once the stream is exhausted, retry the feasible patterns with the independence
        # rows of Algorithm 1 against the rows found so far.
        if len(W) < k and stream.exhausted:
            for S in feasible:
                if out_of_time():
                    break
                out, nlp = _try_pattern(
                    S, None, X, B, list(F), np.random.default_rng(rng.integers(2**63)), remaining(), zt
                )
                lps += nlp
                if out is not None and accept(out, "reused"):
                    break
    finally:
        if pool:
            pool.shutdown()
    seconds["search"] = time.perf_counter() - t
    counts.update({"patterns_tried": tried, "lps_solved": lps, "linear_systems": stream.systems, "rows_found": len(W)})
    diag.update(
        {
            "determined": tuple(det),
            "row_paths": tuple(paths),
            "row_sources": tuple(sources),
            "stopped_by": stream.stopped_by,
        }
    )

    if len(W) < k:
        if stream.stopped_by:
            msg = (
                f"stopped by {stream.stopped_by} after {tried} patterns with {len(W)} of {k} rows; "
                "raise max_patterns or time_limit"
            )
        else:
            msg = (
                f"all candidate patterns tried ({tried}); only {len(W)} of {k} independent rows "
                "exist: the outputs are not realizable by a ReLU network with these inputs"
            )
        return run.result(Status.FAILED, msg)

    t = time.perf_counter()
    V = np.array(W) @ row_space if null_dirs.shape[0] else np.array(W)
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    X = X_full
    U, residual, _ = fit_and_certify(X, Y, V)
    seconds["fit"] = time.perf_counter() - t
    exact = residual <= tol
    all_det = all(det)
    if exact and not prec.is_double:
        U, V, _, _, residual = polish_at_precision(X, Y, U, V, threads=threads)
    if exact:
        # An exact fit is identified only if no row can move: a row whose active and boundary
        # samples leave a direction of R^d unseen gives another exact fit (always so with n < d).
        free = undetermined_directions(X, V)
        loose = [i for i, N in enumerate(free) if N.shape[0]]
        if loose:
            null = input_null_space(X)
            U, V, minimal = minimum_norm_rows(X, V, U, free, null)
            residual = relative_residual(X, Y, V, U, threads, RELU)
            diag.update(
                undetermined_rows=tuple(loose),
                undetermined_directions=tuple(free),
                minimum_norm=minimal,
                all_rows_determined=False,
            )
            if null.shape[0]:
                diag["input_null_space"] = null
            seconds["fit"] = time.perf_counter() - t
            span_note = f" (the inputs span only {d - null.shape[0]} of {d} dimensions)" if null.shape[0] else ""
            return run.result(
                Status.NON_IDENTIFIABLE,
                f"found {k} rows fitting Y exactly (relative residual {residual:.2e}), but the fit is not "
                f"unique: row(s) {loose} can move along {[free[i].shape[0] for i in loose]} input "
                "direction(s) each (diagnostics['undetermined_directions']) that their active samples do "
                f"not see{span_note}"
                " without changing the outputs; returned the minimum-norm representative",
                U=U,
                V=V,
                residual=residual,
            )
        msg = (
            f"found {k} rows fitting Y exactly (relative residual {residual:.2e}) after {tried} "
            f"patterns and {lps} LPs; "
            + (
                "each row is determined by its sign pattern (a single ray of the output span "
                "with that support, |S| >= d, X_S of rank d)"
                if all_det
                else f"{k - sum(det)} row(s) are not determined by their sign pattern (|S| < d, X_S "
                "rank-deficient, or a face of dimension > 1)"
            )
            + ". An exact fit does not by itself make the network unique: other rectified "
            "vectors in the output span may give another exact factorization"
            + (
                ""
                if prec.is_double
                else f" (certified at {prec.name} precision, floor {prec.floor(d, k):.1e}; polished in float64)"
            )
        )
        status = Status.EXACT
    else:
        msg = f"k rows found but the least-squares fit has residual {residual:.2e} > tol = {tol:.1e}"
        status = Status.FAILED
    diag["all_rows_determined"] = all_det
    if null_dirs.shape[0]:
        msg += (
            f". X spans a {row_space.shape[0]}-dimensional subspace of R^{d}: V is reported on the "
            f"row space of X (minimum norm); its components along the other {null_dirs.shape[0]} "
            "input directions (diagnostics['unidentifiable_directions']) are not identifiable"
        )
    return run.result(status, msg, U=U, V=V, exact=exact, residual=residual)


def _row_space(X, tol):
    """Orthonormal bases (r, d) of the row space of X and (d - r, d) of its complement."""
    Xs = X[: min(len(X), 200000)]
    s = np.linalg.svd(Xs, compute_uv=False)
    r = int(np.sum(s > tol * max(s[0], 1e-300))) if s.size else 0
    _, E = np.linalg.eigh(Xs.T @ Xs)  # eigenvectors, ascending: the last r span the rows
    E = E[:, ::-1].T
    return np.ascontiguousarray(E[:r]), np.ascontiguousarray(E[r:])
