"""Keep NumPy's BLAS single-threaded while relufast's own threads run.

OpenBLAS worker threads spin for a while after each multithreaded call, and a C++ kernel
started right after shares the cores with them. Measured here with n = 1e5, d = 50,
m = 10 (``bench/test_bench_ica_blas.py``): the moment kernel takes 74-100 ms right after
a 2-thread NumPy GEMM, but 48-55 ms when that GEMM ran under a one-thread limit, because
then no worker is woken. Setting the limit does not stop workers that an earlier call
(made outside relufast) left spinning. The pipelines therefore run their own NumPy work
under this limit; their large products go by row blocks on relufast's own threads, each
block one BLAS call on one thread (:func:`matmul`, :func:`crossprod`), and only LAPACK
calls too large to mind the spinning lift the limit to the method's ``n_jobs``
(:func:`blas_threads`). ``n_jobs`` reaches these helpers as the thread budget of the
running method (:func:`thread_budget`, set by every method's wrapper). It uses threadpoolctl when that
is installed (it comes with the ``test`` extra); otherwise this is a no-op.

threadpoolctl limits are process-wide, and each ``threadpool_limits`` object restores the
limits it saw on entry. Two overlapping calls from different threads would therefore
leave BLAS at one thread for good (the second saw the first's limit as "original"). The
limit is instead reference-counted under a lock: the first caller to enter sets it, the
last to leave restores the limits that held before the first entered, whichever threads
they are. threadpoolctl >= 3.8 lets only one "controlling" thread change OpenBLAS limits
and ignores the others; relufast releases that control after each change, so the thread
that restores the limits need not be the one that set them.
"""

import contextlib
import contextvars
import functools
import os
import threading

import numpy as np

try:
    import threadpoolctl as _tpc
except ImportError:  # pragma: no cover - optional
    _tpc = None

_lock = threading.Lock()
_depth = 0
_lifted = 0  # blas_threads lifts in progress (under _lock)
_active: "_tpc.threadpool_limits | None" = None  # the limits object of the outermost entry


def _release_control():
    clear = getattr(getattr(_tpc, "OpenBLASController", None), "clear_controlling_thread", None)
    if clear is not None:
        clear(force=True)


@contextlib.contextmanager
def _single_threaded():
    global _depth, _active
    with _lock:
        if _depth == 0:
            _active = _tpc.threadpool_limits(limits=1, user_api="blas")
            _release_control()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                active, _active = _active, None
                assert active is not None  # set when _depth went 0 -> 1
                active.restore_original_limits()
                _release_control()


@functools.cache
def dgemm_capsule():
    """The capsule of SciPy's Fortran dgemm (scipy.linalg.cython_blas), for a C++ kernel to
    call on its own threads (the BLAS held at one thread, :func:`single_threaded_blas`);
    None where SciPy does not export it (Eigen's product then)."""
    try:
        from scipy.linalg import cython_blas

        return cython_blas.__pyx_capi__["dgemm"]
    except (ImportError, AttributeError, KeyError):  # pragma: no cover - every SciPy we support has it
        return None


def single_threaded_blas():
    """Context manager: NumPy's BLAS at one thread inside; safe to nest and to share
    between threads (the original limits come back when the last user leaves)."""
    if _tpc is None:
        return contextlib.nullcontext()
    return _single_threaded()


# ---- The thread budget of the running method, and BLAS lifted to it for large products ----

_BUDGET: contextvars.ContextVar[int] = contextvars.ContextVar("relufast_threads", default=0)


def cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def kernel_threads() -> int:
    """Threads for relufast's kernels in the running method: its ``n_jobs`` as the C++
    kernels take it (0 means every core; see :func:`relufast._validation.resolve_n_jobs`).
    Outside a method, 0."""
    return _BUDGET.get()


def _budget_threads() -> int:
    """:func:`kernel_threads` as a count of threads (0, every core, made the core count)."""
    threads = kernel_threads()
    return cores() if threads <= 0 else min(threads, cores())


@contextlib.contextmanager
def thread_budget(n_jobs):
    """Run a method with ``n_jobs`` threads (None or -1: every core; anything invalid is left
    for the method's own check to reject) as the budget of :func:`kernel_threads` and
    :func:`blas_threads`."""
    from ._validation import resolve_n_jobs

    try:
        threads = resolve_n_jobs(n_jobs)
    except (TypeError, ValueError):
        threads = _BUDGET.get()
    token = _BUDGET.set(threads)
    try:
        yield
    finally:
        _BUDGET.reset(token)


