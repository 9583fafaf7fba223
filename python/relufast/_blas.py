"""Keep NumPy's BLAS single-threaded while relufast's own threads run.

OpenBLAS worker threads spin for a while after each multithreaded call, and a C++ kernel
started right after shares the cores with them. Measured here with n = 1e5, d = 50,
m = 10 (``bench/test_bench_ica_blas.py``): the moment kernel takes 74-100 ms right after
a 2-thread NumPy GEMM, but 48-55 ms when that GEMM ran under a one-thread limit, because
then no worker is woken. Setting the limit does not stop workers that an earlier call
(made outside relufast) left spinning. The pipelines therefore run all of their own NumPy
work, which is on small matrices only, under this limit. It uses threadpoolctl when that
is installed (it comes with the ``test`` extra); otherwise this is a no-op.
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
