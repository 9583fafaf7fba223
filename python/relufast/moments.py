"""Hermite cross moments of outputs and inputs, streamed and mergeable.

For a two-layer ReLU network ``y = U relu(V x)`` with standard Gaussian inputs,

.. math:: T[i] = E[y_i (x x^T - I)] = c_2 \\sum_j U_{ij} \\|V_j\\| \\hat v_j \\hat v_j^T,
          \\qquad c_2 = 1/\\sqrt{2\\pi},

an m x d x d tensor whose factors are (U, V^T, V^T). This is the moment relufast uses in
place of the third-order score tensor of BJW19 Alg. 4 (step 3), which vanishes for ReLU
because E[relu(z) He_3(z)] = 0 (see ``shared/spec/bjw19.md``, Sec. 2.5 and 3.2).

The accumulator keeps raw sums, so partial results from chunks, threads and MPI ranks
merge by addition and agree with a one-shot computation to rounding.
"""
from __future__ import annotations

import math

import numpy as np

from ._blas import single_threaded_blas
from ._native import core
from ._validation import check_positive_int, check_xy, resolve_n_jobs

__all__ = ["C2_RELU", "SecondMomentAccumulator", "hermite_moment", "hermite_moment_reference",
           "Hermite4Accumulator", "hermite4_contraction", "hermite4_contraction_reference",
           "hermite4_statistics"]

#: E[relu(z) He_2(z)] for z ~ N(0, 1).
C2_RELU = 1.0 / math.sqrt(2.0 * math.pi)


class SecondMomentAccumulator:
    """Streaming, mergeable accumulator of ``sum_s y_s (x) x_s x_s^T`` (C++ kernel).

    Parameters
    ----------
    n_features : int
        Input dimension d.
    n_outputs : int
        Output dimension m.
    n_jobs : int or None, default=None
        Threads for :meth:`update` (None or -1: all cores).
    block_size : int, default=256
        Samples per GEMM block; each thread keeps one accumulator and one block workspace
        of ``block_size * n_outputs * n_features`` doubles.

    Notes
    -----
    Cost 2 n m d^2 flops; memory O(m d^2 + threads * block_size * m * d).
    """

    def __init__(self, n_features, n_outputs, *, n_jobs=None, block_size=256):
        d = check_positive_int(n_features, "n_features")
        m = check_positive_int(n_outputs, "n_outputs")
        self._n_jobs = resolve_n_jobs(n_jobs)
        self._block = check_positive_int(block_size, "block_size")
        self._acc = core.SecondMoment(d, m)

    @property
    def n_samples(self):
        return int(self._acc.count)

    def update(self, X, Y):
        """Add samples X of shape (n, d) with outputs Y of shape (n, m); returns self.

        X and Y may be dask arrays: their row blocks are computed one at a time and added,
        so memory stays at one block.
        """
        if _is_dask(X) or _is_dask(Y):
            for Xb, Yb in _dask_row_blocks(X, Y):
                self.update(Xb, Yb)
            return self
        X, Y = check_xy(X, Y)
        with single_threaded_blas():
            self._acc.update(X, Y, self._n_jobs, self._block)
        return self

    def merge(self, other):
        """Add another accumulator's sums (same d and m); returns self."""
        if not isinstance(other, SecondMomentAccumulator):
            raise TypeError(f"can only merge a SecondMomentAccumulator; got {type(other).__name__}")
        self._acc.merge(other._acc)
        return self

    def state(self):
        """The raw sums as a dict of arrays: ``count``, ``sum_y`` (m,), ``sum_yxx`` (d, m*d)."""
        return {
            "count": np.array(self._acc.count),
            "sum_y": self._acc.sum_y,
            "sum_yxx": self._acc.sum_yxx,
        }

    def allreduce(self, comm):
        """Sum the raw sums over the ranks of an mpi4py communicator (in place); returns self."""
        st = self.state()
        total = {key: comm.allreduce(value) for key, value in st.items()}
        self._acc.set_state(
            float(total["count"]),
            np.asarray(total["sum_y"], dtype=np.float64),
            np.asfortranarray(total["sum_yxx"], dtype=np.float64),
        )
        return self

    def tensor(self):
        """T of shape (m, d, d): ``T[i] = mean_s y_si (x_s x_s^T - I)``, symmetric slices."""
        if self._acc.count <= 0:
            raise ValueError("no samples accumulated yet: call update(X, Y) first")
        d, m = self._acc.d, self._acc.m
        return self._acc.tensor().reshape(m, d, d)


