"""Reductions: the one place that knows where samples live and how partial sums meet.

A pipeline's samples may be in-memory NumPy arrays, NumPy memmaps (``np.load(...,
mmap_mode="r")``), dask arrays, and may be spread over the ranks of an MPI communicator
(mpi4py), each rank holding its own rows. :class:`Samples` hides all of that behind four
operations that the pipelines use and never branch around:

- :meth:`Samples.blocks`: the local samples as aligned float64 row blocks (a NumPy or
  memmap array is one block, read in place by the C++ kernels, which block internally;
  a dask array yields its computed row blocks one at a time);
- :meth:`Samples.accumulate`: add every block to a mergeable accumulator and sum its
  state over the ranks;
- :meth:`Samples.reduce`: sum a state dict over the ranks;
- :meth:`Samples.take`: rows at global indices (the concatenation of the ranks' rows in
  rank order), gathered on every rank in the order asked.

Sums over ranks are computed by an ``allgather`` followed by a sum in rank order on
every rank, so every rank holds the same bits and takes the same decisions afterwards.
Validation (:meth:`Samples.from_arrays`) is agreed on by every rank before anything else
is communicated, so bad input raises the same ``ValueError`` on every rank instead of
leaving the others waiting in a collective.
"""

from __future__ import annotations

import numpy as np

from .._blas import take_rows
from .._native import core

__all__ = [
    "is_dask",
    "row_blocks",
    "allreduce_state",
    "allgather_checked",
    "check_comm",
    "Samples",
    "SampleStream",
    "count_nonfinite",
    "GATHER_FRACTION",
    "check_n_estimate",
    "GrowingSample",
    "start_size",
    "order_statistics",
    "median",
]

#: Rows per block when a NumPy-side check walks a large array (bounded temporaries).
CHECK_ROWS = 1 << 15

#: Rows per block of NumPy-side work on local arrays (temporaries stay O(block), not O(n)).
BLOCK_ROWS = 1 << 16

#: An adaptive estimation sample is gathered in memory only up to this fraction of n; beyond
#: it the estimate reads all samples by reduction instead (no copy of the data).
GATHER_FRACTION = 0.25


def check_n_estimate(n_estimate, n_min):
    """The ``n_estimate=`` option of the adaptive pipelines: None (adaptive from the
    method's start size), "all" (every sample), or an int >= n_min (the start size)."""
    from .._validation import check_positive_int

    if n_estimate is None or (isinstance(n_estimate, str) and n_estimate == "all"):
        return n_estimate
    if isinstance(n_estimate, str):
        raise ValueError(f"n_estimate must be None, 'all' or an integer >= {n_min}; got {n_estimate!r}")
    return check_positive_int(n_estimate, "n_estimate", minimum=n_min)


def start_size(d, k, *, per_unit, minimum):
    """First size of an adaptive estimation sample: ``max(minimum, per_unit d k)`` (each
    method measured its own constants; see its ``start_size``)."""
    return max(int(minimum), int(per_unit) * int(d) * int(k))