_libs: list | None = None


def _blas_libraries():
    global _libs
    if _libs is None:
        _libs = [] if _tpc is None else list(_tpc.ThreadpoolController().select(user_api="blas").lib_controllers)
    return _libs


#: Multiply-adds from which :func:`blas_threads` lifts the limit: a tenth of a second or more
#: on one core, about as long as OpenBLAS's workers spin after a call (2^28 cycles, its
#: default) beside whatever runs next.
BLAS_LIFT_MIN_WORK = 4e9


@contextlib.contextmanager
def blas_threads(work=None):
    """Inside :func:`single_threaded_blas`, NumPy's BLAS at the running method's thread budget
    (:func:`kernel_threads`) for one large LAPACK call (an SVD or least squares that cannot
    be cut into blocks; use :func:`matmul` for products); left at one thread when ``work``
    (multiply-adds) is below BLAS_LIFT_MIN_WORK.

    OpenBLAS on several threads is slower than on one for small calls (a 128 x 128
    Cholesky: 0.36 ms on one thread, 0.64 ms on two here), and its workers spin after the
    call: the C++ certificate right after the fit's least squares lifted to 2 threads took
    0.125 s instead of 0.070 s (n = 1e6, d = 50, k = 10, 2 cores). Setting the limit is one
    call into each BLAS library (about a microsecond); like every BLAS limit it is
    process-wide. Outside a relufast method (no single-thread limit in force) this does
    nothing: the BLAS runs as its user set it.
    """
    global _lifted
    threads = _budget_threads()
    lift = False
    # Under the lock of the single-thread limit, and only while that limit holds (inside a
    # relufast method): the limit's last user restores the limits it saw on entry, so a lift
    # that changed them outside, or restored what it saw itself, could leave the BLAS at one
    # thread for good when calls overlap (found by test_concurrent_recover_calls_leave_
    # blas_threads_alone). Concurrent lifts share one: the first sets it, the last ends it.
    with _lock:
        if _tpc is not None and _depth > 0 and threads > 1 and (work is None or work >= BLAS_LIFT_MIN_WORK):
            lift = True
            _lifted += 1
            if _lifted == 1:
                _set_blas_threads(threads)
    try:
        yield
    finally:
        if lift:
            with _lock:
                _lifted -= 1
                if _lifted == 0 and _depth > 0:
                    _set_blas_threads(1)


def _set_blas_threads(threads):
    """Every BLAS library at ``threads`` (caller holds ``_lock``)."""
    for lib in _blas_libraries():
        if lib.get_num_threads() is not None:
            lib.set_num_threads(threads)
    _release_control()


def thread_map(fn, items):
    """``[fn(x) for x in items]`` on the running method's threads (:func:`kernel_threads`),
    in order; for independent pieces of NumPy work that release the GIL (BLAS and LAPACK
    calls on matrices of hundreds of rows), each on one BLAS thread. An exception from any
    item is raised here."""
    items = list(items)
    threads = min(len(items), _budget_threads())
    if threads <= 1:
        with single_threaded_blas():  # as in the pool: the same BLAS path, the same rounding
            return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor

    # Each item in a copy of the caller's context: the method's deadline and thread budget
    # (context variables) hold on the pool's threads too. On an exception (an item's, or an
    # interrupt while waiting) the items not started are cancelled: only those running finish.
    with single_threaded_blas(), ThreadPoolExecutor(threads, thread_name_prefix="relufast") as pool:
        futures = [pool.submit(contextvars.copy_context().run, fn, x) for x in items]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise


#: Rows of the left factor a task of :func:`matmul` at least (blocks depend on the shapes
#: only: the result does not depend on the number of threads).
MATMUL_ROWS = 4096
#: Multiply-adds below which :func:`matmul` is one BLAS call on the calling thread.
MATMUL_MIN_WORK = 1 << 24


