"""BJW19 Theorem 1: exact recovery for any input when rank(Y) = k.

Lemma 1 (candidate sign patterns, C++ enumeration in the patterns stage), Algorithm 1
(Iterative LP on HiGHS, :func:`iterative_lp`) and Algorithm 2 (ExactNeuralNet), with the
exact support solve where |S| >= d. Algorithm 2's steps are the functions below:
step 1 (rank of Y, basis of its span) :func:`_output_basis`; step 2 (candidate patterns)
:class:`relufast.stages.patterns.PatternStream`; step 3 (a row per pattern, Algorithm 1)
:class:`_RowSearch`; step 4 (V, U and the certificate of Theorem 1) :func:`_fit_rows`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..._blas import single_threaded_blas
from ..._deadline import check_time_limit
from ..._protocol import recovery_method
from ..._result import Run, Status
from ..._validation import check_positive_int, check_problem, check_random_state, resolve_n_jobs
from ...activations import RELU
from ...stages.diagnostics import RANK_TOL, input_null_space, numerical_rank
from ...stages.fit import fit_and_certify, minimum_norm_rows, relative_residual, undetermined_directions
from ...stages.highs import INF, LPSession
from ...stages.patterns import PatternStream
from ...stages.precision import polish_at_precision, resolve_precision
from ...stages.reduce import Samples, allgather_checked, check_comm, is_dask

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


@recovery_method("bjw19-enumeration", own_time_limit=True)
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
    comm=None,
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
    comm : mpi4py communicator, optional
        Each rank passes its own samples (rows in rank order). Every sample is gathered on
        every rank (at most :data:`GATHER_LIMIT` bytes; the candidate patterns are subsets of
        all samples); the enumeration's subsets and each batch's candidate patterns are split
        across the ranks, and every rank returns the result of one process, bit for bit.
        Dask arrays are gathered the same way.

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
            comm=check_comm(comm),
        )


#: Candidate patterns tried per batch (all against the rows found before the batch): fixed,
#: so that counts and random rows depend neither on n_jobs nor on the number of MPI ranks.
BATCH_SIZE = 8
#: Largest copy (bytes of X and Y) the enumeration gathers from samples spread over MPI
#: ranks or held in a dask array: Lemma 1 and every LP of Algorithm 1 read all samples.
GATHER_LIMIT = 2**30


@dataclasses.dataclass
class _Problem:
    """The validated data and settings of one run (shared by the steps below)."""

    X: np.ndarray
    Y: np.ndarray
    k: int
    zt: dict
    tol: float
    max_patterns: int | None
    time_limit: float | None
    threads: int
    workers: int
    rng: np.random.Generator
    prec: Any
    comm: Any

    @property
    def rank(self):
        return 0 if self.comm is None else int(self.comm.Get_rank())


def _enumeration(X, Y, n_hidden, *, tol, max_patterns, time_limit, n_jobs, progress, random_state, prec, comm):
    """BJW19 Algorithm 2 (ExactNeuralNet), step by step (see :func:`enumeration`)."""
    run = Run("bjw19-enumeration")
    p = _setup(run, X, Y, n_hidden, tol, max_patterns, time_limit, n_jobs, random_state, prec, comm)
    B = _output_basis(run, p)
    if not isinstance(B, np.ndarray):
        return B  # rank(Y) != k: a status, no search
    Xr, row_space, null_dirs = _search_space(run, p)
    search = _RowSearch(p, Xr, B, progress)
    t = time.perf_counter()
    search.run()
    run.seconds["search"] = time.perf_counter() - t
    search.record(run)
    if len(search.W) < p.k:
        return run.result(Status.FAILED, search.shortfall_message())
    return _fit_rows(run, p, search, row_space, null_dirs)


def _setup(run, X, Y, n_hidden, tol, max_patterns, time_limit, n_jobs, random_state, prec, comm):
    """Validate the options and the samples (gathered from the ranks or dask blocks first,
    see :func:`_gathered`); returns a :class:`_Problem`."""
    X, Y = _gathered(X, Y, comm)
    X, Y, n, d, m, k = check_problem(X, Y, n_hidden, k_at_most_d=False)
    run.precision = prec.name
    if k > n:
        raise ValueError(f"n_hidden must be at most n_samples = {n}; got {k}")
    if max_patterns is not None:
        max_patterns = check_positive_int(max_patterns, "max_patterns")
    time_limit = check_time_limit(time_limit)  # checked by the protocol already; the one rule
    threads = resolve_n_jobs(n_jobs)
    rng = check_random_state(random_state)
    run.counts.update(n_samples=n, n_hidden=k)
    if comm is not None:
        run.counts["ranks"] = int(comm.Get_size())
    return _Problem(
        X=X,
        Y=Y,
        k=k,
        zt=_zero_tests(prec, d, k),
        tol=prec.tol(tol, d, k),
        max_patterns=max_patterns,
        time_limit=time_limit,
        threads=threads,
        workers=threads if threads > 0 else (os.cpu_count() or 1),
        rng=rng,
        prec=prec,
        comm=comm,
    )


def _gathered(X, Y, comm):
    """Every sample in memory on every rank, for samples spread over MPI ranks or in a dask
    array (validated and agreed on every rank first, :class:`relufast.stages.reduce.Samples`).

    The candidate patterns of Lemma 1 are subsets of *all* samples and every LP of
    Algorithm 1 has a row per sample, so unlike the moment methods the enumeration cannot
    work on a rank's own rows: it gathers X and Y, up to :data:`GATHER_LIMIT` bytes (the
    same decision on every rank, since n, d and m are agreed), and splits the candidate
    patterns across the ranks instead.
    """
    if comm is None and not (is_dask(X) or is_dask(Y)):
        return X, Y
    data = Samples.from_arrays(X, Y, comm=comm)
    size = data.n * (data.d + data.m) * 8
    if size > GATHER_LIMIT:
        raise ValueError(
            f"bjw19-enumeration needs every sample on every rank (Lemma 1 and the LPs of Algorithm 1 "
            f"read all of them): at most {GATHER_LIMIT / 2**20:.0f} MB of X and Y; got n = {data.n}, "
            f"d = {data.d}, m = {data.m} ({size / 2**20:.0f} MB). Its cost grows like n^k: pass a subsample"
        )
    return data.gather_all()


def _output_basis(run, p):
    """Algorithm 2, step 1: check rank(Y) = k (Thm 1) and return the orthonormal basis B
    (k, n) of the column span of Y (the row span of the paper's A); a result otherwise."""
    t = time.perf_counter()
    Uy, sv, _ = np.linalg.svd(p.Y, full_matrices=False)
    d, k = p.X.shape[1], p.k
    rank = numerical_rank(sv, p.prec.tol(RANK_TOL, d, k))
    run.diag["output_singular_values"] = sv
    run.seconds["rank"] = time.perf_counter() - t
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
    return np.ascontiguousarray(Uy[:, :k].T)


def _search_space(run, p):
    """Inputs for the search: real inputs may span a subspace (pixels that are zero in every
    image), so search in the row space of X, where the rows are identifiable, and report V
    there (minimum norm). Returns (X in row-space coordinates, row_space, null_dirs)."""
    row_space, null_dirs = _row_space(p.X, p.zt["rank"])
    Xr = np.ascontiguousarray(p.X @ row_space.T) if null_dirs.shape[0] else p.X
    run.diag["input_rank"] = row_space.shape[0]
    run.diag["unidentifiable_directions"] = null_dirs
    return Xr, row_space, null_dirs


class _RowSearch:
    """BJW19 Algorithm 2, step 3: candidate patterns in stream order (Lemma 1, extreme-ray
    supports first), each tried by the exact support solve or Algorithm 1; the first valid
    row whose rectified vector is independent of those found is accepted.

    With a communicator the stream's subsets and each batch's patterns are split across
    the ranks (rank r takes patterns r, r + R, ... of a batch); the outcomes are gathered
    in batch order, so every rank accepts the same rows as one process would.
    """

    def __init__(self, p, X, B, progress):
        self.p, self.X, self.B = p, X, B
        self.deadline = None if p.time_limit is None else time.monotonic() + p.time_limit
        self.stream = PatternStream(
            B,
            tol=p.zt["sign"],
            n_jobs=p.threads,
            max_patterns=p.max_patterns,
            time_limit=p.time_limit,
            progress=progress if p.rank == 0 else False,
            random_state=p.rng.integers(2**63),
            comm=p.comm,
        )
        self.W, self.F, self.det, self.paths, self.sources, self.feasible = [], [], [], [], [], []
        self.Qb = np.zeros((0, B.shape[1]))  # orthonormal basis of the rectified rows found so far
        self.tried = self.lps = 0

    def remaining(self):
        """Seconds left of time_limit (None without one), for the LPs of one pattern."""
        return None if self.deadline is None else max(self.deadline - time.monotonic(), 1e-3)

    def late(self):
        """Has time_limit passed (on any rank: the ranks agree)? Marks the stream stopped."""
        late = self.deadline is not None and time.monotonic() > self.deadline
        if self.p.comm is not None:
            late = any(self.p.comm.allgather(late))
        if late:
            self.stream.stopped_by = "time_limit"
        return late

    def accept(self, out, src):
        """Keep a valid row if its rectified vector is independent; True once k rows."""
        w, f, determined, path = out
        if _independent(f, self.Qb) <= self.p.zt["independence"]:
            return False
        self.W.append(w)
        self.F.append(f)
        self.det.append(determined)
        self.paths.append(path)
        self.sources.append(src)
        self.Qb = np.linalg.qr(np.array(self.F).T)[0].T
        return len(self.W) == self.p.k

    def run(self):
        """Steps through the stream, then reuses feasible patterns (see :meth:`_reuse`)."""
        k = self.p.k
        pool = ThreadPoolExecutor(self.p.workers) if self.p.workers > 1 else None
        try:
            for chunk in self.stream.chunks():
                for b0 in range(0, len(chunk), BATCH_SIZE):
                    if self.late():
                        break
                    self._batch(chunk[b0 : b0 + BATCH_SIZE], pool)
                    if len(self.W) == k:
                        break
                if len(self.W) == k or self.stream.stopped_by:
                    break
            if len(self.W) < k and self.stream.exhausted:
                self._reuse()
        finally:
            if pool:
                pool.shutdown()

    def _batch(self, batch, pool):
        """Try one batch against the rows found before it; accept in stream order (the
        first-feasible outcome depends neither on the thread count nor on the ranks)."""
        self.tried += len(batch)
        found = list(self.F)
        seeds = self.p.rng.integers(0, 2**63, size=len(batch))
        args = [
            (S, c, self.X, self.B, found, np.random.default_rng(s), self.remaining(), self.p.zt)
            for (S, c, _), s in zip(batch, seeds)
        ]
        for (S, _, src), (out, nlp) in zip(batch, self._map(args, pool)):
            self.lps += nlp
            if out is None:
                continue
            self.feasible.append(S)
            if self.accept(out, src):
                break

    def _map(self, args, pool):
        """``_try_pattern`` over args, in order; with a communicator each rank tries its share
        (every R-th pattern) and the outcomes are gathered in rank order."""
        comm = self.p.comm
        if comm is None:
            return list(pool.map(lambda a: _try_pattern(*a), args)) if pool else [_try_pattern(*a) for a in args]
        size, rank = int(comm.Get_size()), int(comm.Get_rank())
        mine = list(range(rank, len(args), size))

        def share():
            outs = pool.map(lambda i: _try_pattern(*args[i]), mine) if pool else [_try_pattern(*args[i]) for i in mine]
            return list(zip(mine, outs))

        merged = [None] * len(args)
        for part in allgather_checked(comm, share):  # an error on one rank is raised on all
            for i, out in part:
                merged[i] = out
        return merged

    def _reuse(self):
        """Algorithm 2 may use one pattern for several rows (two units can share a support):
        once the stream is exhausted, retry the feasible patterns with the independence rows
        of Algorithm 1 against the rows found so far (every rank does the same work)."""
        for S in self.feasible:
            if self.late():
                break
            rng = np.random.default_rng(self.p.rng.integers(2**63))
            out, nlp = _try_pattern(S, None, self.X, self.B, list(self.F), rng, self.remaining(), self.p.zt)
            self.lps += nlp
            if out is not None and self.accept(out, "reused"):
                break

    def record(self, run):
        """Counts and diagnostics of the search."""
        run.counts.update(
            {
                "patterns_tried": self.tried,
                "lps_solved": self.lps,
                "linear_systems": self.stream.systems,
                "rows_found": len(self.W),
            }
        )
        run.diag.update(
            {
                "determined": tuple(self.det),
                "row_paths": tuple(self.paths),
                "row_sources": tuple(self.sources),
                "stopped_by": self.stream.stopped_by,
            }
        )

    def shortfall_message(self):
        """Why fewer than k rows were found."""
        got, k = len(self.W), self.p.k
        if self.stream.stopped_by:
            return (
                f"stopped by {self.stream.stopped_by} after {self.tried} patterns with {got} of {k} rows; "
                "raise max_patterns or time_limit"
            )
        return (
            f"all candidate patterns tried ({self.tried}); only {got} of {k} independent rows "
            "exist: the outputs are not realizable by a ReLU network with these inputs"
        )


def _fit_rows(run, p, search, row_space, null_dirs):
    """Algorithm 2, step 4 (and Theorem 1's certificate): V from the rows found (normalised,
    mapped back from the row space of X), U by least squares, the residual over all samples;
    an exact fit is then checked for rows that can move (:func:`_non_identifiable`)."""
    t = time.perf_counter()
    X, Y, prec = p.X, p.Y, p.prec
    V = np.array(search.W) @ row_space if null_dirs.shape[0] else np.array(search.W)
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    U, residual, _ = fit_and_certify(X, Y, V)
    run.seconds["fit"] = time.perf_counter() - t
    exact = residual <= p.tol
    det = search.det
    if exact and not prec.is_double:
        U, V, _, _, residual = polish_at_precision(X, Y, U, V, threads=p.threads)
    if exact:
        # An exact fit is identified only if no row can move: a row whose active and boundary
        # samples leave a direction of R^d unseen gives another exact fit (always so with n < d).
        try:  # under MPI every rank must take the same path: no clock there
            free = undetermined_directions(X, V, deadline=search.deadline if p.comm is None else None)
        except TimeoutError as exc:
            return run.result(
                Status.FAILED,
                f"k rows fit Y exactly (relative residual {residual:.2e}), but {exc}: the fit is "
                "not certified unique; raise time_limit",
                U=U,
                V=V,
                residual=residual,
            )
        if any(N.shape[0] for N in free):
            return _non_identifiable(run, p, U, V, free, t)
        msg = _exact_message(p, residual, search)
        status = Status.EXACT
    else:
        msg = f"k rows found but the least-squares fit has residual {residual:.2e} > tol = {p.tol:.1e}"
        status = Status.FAILED
    run.diag["all_rows_determined"] = all(det)
    if null_dirs.shape[0]:
        d = X.shape[1]
        msg += (
            f". X spans a {row_space.shape[0]}-dimensional subspace of R^{d}: V is reported on the "
            f"row space of X (minimum norm); its components along the other {null_dirs.shape[0]} "
            "input directions (diagnostics['unidentifiable_directions']) are not identifiable"
        )
    return run.result(status, msg, U=U, V=V, exact=exact, residual=residual)


def _non_identifiable(run, p, U, V, free, t):
    """An exact fit with rows that can move along directions their samples do not see:
    ``non_identifiable``, with the minimum-norm representative."""
    X, Y, k = p.X, p.Y, p.k
    d = X.shape[1]
    loose = [i for i, N in enumerate(free) if N.shape[0]]
    null = input_null_space(X)
    U, V, minimal = minimum_norm_rows(X, V, U, free, null)
    residual = relative_residual(X, Y, V, U, p.threads, RELU)
    run.diag.update(
        undetermined_rows=tuple(loose),
        undetermined_directions=tuple(free),
        minimum_norm=minimal,
        all_rows_determined=False,
    )
    if null.shape[0]:
        run.diag["input_null_space"] = null
    run.seconds["fit"] = time.perf_counter() - t
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


def _exact_message(p, residual, search):
    """The message of an exact fit: counts, and whether each row is fixed by its pattern."""
    k, det, prec, d = p.k, search.det, p.prec, p.X.shape[1]
    return (
        f"found {k} rows fitting Y exactly (relative residual {residual:.2e}) after {search.tried} "
        f"patterns and {search.lps} LPs; "
        + (
            "each row is determined by its sign pattern (a single ray of the output span "
            "with that support, |S| >= d, X_S of rank d)"
            if all(det)
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


def _row_space(X, tol):
    """Orthonormal bases (r, d) of the row space of X and (d - r, d) of its complement."""
    Xs = X[: min(len(X), 200000)]
    s = np.linalg.svd(Xs, compute_uv=False)
    r = int(np.sum(s > tol * max(s[0], 1e-300))) if s.size else 0
    _, E = np.linalg.eigh(Xs.T @ Xs)  # eigenvectors, ascending: the last r span the rows
    E = E[:, ::-1].T
    return np.ascontiguousarray(E[:r]), np.ascontiguousarray(E[r:])