class GrowingSample:
    """The adaptive estimation sample of a run: random rows of ``data`` (a :class:`Samples`)
    that double on demand until they are every sample. The methods estimate on it and
    certify over all samples; only the sample is gathered in memory.

    The rows come from one :class:`SampleStream` (nested prefixes, the same indices on every
    rank), in draw order, each new block checked finite before any LAPACK call sees it.
    ``size`` is the current estimation size, ``doublings`` how often it doubled; ``X`` and
    ``Y`` hold every row drawn so far (possibly more than ``size``: refinement samples are
    prefixes of the same draw).
    """

    def __init__(self, data, start, rng, *, where="in a random sample of the rows"):
        self.data, self.n = data, int(data.n)
        self.size = min(self.n, int(start))
        self.doublings = 0
        self.stream = SampleStream(self.n, rng)
        self.X = self.Y = None
        self._where = where

    @property
    def drawn(self):
        return 0 if self.X is None else len(self.X)

    @property
    def final(self):
        """True once the estimation sample is every sample."""
        return self.size >= self.n

    @property
    def gathered(self):
        """True while the estimation sample is small enough to hold in memory
        (:data:`GATHER_FRACTION` of n); beyond it the methods read ``data`` by reduction."""
        return self.size <= GATHER_FRACTION * self.n

    def rows(self, count=None):
        """The first ``count`` rows (default ``size``) of the sample as (X_s, Y_s), drawing
        and checking more rows when needed."""
        count = self.size if count is None else min(int(count), self.n)
        if count > self.drawn:
            Xn, Yn = self.data.take(self.stream.grow(count))
            bad = count_nonfinite(Xn) + count_nonfinite(Yn)
            if bad:
                raise ValueError(
                    f"X and Y must contain only finite values; found {bad} NaN or infinite entries {self._where}"
                )
            if self.X is None or self.Y is None or len(self.X) == 0:
                self.X, self.Y = Xn, Yn
            else:
                self.X, self.Y = np.concatenate([self.X, Xn]), np.concatenate([self.Y, Yn])
        if self.X is None or self.Y is None:  # nothing asked for yet
            return np.empty((0, self.data.d)), np.empty((0, self.data.m))
        return self.X[:count], self.Y[:count]

    def double(self):
        """Double the estimation size (at most n); False when it was every sample already."""
        if self.final:
            return False
        self.size = min(self.n, 2 * self.size)
        self.doublings += 1
        return True


def is_dask(a):
    """True for a dask array (duck-typed: dask is an optional dependency)."""
    return hasattr(a, "dask") and hasattr(a, "chunks") and not isinstance(a, np.ndarray)


def row_blocks(X, Y):
    """Aligned row blocks of dask (or NumPy) arrays X and Y, as NumPy arrays, one at a time."""
    import dask.array as da

    X = da.asarray(X)
    Y = da.asarray(Y)
    if X.ndim != 2 or Y.ndim not in (1, 2) or X.shape[0] != Y.shape[0]:
        raise ValueError(f"X must be (n, d) and Y (n, m) or (n,) with the same n; got {X.shape} and {Y.shape}")
    if Y.ndim == 1:
        Y = Y[:, None]
    X = X.rechunk({1: -1})
    Y = Y.rechunk({0: X.chunks[0], 1: -1})
    for i in range(X.numblocks[0]):
        Xb = np.ascontiguousarray(X.blocks[i, 0].compute(), dtype=np.float64)
        Yb = np.ascontiguousarray(Y.blocks[i, 0].compute(), dtype=np.float64)
        yield Xb, Yb


def check_comm(comm):
    """None or an mpi4py communicator (or an object with its ``allgather``, ``Get_rank`` and
    ``Get_size``); anything else is a ``TypeError`` naming what was expected and what was
    got (and the ``mpi`` extra when mpi4py is missing: the object is wrong either way)."""
    if comm is None:
        return None
    if all(hasattr(comm, name) for name in ("allgather", "Get_rank", "Get_size")):
        return comm
    message = f"comm must be None or an mpi4py communicator (e.g. MPI.COMM_WORLD); got {type(comm).__name__}"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        message += "; mpi4py is not installed either: install it with pip install 'relufast[mpi]'"
    raise TypeError(message)


def _sum_in_order(parts):
    out = {}
    for key in parts[0]:
        acc = parts[0][key]
        acc = np.array(acc, dtype=np.float64, copy=True) if np.ndim(acc) else float(acc)
        for p in parts[1:]:
            acc = acc + p[key]
        out[key] = acc
    return out


def allreduce_state(state, comm):
    """Sum every entry of a state dict over the ranks of an mpi4py communicator.

    The states are gathered on every rank and summed in rank order there, so every rank
    receives the same bits. ``comm=None`` returns a copy of the state.
    """
    if comm is None:
        return dict(state)
    return _sum_in_order(comm.allgather(dict(state)))


