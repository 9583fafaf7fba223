"""Figures quoted in docstrings: FastICA contrasts, and OpenBLAS spinning after NumPy calls."""

import time

import numpy as np
from threadpoolctl import threadpool_limits

from relufast._native import core
from relufast.algorithms.bjw19 import fastica


def test_fastica_contrasts(benchmark):
    """60 random mixtures of 3-5 rectified-Gaussian sources (n = 2e4): separations per contrast."""

    def study():
        out = {}
        for contrast in ("skew", "logcosh"):
            bad, iters = 0, []
            for t in range(60):
                rng = np.random.default_rng(t)
                k = 3 + t % 3
                F = np.maximum(rng.standard_normal((20000, k)), 0)
                Z = F @ rng.standard_normal((k, k))
                unmix, it, _ = fastica(Z, rng, contrast=contrast)
                C = np.abs(np.corrcoef((Z @ unmix).T, F.T)[:k, k:])
                bad += not np.all(C.max(axis=1) >= 0.999)
                iters.append(it)
            out[contrast] = {"failures_of_60": bad, "max_iterations": int(max(iters))}
        return out

    res = benchmark.pedantic(study, rounds=1, iterations=1)
    benchmark.extra_info.update(res)
    assert res["skew"]["failures_of_60"] == 0


def test_blas_spin_slows_the_next_kernel(benchmark):
    """The moment kernel right after a NumPy GEMM run with 2 BLAS threads, or with 1."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((100_000, 50))
    Y = rng.standard_normal((100_000, 10))
    A = rng.standard_normal((400, 400))

    def after_gemm(blas_threads):
        best = np.inf
        for _ in range(5):
            time.sleep(0.3)  # let workers from earlier calls go to sleep
            with threadpool_limits(blas_threads):
                A @ A
                t = time.perf_counter()
                core.SecondMoment(50, 10).update(X, Y, 0, 256)
                best = min(best, time.perf_counter() - t)
        return best

    spinning = benchmark.pedantic(after_gemm, args=(2,), rounds=1, iterations=1)
    quiet = after_gemm(1)
    benchmark.extra_info.update(
        {"seconds_after_2_thread_gemm": spinning, "seconds_after_1_thread_gemm": quiet, "slowdown": spinning / quiet}
    )
