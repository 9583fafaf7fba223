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

from .._blas import crossprod, dgemm_capsule, matmul, product_blocks, single_threaded_blas, thread_map
from .._native import core
from .._validation import check_positive_int, check_xy, resolve_n_jobs
from .reduce import allreduce_state, is_dask, row_blocks
from .tensor import input_span, project

__all__ = [
    "C2_RELU",
    "Accumulator",
    "SecondMomentAccumulator",
    "DetectorAccumulator",
    "hermite_moment",
    "hermite_moment_reference",
    "moment_span",
    "detector_matrix",
    "detector_matrix_reference",
    "Hermite4Accumulator",
    "hermite4_contraction",
    "hermite4_contraction_reference",
    "hermite4_statistics",
    "HermiteAccumulator",
    "projected_hermite_moments",
    "hermite_from_raw",
    "projected_hermite_reference",
]

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
            self._acc.set_state(
                **{key: np.asarray(v, dtype=np.float64) if np.ndim(v) else float(v) for key, v in state.items()}
            )
        return self

    def allreduce(self, comm):
        """Sum the raw sums over the ranks of an mpi4py communicator (in place); returns self."""
        return self.set_state(allreduce_state(self.state(), comm))

    def _require_samples(self):
        if self._acc.count <= 0:
            raise ValueError("no samples accumulated yet: call update(X, Y) first")