def hermite_moment(X, Y, order=2, *, n_jobs=None, block_size=256, comm=None):
    """Second-order Hermite cross moment ``T[i] = mean_s Y[s, i] (x_s x_s^T - I)``.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Inputs (ideally standard Gaussian).
    Y : array-like of shape (n_samples, n_outputs) or (n_samples,)
        Outputs.
    order : int, default=2
        Order of the Hermite tensor. Only 2 is implemented.
    n_jobs : int or None, default=None
        Threads (None or -1: all cores).
    block_size : int, default=256
        Samples per GEMM block.
    comm : mpi4py communicator, optional
        When given, each rank passes its own samples and all ranks receive the moment of
        the union.

    X and Y may also be dask arrays (row blocks are computed and reduced one at a time).

    Returns
    -------
    T : ndarray of shape (n_outputs, n_features, n_features)

    Notes
    -----
    Replaces BJW19 Alg. 4, step 3 (the third-order score tensor, zero for ReLU). For
    ``y = U relu(V x)`` and ``x ~ N(0, I)``, ``E T = c_2 sum_j U[:, j] (x) v_j (x) v_j``
    with unit rows ``v_j`` scaled by ``||V_j||``. Cost 2 n m d^2 flops in a blocked,
    multithreaded GEMM.
    """
    if order != 2:
        raise ValueError(f"order must be 2 (the only order implemented); got {order!r}")
    if _is_dask(X) or _is_dask(Y):
        m = Y.shape[1] if len(Y.shape) == 2 else 1
        acc = SecondMomentAccumulator(X.shape[1], m, n_jobs=n_jobs, block_size=block_size).update(X, Y)
        if comm is not None:
            acc.allreduce(comm)
        return acc.tensor()
    X, Y = check_xy(X, Y)
    acc = SecondMomentAccumulator(X.shape[1], Y.shape[1], n_jobs=n_jobs, block_size=block_size)
    with single_threaded_blas():
        acc._acc.update(X, Y, acc._n_jobs, acc._block)
    if comm is not None:
        acc.allreduce(comm)
    return acc.tensor()


def _is_dask(a):
    return hasattr(a, "dask") and hasattr(a, "chunks") and not isinstance(a, np.ndarray)


def _dask_row_blocks(X, Y):
    """Aligned row blocks of dask (or NumPy) arrays X and Y, as NumPy arrays."""
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
        yield np.asarray(X.blocks[i, 0].compute()), np.asarray(Y.blocks[i, 0].compute())


def hermite_moment_reference(X, Y):
    """Plain NumPy reference of :func:`hermite_moment` (for tests and benchmarks)."""
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64).reshape(X.shape[0], -1)
    n, d = X.shape
    T = np.einsum("si,sj,sk->ijk", Y, X, X) / n
    T -= Y.mean(axis=0)[:, None, None] * np.eye(d)[None]
    return T


# ---- GP19: contractions of the fourth-order Hermite statistic -------------------------

_H4_KEYS = ("count", "n_active", "s0", "S", "G1", "G3", "M", "S11", "S22", "GP")


