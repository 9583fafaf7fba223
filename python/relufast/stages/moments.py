"""Hermite cross moments of outputs and inputs, streamed and mergeable.

For a two-layer ReLU network ``y = U relu(V x)`` with standard Gaussian inputs,

.. math:: T[i] = E[y_i (x x^T - I)] = c_2 \\sum_j U_{ij} \\|V_j\\| \\hat v_j \\hat v_j^T,
          \\qquad c_2 = 1/\\sqrt{2\\pi},

an m x d x d tensor whose factors are (U, V^T, V^T). This is the moment relufast uses in
place of the third-order score tensor of BJW19 Alg. 4 (step 3), which vanishes for ReLU
because E[relu(z) He_3(z)] = 0 (see ``docs/bjw19.md``).

The accumulator keeps raw sums, so partial results from chunks, threads and MPI ranks
merge by addition and agree with a one-shot computation to rounding.
"""
from __future__ import annotations

import math
import threading

import numpy as np

from .._blas import single_threaded_blas
from .._native import core
from .._validation import check_positive_int, check_xy, resolve_n_jobs
from .reduce import allreduce_state, is_dask, row_blocks
from .tensor import input_span, project

__all__ = ["C2_RELU", "Accumulator", "SecondMomentAccumulator", "DetectorAccumulator", "hermite_moment",
           "hermite_moment_reference", "moment_span", "detector_matrix", "detector_matrix_reference"]

#: E[relu(z) He_2(z)] for z ~ N(0, 1).
C2_RELU = 1.0 / math.sqrt(2.0 * math.pi)


class Accumulator:
    """Streaming, mergeable raw sums of a moment, computed by a C++ kernel.

    The base of every relufast moment: subclasses name the kernel and turn the sums into
    the statistic (:meth:`result`). Updates take NumPy arrays or dask arrays (reduced one
    row block at a time); accumulators merge by adding their sums, so chunks, threads, MPI
    ranks (:meth:`allreduce`) and dask blocks all reduce the same way. One accumulator may
    be fed from several threads: the C++ kernel computes an update's sums without a lock
    and adds them to the state under its own lock, so updates run concurrently and none
    is lost; merges and ``set_state`` also take a Python lock.
    """

    def __init__(self, kernel, *, n_jobs=None, block_size=256):
        self._acc = kernel
        self._n_jobs = resolve_n_jobs(n_jobs)
        self._block = check_positive_int(block_size, "block_size")
        self._lock = threading.Lock()

    @property
    def n_samples(self):
        return int(self._acc.count)

    def _kernel_update(self, X, Y):
        self._acc.update(X, Y, self._n_jobs, self._block)

    def add(self, X, Y):
        """Add validated float64 C-contiguous blocks (the pipelines' path: the facade has
        checked the data once); returns self."""
        with single_threaded_blas():  # no Python lock: the kernel locks only its final merge
            self._kernel_update(X, Y)
        return self

    def update(self, X, Y):
        """Add samples X of shape (n, d) with outputs Y of shape (n, m); returns self.

        X and Y may be dask arrays: their row blocks are computed one at a time and added,
        so memory stays at one block.
        """
        if is_dask(X) or is_dask(Y):
            for Xb, Yb in row_blocks(X, Y):
                self.update(Xb, Yb)
            return self
        return self.add(*check_xy(X, Y))

    def merge(self, other):
        """Add another accumulator's sums (same kind and shape); returns self."""
        if type(other) is not type(self):
            raise TypeError(f"can only merge a {type(self).__name__}; got {type(other).__name__}")
        with self._lock:
            self._acc.merge(other._acc)
        return self

    def state(self):
        """The raw sums as a dict of arrays (``count`` first)."""
        return {key: np.asarray(value) for key, value in self._acc.state().items()}

    def set_state(self, state):
        """Replace the raw sums (e.g. by sums reduced elsewhere); returns self."""
        with self._lock:
            self._acc.set_state(**{key: np.asarray(v, dtype=np.float64) if np.ndim(v) else float(v)
                                   for key, v in state.items()})
        return self

    def allreduce(self, comm):
        """Sum the raw sums over the ranks of an mpi4py communicator (in place); returns self."""
        return self.set_state(allreduce_state(self.state(), comm))

    def _require_samples(self):
        if self._acc.count <= 0:
            raise ValueError("no samples accumulated yet: call update(X, Y) first")