def allgather_checked(comm, work):
    """``comm.allgather(work())``, where an error on any rank is raised on every rank.

    Each rank runs ``work()`` (its share of a split computation) and the ranks exchange
    either the value or the error; if a rank failed, every rank raises the error of the
    lowest failing rank (the same type and message) instead of leaving the others waiting
    forever in the next collective. Returns the values in rank order.
    """
    import pickle

    try:
        value, error = work(), None
    except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
        value, error = None, exc
        try:
            pickle.dumps(exc)
        except Exception:  # noqa: BLE001 - an error that cannot travel is sent as text
            error = RuntimeError(f"{type(exc).__name__}: {exc}")
    parts = comm.allgather((value, error))
    for rank, (_, err) in enumerate(parts):
        if err is not None:
            if rank == int(comm.Get_rank()) and error is not None:
                raise error
            raise err
    return [v for v, _ in parts]


def count_nonfinite(A, n_jobs=0):
    """Number of NaN or infinite entries of a float64 array (C++ row blocks; no n x d mask)."""
    if A.flags.c_contiguous and A.dtype == np.float64 and A.ndim == 2:
        return int(core.count_nonfinite(A, n_jobs))
    bad = 0
    for s in range(0, A.shape[0], CHECK_ROWS):
        blk = A[s : s + CHECK_ROWS]
        bad += int(blk.size - np.count_nonzero(np.isfinite(blk)))
    return bad


def _local_array(a, name, allow_1d):
    """Dtype and shape checks of one local input; no copy of a float64 C-contiguous array
    or memmap, and no full-size temporary."""
    if is_dask(a):
        if a.ndim == 1 and allow_1d:
            a = a[:, None]
        if a.ndim != 2:
            raise ValueError(
                f"{name} must be a 2-D array of shape (n_samples, n_features); got a dask array with shape {a.shape}"
            )
        if not (np.issubdtype(a.dtype, np.number) or np.issubdtype(a.dtype, np.bool_)) or np.issubdtype(
            a.dtype, np.complexfloating
        ):
            raise TypeError(f"{name} must be a real numeric array; got dtype {a.dtype}")
        return a
    from .._validation import as_float_matrix

    return as_float_matrix(a, name, allow_1d=allow_1d, check_finite=False)