def _block_rows(width):
    """Rows a block of a product with ``width`` multiply-adds a row: at least MATMUL_ROWS, and
    at least MATMUL_MIN_WORK multiply-adds (narrow products in small blocks spend their time
    on the pool: 1e6 x 50 by 50 x 10 on one thread took 0.102 s in blocks of 4096 rows,
    0.073 s in one call, 0.071 s in these blocks). From the shapes only, like the blocks."""
    return max(MATMUL_ROWS, -(-MATMUL_MIN_WORK // max(int(width), 1)))


def _blocked(n, work):
    """Whether a product with n rows to split and ``work`` multiply-adds goes by blocks. The
    answer depends on the shapes only, never on the thread count, so that a result is the
    same on any number of threads."""
    return n > MATMUL_ROWS and work >= MATMUL_MIN_WORK


def matmul(A, B):
    """``A @ B`` for a tall A (n, p) on the running method's threads (:func:`kernel_threads`):
    blocks of MATMUL_ROWS rows, each one BLAS call on one thread, written into one result.

    Unlike :func:`blas_threads` this wakes no BLAS worker threads, which would spin beside
    the C++ kernels that follow (on 16 cores, CP-ALS's contraction kernel took 4.2 ms a call
    right after 16-thread OpenBLAS products, 0.56 ms once the products ran on relufast's own
    threads). Small products are one call.
    """
    A = np.asarray(A)
    B = np.asarray(B)
    if A.ndim != 2 or B.ndim != 2 or not _blocked(A.shape[0], A.shape[0] * A.shape[1] * B.shape[1]):
        return A @ B
    out = np.empty((A.shape[0], B.shape[1]), dtype=np.result_type(A, B))
    rows = _block_rows(A.shape[1] * B.shape[1])
    thread_map(lambda a: np.matmul(A[a : a + rows], B, out=out[a : a + rows]), range(0, len(A), rows))
    return out


def product_blocks(n, width):
    """``(rows, starts)`` of the row blocks of :func:`matmul` for n rows of ``width``
    multiply-adds each (one block when it would not split): for work that does a product and
    more per block on the method's threads, with the same bits on any number of threads."""
    rows = _block_rows(width) if _blocked(n, n * width) else max(n, 1)
    return rows, range(0, n, rows)


def add_in_order(parts):
    """Element-wise sums of the tuples of arrays in ``parts`` (the results of the blocks of a
    :func:`thread_map`), added in list order: the same bits on any number of threads."""
    total = tuple(parts[0])
    for part in parts[1:]:
        total = tuple(a + b for a, b in zip(total, part))
    return total


def crossprod(A, B):
    """``A.T @ B`` for tall A (n, p) and B (n, q) on the running method's threads: the products
    of blocks of MATMUL_ROWS rows (one BLAS call each, on one thread), summed in block order."""
    A = np.asarray(A)
    B = np.asarray(B)
    n = A.shape[0]
    if A.ndim != 2 or B.ndim != 2 or not _blocked(n, n * A.shape[1] * B.shape[1]):
        return A.T @ B
    rows = _block_rows(A.shape[1] * B.shape[1])
    parts = thread_map(lambda a: A[a : a + rows].T @ B[a : a + rows], range(0, n, rows))
    out = parts[0]
    for part in parts[1:]:
        out += part
    return out


#: Rows a task of :func:`take_rows` copies at least.
TAKE_ROWS = 2048
#: Bytes below which :func:`take_rows` is one copy on the calling thread.
TAKE_MIN_BYTES = 1 << 24


def take_rows(X, idx=None, start=0, stop=None):
    """``X[idx]``, or ``X[start:stop]`` when ``idx`` is None, as a new C-contiguous float64
    array, copied by blocks of rows on the running method's threads (:func:`kernel_threads`).

    A random sample of a large in-memory X is a memory-bound copy plus the first touch of the
    new pages, which one thread does at a fraction of the machine's bandwidth (48,448 random
    rows of 784 columns, 300 MB, took 0.5-1.2 s on one thread of the 2-core VM). A copy:
    the result does not depend on the number of threads."""
    X = np.asarray(X)
    if idx is None:
        stop = X.shape[0] if stop is None else stop
        n = max(stop - start, 0)
    else:
        idx = np.asarray(idx, dtype=np.intp)
        n = len(idx)
    out = np.empty((n,) + X.shape[1:], dtype=np.float64)
    row_bytes = 8 * int(np.prod(X.shape[1:], dtype=np.int64))

    def part(a, z):
        out[a:z] = X[start + a : start + z] if idx is None else X[idx[a:z]]

    if n * row_bytes < TAKE_MIN_BYTES or _budget_threads() <= 1:
        part(0, n)
        return out
    rows = max(TAKE_ROWS, -(-TAKE_MIN_BYTES // max(row_bytes, 1)) // 4)
    thread_map(lambda a: part(a, min(a + rows, n)), range(0, n, rows))
    return out


def tall_svd(A, k):
    """``(U[:, :k], s, Vt)`` of the thin SVD of a tall A (n, p), n >= p (U has min(k, p)
    columns, as a slice of LAPACK's would), by a QR of row blocks
    on the running method's threads (TSQR: each block's QR, then one QR of the stacked
    triangular factors and the SVD of the last p x p factor). LAPACK's SVD of a tall matrix
    takes the same route, on one core: 0.27-0.30 s of an (784, 128, 128) recovery's output
    basis (19,600 x 128) on the 2-core VM. Blocks depend on the shapes only, so the result
    does not depend on the thread count. Falls back to ``np.linalg.svd`` for small or wide A."""
    A = np.asarray(A, dtype=np.float64)
    n, p = A.shape
    if n < 2 * max(MATMUL_ROWS, 2 * p) or n * p * p < MATMUL_MIN_WORK:  # from the shapes only
        U, s, Vt = np.linalg.svd(A, full_matrices=False)
        return U[:, :k], s, Vt
    starts, ends = _tall_blocks(n, p)
    parts = thread_map(lambda ab: np.linalg.qr(A[ab[0] : ab[1]]), list(zip(starts, ends)))
    Qt, R = np.linalg.qr(np.vstack([r for _, r in parts]))
    Ur, s, Vt = np.linalg.svd(R)
    W = Qt @ Ur[:, :k]  # (blocks p, min(k, p)): the blocks' share of the left singular vectors
    U = np.empty((n, W.shape[1]))

    def left(i):
        a, z = starts[i], ends[i]
        np.matmul(parts[i][0], W[i * p : (i + 1) * p], out=U[a:z])

    thread_map(left, range(len(starts)))
    return U, s, Vt


def _tall_blocks(n, p):
    """(starts, ends) of the row blocks of a TSQR of an (n, p) matrix: at least MATMUL_ROWS and
    2 p rows each, the last one no shorter than p (from the shapes only)."""
    rows = max(MATMUL_ROWS, 2 * p)
    starts = list(range(0, n, rows))
    if len(starts) > 1 and n - starts[-1] < p:
        starts.pop()
    return starts, starts[1:] + [n]


#: Multiply-adds (n p^2) from which :func:`tall_lstsq` solves by row blocks.
TALL_LSTSQ_MIN_WORK = 1e8


def tall_lstsq(F, Y, rcond=None):
    """Least squares ``argmin ||F X - Y||`` for a tall F (n, p) of full column rank, by a QR of
    row blocks on the running method's threads (TSQR: each block's Householder QR and its
    ``Q_i^T Y_i``, then one QR of the stacked triangular factors). Returns ``(X, s)`` with s
    the singular values of F (those of its triangular factor), or None when F is small
    (below TALL_LSTSQ_MIN_WORK), not tall, or rank-deficient (``s[-1] <= rcond s[0]``,
    default ``eps max(n, p)`` as LAPACK's least-squares drivers use): the caller then solves
    it the usual way. LAPACK's pivoted QR (``gelsy``) runs mostly on one core: 1.2 s of the
    2-thread time of a biased (784, 128, 128) recovery on 50,000 x 129 features; on 10,000 x
    100 it took 0.134 s with the condition number's SVD, this 0.055 s on one thread."""
    F = np.asarray(F, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    n, p = F.shape
    if n * p * p < TALL_LSTSQ_MIN_WORK or n < 2 * max(MATMUL_ROWS, 2 * p):
        return None
    Y2 = Y.reshape(n, -1)
    starts, ends = _tall_blocks(n, p)

    def block(ab):
        Q, R = np.linalg.qr(F[ab[0] : ab[1]])
        return R, Q.T @ Y2[ab[0] : ab[1]]

    parts = thread_map(block, list(zip(starts, ends)))
    Qt, R = np.linalg.qr(np.vstack([r for r, _ in parts]))
    c = Qt.T @ np.vstack([q for _, q in parts])
    s = np.linalg.svd(R, compute_uv=False)
    tol = np.finfo(np.float64).eps * max(n, p) if rcond is None else rcond
    if not (s[0] > 0 and s[-1] > tol * s[0]):
        return None
    import scipy.linalg

    X = scipy.linalg.solve_triangular(R, c)
    return (X.reshape((p,) + Y.shape[1:]), s)