#: From this input dimension on the second-moment kernel's block products go to SciPy's
#: dgemm (panels of d - c0 rows by 16 m columns); below it Eigen's are faster. On the 2-core
#: AMD EPYC (AVX2, OpenBLAS Haswell kernels, 2 threads, five alternating runs, GFLOP/s at
#: the median): d = 50, m = 10: Eigen 61.6, BLAS 54.2; d = 64, m = 16: 73.3, 64.0;
#: d = 200, m = 100: 68.6, 82.9; d = 784, m = 128: 61.6, 78.8 (ad-hoc; the benchmark
#: ``bench/test_bench_moments.py`` records both).
BLAS_MIN_FEATURES = 128


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
    blas : bool or None, default=None
        The blocks' products by SciPy's BLAS (its dgemm on the kernel's threads, one BLAS
        thread each) instead of Eigen's; the sums agree to rounding. None: BLAS from
        ``n_features >= BLAS_MIN_FEATURES`` on.

    Notes
    -----
    Cost 2 n m d^2 flops; memory O(m d^2 + threads * block_size * m * d).
    """

    def __init__(self, n_features, n_outputs, *, n_jobs=None, block_size=256, compress=None, blas=None):
        d = check_positive_int(n_features, "n_features")
        m = check_positive_int(n_outputs, "n_outputs")
        super().__init__(core.SecondMoment(d, m), n_jobs=n_jobs, block_size=block_size)
        self._Q = None if compress is None else np.ascontiguousarray(compress, dtype=np.float64)
        self._blas = d >= BLAS_MIN_FEATURES if blas is None else bool(blas)

    def _kernel_update(self, X, Y):
        # Each block's product by SciPy's dgemm on the kernel's threads (the BLAS is held at
        # one thread by ``add``), from BLAS_MIN_FEATURES on (OpenBLAS's kernels beat Eigen's
        # there on AVX2; AVX-512 not measured yet).
        self._acc.update(X, Y, self._n_jobs, self._block, self._Q, dgemm_capsule() if self._blas else None)

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
        super().__init__(
            core.DetectorMoment(np.ascontiguousarray(M, dtype=np.float64)), n_jobs=n_jobs, block_size=block_size
        )

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


def use_mean_span(d, k, m):
    """Whether :func:`moment_span` should take the span of V from the first moment: the
    moment of the ``m`` outputs in that k-dimensional span (``d m + d k + m k^2`` a sample)
    then costs under half the full moment (``m d^2``), and d >= 40. False at the small
    sizes where the full moment is cheap anyway."""
    return d >= 40 and d * m + d * k + m * k * k < 0.5 * m * d * d


def _mean_span(X, Y, k, Q, whitener):
    """Span of V from the first moment ``M = mean_s (Y Q)_s x_w,s^T``: for ReLU units and
    Gaussian inputs ``E[y x^T] = U diag(c_1 ||V_j||) V_unit`` (c_1 = 1/2), of rank k when U
    has rank k. Returns (W (d, k), squared singular values of M, descending, and the
    statistics ``(mean of Y Q, M in the coordinates of x)`` for :func:`_projected_moment`)."""
    from .reduce import Samples

    def part(Xb, Yb):
        Yq = np.asarray(Yb, dtype=np.float64) if Q is None else np.asarray(Yb, dtype=np.float64) @ Q
        return {"count": float(len(Xb)), "y": Yq.sum(axis=0), "yx": crossprod(Yq, np.asarray(Xb, dtype=np.float64))}

    st = X.map_reduce(part) if isinstance(X, Samples) else part(X, Y)
    count = max(st["count"], 1.0)
    M_raw = st["yx"] / count
    M = M_raw if whitener is None else M_raw @ whitener
    _, sv, Vt = np.linalg.svd(M, full_matrices=False)
    return np.ascontiguousarray(Vt[:k].T), sv**2, (st["y"] / count, M_raw)


def _whitened_tensor(acc, whitener):
    T = acc.tensor()
    if whitener is None:
        return T
    d = acc._acc.d
    st = acc.state()
    ybar = st["sum_y"] / st["count"]
    raw = T + ybar[:, None, None] * np.eye(d)  # S_i / n
    return np.einsum("ab,ibc,cd->iad", whitener, raw, whitener) - ybar[:, None, None] * np.eye(d)


def _controlled(Y, Q, ybar, Z, G):
    """``Y Q - ybar - Z G^T`` (``Q`` None: Y) by row blocks on the method's threads, each
    block's products and differences written into one result; the blocks of
    :func:`relufast._blas.matmul` for Z G^T, so the result does not depend on the thread
    count. (Three whole-array passes on one thread took 0.27 s at n = 2e5, m = k = 128.)"""
    n, r = Z.shape[0], G.shape[0]
    out = np.empty((n, r))
    rows, starts = product_blocks(n, Z.shape[1] * r)

    def part(a):
        Yq = Y[a : a + rows] if Q is None else Y[a : a + rows] @ Q
        np.subtract(Yq, ybar, out=out[a : a + rows])
        out[a : a + rows] -= Z[a : a + rows] @ G.T

    thread_map(part, starts)
    return out


def _projected_moment(X, Y, Pm, Q, threads, block_size, control=None):
    """``P[i] = mean_s (Y Q)_si (z_s z_s^T - I)`` with ``z = Pm^T x`` (Pm (d, k)), over the
    arrays (X, Y) or every block and rank of a Samples X.

    With ``control = (mean of Y Q, M = mean (Y Q) x^T)`` (relufast) the outputs enter as
    ``(Y Q)_s - mean - G z_s`` with ``G = M Pm``: for Gaussian z the constant and the linear
    part have zero moment against ``z z^T - I`` (the expectation is unchanged), but they
    carry most of the variance of y (for one ReLU unit, relu(t) = t/2 + |t|/2 leaves
    E[(|t|/2 - E|t|/2)^2] = 0.09 of E[relu(t)^2] = 0.5). These control variates cut the
    sampling error of P by about 2x at the same n."""
    from .reduce import Samples

    m = Y.shape[1] if Q is None and Y is not None else (Q.shape[1] if Q is not None else X.m)
    if control is not None:
        ybar, G = control[0], control[1] @ Pm
    acc = SecondMomentAccumulator(
        Pm.shape[1], m, n_jobs=threads or None, block_size=block_size, compress=None if control is not None else Q
    )
    blocks = X.blocks(bounded=True) if isinstance(X, Samples) else [(X, Y)]
    for Xb, Yb in blocks:
        Z = np.ascontiguousarray(matmul(np.asarray(Xb, dtype=np.float64), Pm))
        if control is not None:
            Yb = _controlled(np.asarray(Yb, dtype=np.float64), Q, ybar, Z, G)
        acc.add(Z, Yb)
    if isinstance(X, Samples) and X.comm is not None:
        acc.set_state(X.reduce(acc.state()))
    return acc.tensor()


def moment_span(X, Y, k, Q, threads, block_size, whitener=None, acc=None, mean_span=False):
    """Moment of ``Y Q`` (Q None: Y itself), span W (d, k), projected tensor P (m, k, k).

    X may be a :class:`relufast.stages.reduce.Samples` (Y is then ignored): the moment
    is then accumulated over all its blocks and ranks. With ``acc`` (an accumulator that
    already holds the sums, e.g. of a growing sample) X and Y are not read.

    With ``whitener`` (d, d symmetric, E[x x^T]^{-1/2}) the moment is that of the whitened
    inputs ``x_w = whitener x`` (BJW19 Remark 3), obtained from the raw sums without a
    whitened copy of X: ``T_w[i] = Wh (S_i / n) Wh - mean(y_i) I``.

    With ``mean_span`` (relufast, not in the paper; ReLU units, m >= k) the span comes from
    the first moment (:func:`_mean_span`) and P from one pass that accumulates the moment of
    ``Y Q`` in the span (inputs ``W^T x_w``), with the outputs' constant and linear part
    as control variates (:func:`_projected_moment`): the full (m, d, d) moment is never
    formed.

    Returns (W, P, eigenvalues of sum_i T[i]^2 (squared singular values of the first
    moment with ``mean_span``) in descending order).
    """
    from .reduce import Samples

    if mean_span:
        W, evals, control = _mean_span(X, Y, k, Q, whitener)
        Pm = np.ascontiguousarray(W if whitener is None else whitener @ W)
        return W, _projected_moment(X, Y, Pm, Q, threads, block_size, control=control), evals
    if acc is None:
        d = X.d if isinstance(X, Samples) else X.shape[1]
        acc = SecondMomentAccumulator(d, k, n_jobs=threads or None, block_size=block_size, compress=Q)
        if isinstance(X, Samples):
            X.accumulate(acc)
        else:
            acc.add(X, Y)
    T = _whitened_tensor(acc, whitener)
    W, evals = input_span(T, k)
    return W, project(T, W), evals


def detector_matrix(X, Y, *, centred=True, n_jobs=None, block_size=256):
    """The linear map T with ``T vec*(u u^T) = f(u)``, f the pure-neuron detector.

    Parameters
    ----------
    X : ndarray of shape (n, d), or a :class:`relufast.stages.reduce.Samples`
        (summed over its blocks and ranks; Y is then None or an output compression (m, k))
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
    from .reduce import Samples

    if isinstance(X, Samples):  # Y is then the output compression (m, k) or None
        data, Pl = X, Y
        st = data.map_reduce(
            lambda Xb, Yb: {"count": float(len(Xb)), "xx": Xb.T @ Xb, "yx": (Yb if Pl is None else Yb @ Pl).T @ Xb}
        )
        C, P = st["xx"] / st["count"], st["yx"] / st["count"]
    else:
        n = X.shape[0]
        C = X.T @ X / n
        P = Y.T @ X / n
    M = np.linalg.solve(C, P.T).T  # P C^{-1}
    acc = DetectorAccumulator(M, n_jobs=n_jobs, block_size=block_size)
    if isinstance(X, Samples):
        data.accumulate(acc, compress=Pl)
    else:
        acc.add(X, Y)
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


