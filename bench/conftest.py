"""Shared fixtures for the pytest-benchmark suites (run: python -m pytest bench/ --benchmark-only)."""

import os
import platform
import time

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits


def gemm_gflops(threads=None, size=3000, repeats=3):
    """Best-of-`repeats` GFLOP/s of a square NumPy matmul (the machine's dense GEMM rate)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size))
    b = rng.standard_normal((size, size))
    best = np.inf
    with threadpool_limits(threads):
        a @ b
        for _ in range(repeats):
            t = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t)
    return 2.0 * size**3 / best / 1e9


@pytest.fixture(scope="session")
def machine():
    """Facts recorded beside every benchmark: cores, BLAS, and the dense GEMM rate."""
    blas = [(i.get("internal_api"), i.get("architecture"), i.get("num_threads")) for i in threadpool_info()]
    import relufast as rf

    return {
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "blas": str(blas),
        "relufast_backend": rf.BACKEND,
        "numpy_gemm_gflops_default_threads": gemm_gflops(None),
        "numpy_gemm_gflops_1_thread": gemm_gflops(1),
    }


def pytest_addoption(parser):
    parser.addoption(
        "--threads-large",
        action="store_true",
        default=False,
        help="bench/test_bench_threads.py: add (784, 128, 128) at n = 2e5, bias-free and with equal biases",
    )
    parser.addoption(
        "--threads-list",
        default=None,
        help="bench/test_bench_threads.py: thread counts to measure, comma-separated (default 1, 2, 4, ... all)",
    )
    parser.addoption(
        "--adaptive-large",
        action="store_true",
        default=False,
        help="bench/test_bench_adaptive.py and test_bench_scale.py: add n = 1e7 "
        "(a memmap of several GB written once under the temporary folder)",
    )