class SecondMomentAccumulator(Accumulator):
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
    compress : ndarray of shape (p, n_outputs), optional
        Output compression: updates then take outputs of p columns and accumulate the
        moment of ``Y @ compress`` (done per block inside the kernel, no copy of Y).

    Notes
    -----
    Cost 2 n m d^2 flops; memory O(m d^2 + threads * block_size * m * d).
    """

    def __init__(self, n_features, n_outputs, *, n_jobs=None, block_size=256, compress=None):
        d = check_positive_int(n_features, "n_features")
        m = check_positive_int(n_outputs, "n_outputs")
        super().__init__(core.SecondMoment(d, m), n_jobs=n_jobs, block_size=block_size)
        self._Q = None if compress is None else np.ascontiguousarray(compress, dtype=np.float64)

    def _kernel_update(self, X, Y):
        self._acc.update(X, Y, self._n_jobs, self._block, self._Q)

    def tensor(self):
        """T of shape (m, d, d): ``T[i] = mean_s y_si (x_s x_s^T - I)``, symmetric slices."""
        self._require_samples()
        d, m = self._acc.d, self._acc.m
        return self._acc.tensor().reshape(m, d, d)

    result = tensor


class DetectorAccumulator(Accumulator):
    """Streaming, mergeable GKLW19 detector sums (C++ kernel, covariance form).

    Parameters
    ----------
    M : ndarray of shape (k, d)
        The linear predictor ``P C^{-1}`` from a first pass (see :func:`detector_matrix`).
    """

    def __init__(self, M, *, n_jobs=None, block_size=256):
        super().__init__(core.DetectorMoment(np.ascontiguousarray(M, dtype=np.float64)),
                         n_jobs=n_jobs, block_size=block_size)

    def matrix(self, centred=True):
        """The detector matrix T (d (d+1)/2, k (k+1)/2); ``centred``: Alg. 3, else Alg. 2."""
        self._require_samples()
        return self._acc.matrix(centred)

    result = matrix


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
    if not (is_dask(X) or is_dask(Y)):
        X, Y = check_xy(X, Y)
    m = Y.shape[1] if len(Y.shape) == 2 else 1
    acc = SecondMomentAccumulator(X.shape[1], m, n_jobs=n_jobs, block_size=block_size).update(X, Y)
    if comm is not None:
        acc.allreduce(comm)
    return acc.tensor()


def hermite_moment_reference(X, Y):
    """Plain NumPy reference of :func:`hermite_moment` (for tests and benchmarks)."""
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64).reshape(X.shape[0], -1)
    n, d = X.shape
    T = np.einsum("si,sj,sk->ijk", Y, X, X) / n
    T -= Y.mean(axis=0)[:, None, None] * np.eye(d)[None]
    return T


def moment_span(X, Y, k, Q, threads, block_size, whitener=None):
    """Moment of ``Y Q`` (Q None: Y itself), span W (d, k), projected tensor P (k, k, k).

    With ``whitener`` (d, d symmetric, E[x x^T]^{-1/2}) the moment is that of the whitened
    inputs ``x_w = whitener x`` (BJW19 Remark 3), obtained from the raw sums without a
    whitened copy of X: ``T_w[i] = Wh (S_i / n) Wh - mean(y_i) I``.

    Returns (W, P, eigenvalues of sum_i T[i]^2 in descending order).
    """
    d = X.shape[1]
    acc = SecondMomentAccumulator(d, k, n_jobs=threads or None, block_size=block_size, compress=Q).add(X, Y)
    T = acc.tensor()
    if whitener is not None:
        st = acc.state()
        ybar = st["sum_y"] / st["count"]
        raw = T + ybar[:, None, None] * np.eye(d)  # S_i / n
        T = np.einsum("ab,ibc,cd->iad", whitener, raw, whitener) - ybar[:, None, None] * np.eye(d)
    W, evals = input_span(T, k)
    return W, project(T, W), evals


def detector_matrix(X, Y, *, centred=True, n_jobs=None, block_size=256):
    """The linear map T with ``T vec*(u u^T) = f(u)``, f the pure-neuron detector.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    Y : ndarray of shape (n, k)
    centred : bool, default=True
        True: the noise-corrected detector of Algorithm 3 (eq. 11), exact under any output
        noise independent of x. False: Algorithm 2's detector (biased under noise).

    Returns
    -------
    T : ndarray of shape (d (d+1) / 2, k (k+1) / 2)
        Rows are the weighted vech of the paper's d^2 rows (same singular values).
    C : ndarray (d, d)
        E[x x^T].
    P : ndarray (k, d)
        E[y x^T].
    """
    n = X.shape[0]
    C = X.T @ X / n
    P = Y.T @ X / n
    M = np.linalg.solve(C, P.T).T  # P C^{-1}
    acc = DetectorAccumulator(M, n_jobs=n_jobs, block_size=block_size).add(X, Y)
    return acc.matrix(centred), C, P


def detector_matrix_reference(X, Y, *, centred=True):
    """Plain NumPy version of :func:`detector_matrix` (for tests and benchmarks)."""
    n, d = X.shape
    k = Y.shape[1]
    C = X.T @ X / n
    P = Y.T @ X / n
    Yt = X @ np.linalg.solve(C, P.T)
    iu_d, iu_k = np.triu_indices(d), np.triu_indices(k)
    wd = np.where(iu_d[0] == iu_d[1], 1.0, math.sqrt(2.0))
    Phi = X[:, iu_d[0]] * X[:, iu_d[1]] * wd
    a, c = iu_k
    Psi = Y[:, a] * Yt[:, c] + Y[:, c] * Yt[:, a] - Y[:, a] * Y[:, c]
    Psi = np.where(a == c, Psi, 2.0 * Psi)
    T = Phi.T @ Psi / n
    if centred:
        T -= np.outer(Phi.mean(axis=0), Psi.mean(axis=0))
    return T, C, P