# ---- GP19: contractions of the fourth-order Hermite statistic -------------------------


class Hermite4Accumulator(Accumulator):
    """Streaming, mergeable sums that contract the 4th-order Hermite statistic with directions.

    For outputs ``f``, an offset ``c0`` (GP19's preprocessing P0: the median of f) and
    directions ``z_r`` (rows of ``directions``), with ``y = z . x`` and ``ft = f - c0``,
    keeps ``S_p = sum ft y^p`` (p = 1..4), ``G_p = sum ft y^p x`` (p = 1, 3), ``sum ft``,
    the count of all rows and of active rows, and optionally ``M = sum ft x x^T`` and the
    pair sums of GP19's simultaneous landscape (App. B.4). :func:`hermite4_statistics`
    turns them into ``E[ft H_4(z.x)]``, its gradient in z, ``E[ft H_3(z.x)]`` and ``M_2``.
    No d^4 (or n^4) tensor is formed.

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
    (``2 N_act n^2`` more with ``second``), where ``N_act`` is the number of active rows.
    Updates take f of shape (n,) or (n, 1); partial sums merge by addition.
    """

    def __init__(
        self, directions, *, offset=0.0, active_tol=0.0, second=False, pairs=False, n_jobs=None, block_size=1024
    ):
        Z = np.ascontiguousarray(np.asarray(directions, dtype=np.float64))
        if Z.ndim != 2 or Z.shape[1] < 1:
            raise ValueError(f"directions must be a 2-D array (n_directions, n_features); got shape {Z.shape}")
        if not np.isfinite(Z).all():
            raise ValueError("directions must be finite")
        super().__init__(
            core.Hermite4Contraction(Z, float(offset), float(active_tol), bool(second), bool(pairs)),
            n_jobs=n_jobs,
            block_size=block_size,
        )
        self.directions = Z

    def _kernel_update(self, X, Y):
        if Y.shape[1] != 1:
            raise ValueError(f"f must have one output column; got shape {Y.shape}")
        self._acc.update(X, np.ascontiguousarray(Y[:, 0]), self._n_jobs, self._block)

    def sums(self):
        """The raw sums as a dict (keys ``count``, ``n_active``, ``s0``, ``S``, ``G1``, ``G3``, ``M``,
        ``S11``, ``S22``, ``GP``)."""
        return self.state()

    def result(self):
        """:func:`hermite4_statistics` of the sums so far."""
        self._require_samples()
        return hermite4_statistics(self.sums(), self.directions)