class Samples:
    """The samples of one pipeline run, wherever they live (see the module docstring).

    Build with :meth:`from_arrays` (validated on every rank) or directly from validated
    float64 arrays (one process, no checks).

    Attributes
    ----------
    X, Y : local inputs (n_local, d) and outputs (n_local, m): NumPy, memmap or dask
    n : int
        Number of samples over all ranks.
    n_local, offset : int
        This rank's rows are the global rows ``offset .. offset + n_local - 1``.
    d, m : int
    comm : mpi4py communicator or None
    n_jobs : int
        Threads of the C++ kernels (0: all cores).
    """

    def __init__(self, X, Y, *, comm=None, n_jobs=0, counts=None):
        self.X, self.Y = X, Y
        self.comm = comm
        self.n_jobs = n_jobs
        self.n_local = int(X.shape[0])
        self.d, self.m = int(X.shape[1]), int(Y.shape[1])
        counts = [self.n_local] if counts is None else list(counts)
        self.rank = 0 if comm is None else int(comm.Get_rank())
        self.n = int(sum(counts))
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.offset = int(self.offsets[self.rank])
        self.finite_checked = False

    @property
    def distributed(self):
        return self.comm is not None

    @property
    def lazy(self):
        return is_dask(self.X) or is_dask(self.Y)

    @classmethod
    def from_arrays(cls, X, Y, *, comm=None, n_jobs=0, check_finite=True):
        """Validate the local X (n_local, d) and Y (n_local, m) or (n_local,) on every rank
        and agree on the outcome.

        Each rank checks its own rows (dtype, shape, and, with ``check_finite``, NaN or
        infinite entries counted block by block); the ranks then exchange one small
        summary, and every rank raises the same error when any rank's data are bad or the
        ranks disagree on d or m. ``check_finite=False`` leaves the finiteness check to
        the certificate pass (:func:`relufast.stages.fit.certify`), which counts non-finite
        entries while it reads the samples anyway.
        """
        comm = check_comm(comm)
        error, shape, bad = None, None, 0
        try:
            Xl = _local_array(X, "X", allow_1d=False)
            Yl = _local_array(Y, "Y", allow_1d=True)
            if Xl.shape[0] != Yl.shape[0]:
                raise ValueError(
                    f"X and Y must have the same number of samples (rows); got X with "
                    f"{Xl.shape[0]} rows and Y with {Yl.shape[0]}"
                )
            if Xl.shape[1] == 0 or Yl.shape[1] == 0:
                raise ValueError(f"X and Y must have at least one column; got shapes {Xl.shape} and {Yl.shape}")
            shape = (int(Xl.shape[0]), int(Xl.shape[1]), int(Yl.shape[1]))
            if check_finite and not (is_dask(Xl) or is_dask(Yl)):
                bad = count_nonfinite(Xl, n_jobs) + count_nonfinite(Yl, n_jobs)
        except (TypeError, ValueError, ImportError) as exc:
            error = exc
        summaries = [(None if error is None else (type(error).__name__, str(error)), shape, bad)]
        if comm is not None:
            summaries = comm.allgather(summaries[0])
        for rank, (err, _, _) in enumerate(summaries):
            if err is not None:
                kind = {"TypeError": TypeError, "ImportError": ImportError}.get(err[0], ValueError)
                where = f" (on rank {rank})" if comm is not None else ""
                raise kind(err[1] + where)
        shapes = [s for _, s, _ in summaries if s is not None]  # all set: no rank raised
        dims = {(s[1], s[2]) for s in shapes}
        if len(dims) > 1:
            got = ", ".join(f"rank {r}: d = {s[1]}, m = {s[2]}" for r, s in enumerate(shapes))
            raise ValueError(
                f"every rank must pass samples with the same number of features d and outputs m; got {got}"
            )
        bad_total = sum(b for _, _, b in summaries)
        if bad_total:
            where = "" if comm is None else " over all ranks"
            raise ValueError(
                f"X and Y must contain only finite values; found {bad_total} NaN or infinite entries{where}"
            )
        out = cls(Xl, Yl, comm=comm, n_jobs=n_jobs, counts=[s[0] for s in shapes])
        out.finite_checked = check_finite and not out.lazy
        return out

    def blocks(self, bounded=False):
        """The local samples as aligned (X_b, Y_b) float64 blocks (see the module docstring).

        ``bounded``: NumPy or memmap arrays in slices of BLOCK_ROWS rows (for NumPy work
        whose temporaries would otherwise be O(n)); else as one block (the C++ kernels
        block and thread internally). Dask arrays always come in their own row blocks.
        """
        if self.lazy:
            yield from row_blocks(self.X, self.Y)
        elif bounded and self.n_local > BLOCK_ROWS:
            for s in range(0, self.n_local, BLOCK_ROWS):
                yield self.X[s : s + BLOCK_ROWS], self.Y[s : s + BLOCK_ROWS]
        else:
            yield self.X, self.Y

    def reduce(self, state):
        """Sum a state dict over the ranks (every rank gets the same bits)."""
        return allreduce_state(state, self.comm)

    def allgather(self, value):
        """A small Python value from every rank, in rank order."""
        return [value] if self.comm is None else list(self.comm.allgather(value))

    def accumulate(self, acc, compress=None):
        """Add every local block to ``acc`` (an :class:`relufast.stages.moments.Accumulator`)
        and sum its state over the ranks; returns acc. ``compress`` (m, p): outputs are
        added as ``Y_b @ compress``, one block at a time."""
        for Xb, Yb in self.blocks(bounded=compress is not None):
            if compress is not None:
                Yb = np.ascontiguousarray(Yb @ compress)
            acc.add(Xb, Yb)
        if self.comm is not None:
            acc.set_state(self.reduce(acc.state()))
        return acc

    def map_reduce(self, fn, bounded=True):
        """``sum over blocks and ranks of fn(X_b, Y_b)`` for fn returning a dict of sums
        (``bounded``: see :meth:`blocks`; False for a C++ kernel that blocks itself)."""
        total = None
        for Xb, Yb in self.blocks(bounded=bounded):
            part = fn(Xb, Yb)
            total = part if total is None else _sum_in_order([total, part])
        if total is None:
            total = fn(np.empty((0, self.d)), np.empty((0, self.m)))
        return self.reduce(total)

    def take(self, idx):
        """Rows ``idx`` (global indices, any order, no repeats needed) as in-memory float64
        arrays (len(idx), d) and (len(idx), m), identical on every rank."""
        idx = np.asarray(idx, dtype=np.int64)
        contiguous = len(idx) > 0 and idx[0] >= 0 and np.all(np.diff(idx) == 1)
        if contiguous and self.comm is None and not self.lazy and idx[-1] < self.n_local:
            # A run of rows in one in-memory array (a head): one contiguous copy, no sort.
            a, z = int(idx[0]), int(idx[-1]) + 1
            return take_rows(self.X, None, a, z), take_rows(self.Y, None, a, z).reshape(z - a, self.m)
        if self.comm is None and not self.lazy and type(self.X) is np.ndarray and type(self.Y) is np.ndarray:
            # In memory: one gather in the given order on the method's threads (the sort below
            # is for memmaps, read in file order, and for the ranks' shares).
            if len(idx) and (idx.min() < 0 or idx.max() >= self.n_local):
                raise IndexError(f"sample indices must lie in [0, {self.n_local}); got {idx.min()}..{idx.max()}")
            return take_rows(self.X, idx), take_rows(self.Y, idx).reshape(len(idx), self.m)
        order = np.argsort(idx, kind="stable")
        sidx = idx[order]
        lo, hi = np.searchsorted(sidx, [self.offset, self.offset + self.n_local])
        local = sidx[lo:hi] - self.offset
        Xl, Yl = self.X[local], self.Y[local]
        Xl = np.asarray(Xl.compute()) if is_dask(Xl) else Xl  # one of X, Y may be in memory
        Yl = np.asarray(Yl.compute()) if is_dask(Yl) else Yl
        Xl = np.ascontiguousarray(Xl, dtype=np.float64)
        Yl = np.ascontiguousarray(Yl, dtype=np.float64).reshape(len(local), self.m)
        if self.comm is not None:
            parts = self.comm.allgather((Xl, Yl))
            Xl = np.concatenate([p[0] for p in parts])
            Yl = np.concatenate([p[1] for p in parts])
        Xs = np.empty_like(Xl)
        Ys = np.empty_like(Yl)
        Xs[order], Ys[order] = Xl, Yl
        return Xs, Ys

    def extend(self, stream, size, have=None):
        """Grow ``stream`` (a :class:`SampleStream` over the global rows) to ``size`` and
        return the rows drawn so far, in draw order, appending to ``have`` = (X_s, Y_s)."""
        Xn, Yn = self.take(stream.grow(size))
        if have is None or len(have[0]) == 0:
            return Xn, Yn
        return np.concatenate([have[0], Xn]), np.concatenate([have[1], Yn])

    def gather_all(self):
        """Every sample on every rank (only for methods that need the whole data in memory)."""
        return self.take(np.arange(self.n))