class Hermite4Accumulator:
    """Streaming, mergeable sums that contract the 4th-order Hermite statistic with directions.

    For outputs ``f``, an offset ``c0`` (GP19's preprocessing P0: the median of f) and
    directions ``z_r`` (rows of ``directions``), with ``y = z . x`` and ``ft = f - c0``,
    keeps ``S_p = sum ft y^p`` (p = 1..4), ``G_p = sum ft y^p x`` (p = 1, 3), ``sum ft``,
    the count of all rows and of active rows, and optionally ``M = sum ft x x^T`` and the
    pair sums of GP19's simultaneous landscape (App. B.4). :func:`hermite4_statistics`
    turns them into ``E[ft H_4(z.x)]``, its gradient in z, ``E[ft H_3(z.x)]`` and ``M_2``.
    The d^4 (or n^4) tensor is never formed.

    Parameters
    ----------
    directions : array-like of shape (n_directions, n_features)
        The z_r (need not be unit; may have 0 rows when only ``M`` is wanted).
    offset : float, default=0.0
        The constant c0 subtracted from f.
    active_tol : float, default=0.0
        Rows with ``|f - c0| <= active_tol`` carry only the constant term and are skipped
        inside the kernel (GP19 preprocessing P1; exact for ``active_tol = 0``). A negative
        value turns the filter off.
    second : bool, default=False
        Also keep ``M = sum ft x x^T``.
    pairs : bool, default=False
        Also keep ``S11 = sum ft y_j y_k``, ``S22 = sum ft y_j^2 y_k^2`` and
        ``GP_j = sum ft y_j (sum_{k != j} y_k^2) x``.
    n_jobs : int or None, default=None
        Threads (None or -1: all cores).
    block_size : int, default=1024
        Samples per block; each thread gathers the active rows of a block into a buffer.

    Notes
    -----
    Cost per update: a pass over f, plus about ``6 N_act n R`` flops on the active rows
    (``2 N_act n^2`` more with ``second``). Partial sums merge by addition.
    """

    def __init__(self, directions, *, offset=0.0, active_tol=0.0, second=False, pairs=False, n_jobs=None,
                 block_size=1024):
        Z = np.ascontiguousarray(np.asarray(directions, dtype=np.float64))
        if Z.ndim != 2:
            raise ValueError(f"directions must be a 2-D array (n_directions, n_features); got shape {Z.shape}")
        offset = float(offset)
        self._n_jobs = resolve_n_jobs(n_jobs)
        self._block = check_positive_int(block_size, "block_size")
        self._acc = core.Hermite4Contraction(Z, offset, float(active_tol), bool(second), bool(pairs))
        self.directions = Z

    @property
    def n_samples(self):
        return int(self._acc.count)

    def update(self, X, f):
        """Add samples X of shape (n, n_features) with outputs f of shape (n,) or (n, 1); returns self."""
        if _is_dask(X) or _is_dask(f):
            for Xb, fb in _dask_row_blocks(X, f):
                self.update(Xb, fb)
            return self
        X, F = check_xy(X, f)
        if F.shape[1] != 1:
            raise ValueError(f"f must have one output column; got shape {F.shape}")
        with single_threaded_blas():
            self._acc.update(X, np.ascontiguousarray(F[:, 0]), self._n_jobs, self._block)
        return self

    def merge(self, other):
        """Add another accumulator's sums (same directions, offset and options); returns self."""
        if not isinstance(other, Hermite4Accumulator):
            raise TypeError(f"can only merge a Hermite4Accumulator; got {type(other).__name__}")
        self._acc.merge(other._acc)
        return self

    def sums(self):
        """The raw sums as a dict (keys ``count``, ``n_active``, ``s0``, ``S``, ``G1``, ``G3``, ``M``,
        ``S11``, ``S22``, ``GP``)."""
        return {key: getattr(self._acc, key) for key in _H4_KEYS}


def hermite4_contraction(X, f, directions, *, offset=0.0, active_tol=0.0, second=False, pairs=False,
                         n_jobs=None, block_size=1024):
    """Raw sums of :class:`Hermite4Accumulator` over samples (X, f) in one call (C++ kernel)."""
    return Hermite4Accumulator(directions, offset=offset, active_tol=active_tol, second=second, pairs=pairs,
                               n_jobs=n_jobs, block_size=block_size).update(X, f).sums()