def hermite4_contraction(
    X, f, directions, *, offset=0.0, active_tol=0.0, second=False, pairs=False, n_jobs=None, block_size=1024
):
    """Raw sums of :class:`Hermite4Accumulator` over samples (X, f) in one call (C++ kernel).

    X and f are used as given when already float64 C-contiguous (the pipelines' path);
    anything else is validated and converted first.
    """
    acc = Hermite4Accumulator(
        directions,
        offset=offset,
        active_tol=active_tol,
        second=second,
        pairs=pairs,
        n_jobs=n_jobs,
        block_size=block_size,
    )
    X_ok = isinstance(X, np.ndarray) and X.dtype == np.float64 and X.flags.c_contiguous and X.ndim == 2
    f_ok = isinstance(f, np.ndarray) and f.dtype == np.float64 and f.ndim == 1 and f.flags.c_contiguous
    if X_ok and f_ok and len(X) == len(f):
        with single_threaded_blas():
            acc._acc.update(X, f, acc._n_jobs, acc._block)
    else:
        acc.update(X, f)
    return acc.sums()


def hermite4_contraction_reference(X, f, directions, *, offset=0.0, active_tol=0.0, second=False, pairs=False):
    """Plain NumPy reference of :func:`hermite4_contraction` (for tests and benchmarks)."""
    X = np.asarray(X, dtype=np.float64)
    Z = np.asarray(directions, dtype=np.float64)
    ft = np.asarray(f, dtype=np.float64).reshape(-1) - offset
    keep = np.abs(ft) > active_tol if active_tol >= 0 else np.ones(len(ft), dtype=bool)
    Xa, fa = X[keep], ft[keep]
    Y = Xa @ Z.T
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
        out["GP"] = np.zeros((0, 0))
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
    dict
        ``A4`` (R,): ``E[ft H_4(z.x)]`` with GP19's scaled Hermite polynomial
        ``H_k(z.x) = |z|^k h_k(z.x / |z|)``, ``h_k = He_k / sqrt(k!)``; ``grad4`` (R, n): its
        gradient in z; ``A3`` (R,): ``E[ft H_3(z.x)]``; ``A2`` (R,): ``E[ft H_2(z.x)]``;
        ``M2`` (n, n): ``E[ft (x x^T - I)] / sqrt(2)`` when M was kept (GP19 P2, so
        ``A2 = z^T M2 z``); ``n_active_fraction``.
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
        "grad4": (
            4.0 * np.asarray(sums["G3"])
            - 12.0 * r[:, None] * np.asarray(sums["G1"])
            - 12.0 * s2[:, None] * Z
            + 12.0 * (r * s0)[:, None] * Z
        )
        / (math.sqrt(24.0) * N),
        "A3": (s3 - 3.0 * r * s1) / (math.sqrt(6.0) * N),
        "A2": (s2 - r * s0) / (math.sqrt(2.0) * N),
        "n_active_fraction": float(sums["n_active"]) / N,
    }
    M = np.asarray(sums["M"])
    if M.size:
        out["M2"] = (0.5 * (M + M.T) / N - (s0 / N) * np.eye(M.shape[0])) / math.sqrt(2.0)
    return out


