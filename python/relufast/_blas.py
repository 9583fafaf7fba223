"""Keep NumPy's BLAS single-threaded while relufast's own threads run.

OpenBLAS worker threads spin for a while after each multithreaded call; a C++ kernel
started right after a NumPy product then shares the cores with them (measured here: the
moment kernel ran 1.7x slower after a small NumPy GEMM). Inside the pipelines NumPy only
handles small matrices, so one BLAS thread loses nothing. Uses threadpoolctl when it is
installed (it comes with the ``test`` extra); otherwise this is a no-op.
"""
import contextlib

try:
    from threadpoolctl import threadpool_limits as _limits
except ImportError:  # pragma: no cover - optional
    _limits = None


def single_threaded_blas():
    if _limits is None:
        return contextlib.nullcontext()
    return _limits(limits=1, user_api="blas")