def hermite4_contraction_reference(X, f, directions, *, offset=0.0, active_tol=0.0, second=False,
                                   pairs=False):
    """Plain NumPy reference of :func:`hermite4_contraction` (for tests and benchmarks)."""
    X = np.asarray(X, dtype=np.float64)
    Z = np.asarray(directions, dtype=np.float64)
    ft = np.asarray(f, dtype=np.float64).reshape(-1) - offset
    keep = np.abs(ft) > active_tol if active_tol >= 0 else np.ones(len(ft), dtype=bool)
    Xa, fa = X[keep], ft[keep]
    Y = Xa @ Z.T
    n = X.shape[1]
    out = {
        "count": float(len(ft)),
        "n_active": float(keep.sum()),
        "s0": float(fa.sum()),
        "S": np.stack([(fa[:, None] * Y**p).sum(axis=0) for p in (1, 2, 3, 4)], axis=1).reshape(len(Z), 4),
        "G1": (fa[:, None] * Y).T @ Xa,
        "G3": (fa[:, None] * Y**3).T @ Xa,
        "M": (Xa.T * fa) @ Xa if second else np.zeros((0, 0)),
    }
    if pairs:
        Y2 = Y * Y
        out["S11"] = (Y.T * fa) @ Y
        out["S22"] = (Y2.T * fa) @ Y2
        out["GP"] = (fa[:, None] * Y * (Y2.sum(axis=1, keepdims=True) - Y2)).T @ Xa
    else:
        out["S11"] = out["S22"] = np.zeros((0, 0))
        out["GP"] = np.zeros((0, n))
    return out


def hermite4_statistics(sums, directions):
    """Normalised Hermite statistics from the raw sums of :class:`Hermite4Accumulator`.

    Parameters
    ----------
    sums : dict
        From :meth:`Hermite4Accumulator.sums` (or the reference).
    directions : ndarray of shape (R, n)
        The directions the sums were taken with.

    Returns
    -------
    dict with ``A4`` (R,): ``E[ft H_4(z.x)]`` with GP19's scaled Hermite polynomial
    ``H_4(z.x) = |z|^4 h_4(z.x/|z|)``; ``grad4`` (R, n): its gradient in z; ``A3`` (R,):
    ``E[ft H_3(z.x)]``; ``A2`` (R,): ``E[ft H_2(z.x)]``; ``M2`` (n, n):
    ``E[ft (x x^T - I)] / sqrt(2)`` when M was kept (GP19 P2, so ``A2 = z^T M2 z``);
    ``n_active_fraction``.
    """
    Z = np.asarray(directions, dtype=np.float64)
    N = float(sums["count"])
    if N <= 0:
        raise ValueError("no samples accumulated yet: call update(X, f) first")
    s0 = float(sums["s0"])
    S = np.asarray(sums["S"]).reshape(len(Z), 4)
    r = np.einsum("ij,ij->i", Z, Z)
    s1, s2, s3, s4 = S.T
    out = {
        "A4": (s4 - 6.0 * r * s2 + 3.0 * r**2 * s0) / (math.sqrt(24.0) * N),
        "grad4": (4.0 * sums["G3"] - 12.0 * r[:, None] * sums["G1"] - 12.0 * s2[:, None] * Z
                  + 12.0 * (r * s0)[:, None] * Z) / (math.sqrt(24.0) * N),
        "A3": (s3 - 3.0 * r * s1) / (math.sqrt(6.0) * N),
        "A2": (s2 - r * s0) / (math.sqrt(2.0) * N),
        "n_active_fraction": float(sums["n_active"]) / N,
    }
    M = np.asarray(sums["M"])
    if M.size:
        out["M2"] = (0.5 * (M + M.T) / N - (s0 / N) * np.eye(M.shape[0])) / math.sqrt(2.0)
    return out