# ---- end GP19


class HermiteAccumulator(Accumulator):
    """Streaming, mergeable raw sums for projected Hermite tensors of order 0..6 (C++ kernel).

    For a basis P (d, k) with orthonormal columns, the samples are projected first,
    ``z = P^T x`` (then z ~ N(0, I_k) when x ~ N(0, I_d)), and the kernel keeps
    ``S_r[i] = sum_s y_si z_s^{(x) r}`` for r <= order. :meth:`tensors` turns them into the
    Hermite coefficient tensors ``T_r[i] = mean_s y_si He_r(z_s)`` by the pairing
    formula (ATV21 Sec. 2.5 estimator, in the k-dimensional span: the d^3 and d^4 tensors
    are never formed).

    Parameters
    ----------
    n_outputs : int
    order : int, default=4
        Highest order (0..6; orders 5 and 6 cost k^5 and k^6 per sample: small k only).
    basis : ndarray of shape (n_features, k), optional
        Projection P; without it the samples are used as they are (k = n_features, which
        must then be given as ``n_features``).
    n_features : int, optional
        Input dimension when no basis is given.

    Notes
    -----
    Cost per sample ``2 m (k + k^2 + k^3 + k^4)`` flops (order 4) plus ``2 d k`` for the
    projection, as GEMMs on the row-wise Kronecker square of the projected block.
    """

    def __init__(self, n_outputs, *, order=4, basis=None, n_features=None, n_jobs=None, block_size=256):
        m = check_positive_int(n_outputs, "n_outputs")
        if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or not 0 <= order <= 6:
            raise ValueError(f"order must be an integer in 0..6; got {order!r}")
        if basis is None:
            if n_features is None:
                raise ValueError("give either basis (d, k) or n_features")
            k = check_positive_int(n_features, "n_features")
            self._P = None
        else:
            self._P = np.ascontiguousarray(basis, dtype=np.float64)
            if self._P.ndim != 2 or self._P.shape[1] < 1:
                raise ValueError(f"basis must be a 2-D array of shape (d, k); got shape {self._P.shape}")
            k = self._P.shape[1]
        super().__init__(core.HermiteSums(k, m, int(order)), n_jobs=n_jobs, block_size=block_size)

    def _kernel_update(self, X, Y):
        self._acc.update(X, Y, self._P, self._n_jobs, self._block)

    def tensors(self):
        """``[T_0, ..., T_order]``, ``T_r`` of shape (m,) + (k,) * r."""
        self._require_samples()
        st = self._acc.state()
        return hermite_from_raw(st["count"], [st[f"sums_{r}"] for r in range(self._acc.order + 1)], self._acc.k)

    result = tensors


def _matchings(slots):
    """Every set of disjoint pairs of ``slots`` (the empty set included)."""
    if len(slots) < 2:
        yield ()
        return
    first, rest = slots[0], slots[1:]
    yield from _matchings(rest)  # first slot unpaired
    for j, other in enumerate(rest):
        for sub in _matchings(rest[:j] + rest[j + 1 :]):
            yield ((first, other),) + sub


