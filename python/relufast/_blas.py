"""Keep NumPy's BLAS single-threaded while relufast's own threads run.

OpenBLAS worker threads spin for a while after each multithreaded call, and a C++ kernel
started right after shares the cores with them. Measured here with n = 1e5, d = 50,
m = 10 (``bench/test_bench_ica_blas.py``): the moment kernel takes 74-100 ms right after
a 2-thread NumPy GEMM, but 48-55 ms when that GEMM ran under a one-thread limit, because
then no worker is woken. Setting the limit does not stop workers that an earlier call
(made outside relufast) left spinning. The pipelines therefore run all of their own NumPy
work, which is on small matrices only, under this limit. It uses threadpoolctl when that
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
import threading

try:
    import threadpoolctl as _tpc
except ImportError:  # pragma: no cover - optional
    _tpc = None

_lock = threading.Lock()
_depth = 0
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


def single_threaded_blas():
    """Context manager: NumPy's BLAS at one thread inside; safe to nest and to share
    between threads (the original limits come back when the last user leaves)."""
    if _tpc is None:
        return contextlib.nullcontext()
    return _single_threaded()