class SampleStream:
    """A growing random sample of ``range(n)`` without repeats: its prefixes are nested,
    so statistics of a prefix are extended by the new indices only.

    Memory is O(size drawn), never O(n); draws depend only on the generator and n, so
    every MPI rank (same ``random_state``, same global n) draws the same indices.
    """

    def __init__(self, n, rng):
        self.n = int(n)
        self.rng = rng
        self.indices = np.empty(0, dtype=np.int64)
        self._sorted = self.indices

    def grow(self, size):
        """Extend the sample to ``min(size, n)`` indices; returns the new ones (draw order)."""
        size = min(int(size), self.n)
        need = size - len(self.indices)
        if need <= 0:
            return np.empty(0, dtype=np.int64)
        if 2 * size > self.n:  # dense: permute what is left (O(n) only when the sample is)
            rest = np.ones(self.n, dtype=bool)
            rest[self.indices] = False
            new = self.rng.permutation(np.flatnonzero(rest))[:need].astype(np.int64)
        else:
            new = np.empty(0, dtype=np.int64)
            while len(new) < need:
                cand = self.rng.integers(0, self.n, size=2 * (need - len(new)) + 16)
                _, first = np.unique(cand, return_index=True)
                cand = cand[np.sort(first)]
                taken = np.concatenate([self._sorted, np.sort(new)])
                taken.sort()
                if len(taken):
                    pos = np.minimum(np.searchsorted(taken, cand), len(taken) - 1)
                    seen = taken[pos] == cand
                else:
                    seen = np.zeros(len(cand), dtype=bool)
                new = np.concatenate([new, cand[~seen][: need - len(new)]])
        self.indices = np.concatenate([self.indices, new])
        self._sorted = np.sort(self.indices)
        return new