def hermite_from_raw(count, sums, k):
    """Hermite tensors from raw sums (ATV21 Sec. 2.5, moment/pairing form).

    With ``M_r = S_r / count`` (symmetrised),
    ``T_r = sum_p (-1)^p sum_{p disjoint pairs of the r slots} M_{r-2p}(unpaired slots) (x) delta(pairs)``:
    ``T_2 = M_2 - M_0 I``, ``T_3 = M_3 - sum_3 M_1 (x) delta``,
    ``T_4 = M_4 - sum_6 M_2 (x) delta + M_0 sum_3 delta (x) delta``; 76 terms at r = 6.
    """
    letters = "abcdefghjk"
    M = [np.asarray(S, dtype=np.float64) / float(count) for S in sums]
    m = M[0].shape[0]
    M = [_symmetrize(Mr.reshape((m,) + (k,) * r)) if r >= 2 else Mr.reshape((m,) + (k,) * r) for r, Mr in enumerate(M)]
    I = np.eye(k)
    out = []
    for r in range(len(M)):
        T = np.zeros((m,) + (k,) * r)
        for pairs in _matchings(tuple(range(r))):
            paired = {s for p in pairs for s in p}
            free = "".join(letters[s] for s in range(r) if s not in paired)
            spec = "i" + free + "".join("," + letters[a] + letters[b] for a, b in pairs)
            term = np.einsum(spec + "->i" + letters[:r], M[len(free)], *([I] * len(pairs)))
            T += (-1.0) ** len(pairs) * term
        out.append(T)
    return out


def _symmetrize(T):
    """Average over all permutations of the input modes (axes 1..r)."""
    import itertools

    r = T.ndim - 1
    perms = list(itertools.permutations(range(1, r + 1)))
    return sum(T.transpose((0,) + p) for p in perms) / len(perms)


def projected_hermite_moments(X, Y, basis=None, order=4, *, n_jobs=None, block_size=256, n_batches=1):
    """Hermite coefficient tensors ``T_r = mean_s y_s He_r(P^T x_s)``, r = 0..order.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    Y : array-like of shape (n_samples, n_outputs) or (n_samples,)
    basis : ndarray of shape (n_features, k), optional
        Orthonormal columns; default: the identity (k = n_features).
    order : int, default=4
    n_jobs, block_size
        Threads and samples per GEMM block of the C++ kernel.
    n_batches : int, default=1
        With b > 1 the samples are cut into b contiguous batches, accumulated separately
        and merged; the spread of the batch tensors estimates their noise.

    Returns
    -------
    tensors : list of ndarray
        ``T_r`` of shape (n_outputs,) + (k,) * r.
    stderr : list of ndarray (only when ``n_batches > 1``)
        Standard error of each entry of ``T_r`` from the batch spread.
    """
    X, Y = check_xy(X, Y)
    n_batches = check_positive_int(n_batches, "n_batches")
    n = X.shape[0]
    kw = dict(order=order, basis=basis, n_features=X.shape[1], n_jobs=n_jobs, block_size=block_size)
    if n_batches == 1:
        return HermiteAccumulator(Y.shape[1], **kw).add(X, Y).tensors()
    n_batches = min(n_batches, n)
    cuts = np.linspace(0, n, n_batches + 1).astype(int)
    accs = [HermiteAccumulator(Y.shape[1], **kw).add(X[a:b], Y[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
    parts = [acc.tensors() for acc in accs]
    total = accs[0]
    for acc in accs[1:]:
        total.merge(acc)
    tensors = total.tensors()
    w = np.diff(cuts) / n
    stderr = []
    for r in range(len(tensors)):
        dev = np.stack([p[r] - tensors[r] for p in parts])
        var = np.tensordot(w, dev**2, axes=1) / max(n_batches - 1, 1)
        stderr.append(np.sqrt(var))
    return tensors, stderr


def projected_hermite_reference(X, Y, basis=None, order=4):
    """Plain NumPy reference (recursion form of He_r, ATV21 Sec. 2.2) for tests."""
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64).reshape(X.shape[0], -1)
    Z = X if basis is None else X @ np.asarray(basis, dtype=np.float64)
    n, k = Z.shape
    I = np.eye(k)
    He = [np.ones((n,)), Z]
    for r in range(2, order + 1):
        prev, prev2 = He[r - 1], He[r - 2]
        # He_r(z)_{i1..ir} = z_ir He_{r-1}_{i1..i(r-1)} - sum_s delta_{is ir} He_{r-2}(without s)
        new = prev[..., None] * Z.reshape((n,) + (1,) * (r - 1) + (k,))
        for s in range(r - 1):
            t = np.moveaxis(prev2[..., None, None] * I, -2, s + 1) if r > 2 else (prev2[:, None, None] * I)
            new = new - t
        He.append(new)
    return [np.tensordot(Y.T, He[r], axes=1) / n for r in range(order + 1)]