# --------------------------------------------------------------------------- order statistics
def _float_keys(y):
    """int64 keys ordered as the float64 values y (both zeros share key 0)."""
    b = np.ascontiguousarray(y, dtype=np.float64).view(np.int64)
    return np.where(b < 0, -(b & np.int64(0x7FFFFFFFFFFFFFFF)), b)


def _key_float(key):
    bits = np.array([key if key >= 0 else (-key) | (1 << 63)], dtype=np.uint64)
    return float(bits.view(np.float64)[0])


def order_statistics(samples, ranks):
    """The values of the first output at 0-based ``ranks`` in the sorted concatenation of
    every rank's outputs (or dask blocks), exactly: bisection on the float order, one small
    allgather per step; every rank gets the same values."""
    Y = samples.Y
    y = np.asarray(Y[:, 0].compute() if is_dask(Y) else Y[:, 0], dtype=np.float64)  # X may be the lazy one
    keys = np.sort(_float_keys(y))
    ends = [e for e in samples.allgather((int(keys[0]), int(keys[-1])) if len(keys) else None) if e]
    bounds = [[min(e[0] for e in ends), max(e[1] for e in ends)] for _ in ranks]
    while any(lo < hi for lo, hi in bounds):
        mids = [(lo + hi) // 2 for lo, hi in bounds]
        local = [int(np.searchsorted(keys, m, side="right")) for m in mids]
        total = np.sum(samples.allgather(local), axis=0)
        for b, m, c, r in zip(bounds, mids, total, ranks):
            if b[0] < b[1]:
                b[0], b[1] = (b[0], m) if c >= r + 1 else (m + 1, b[1])
    return [_key_float(lo) for lo, _ in bounds]


def median(samples):
    """``np.median`` of the first output over every sample, wherever it lives (NumPy, memmap,
    dask, MPI ranks: exact, the same bits on every rank)."""
    if not (samples.distributed or samples.lazy):
        return float(np.median(samples.Y[:, 0]))
    n = samples.n
    lo, hi = order_statistics(samples, [(n - 1) // 2, n // 2])
    return lo if n % 2 else (lo + hi) / 2
