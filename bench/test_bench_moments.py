"""Moment kernel: relufast's C++ accumulation vs NumPy, GFLOP/s beside the dense GEMM rate.

The bar: counting 2 n m d^2 flops, the kernel reaches at least half of the machine's
dense GEMM rate (square NumPy matmul, measured in the same run).
"""

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from relufast.stages.moments import SecondMomentAccumulator

from .numpy_pipeline import moment_numpy

SHAPES = [(200_000, 64, 16), (100_000, 50, 10), (1_000_000, 50, 10), (20_000, 200, 100)]


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: f"n{s[0]}-d{s[1]}-m{s[2]}")
def data(request):
    n, d, m = request.param
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, d)), rng.standard_normal((n, m))


def _flops(X, Y):
    return 2.0 * X.shape[0] * Y.shape[1] * X.shape[1] ** 2


def _moment(X, Y, blas):
    acc = SecondMomentAccumulator(X.shape[1], Y.shape[1], blas=blas).update(X, Y)
    return acc.tensor()


@pytest.mark.parametrize("blas", [True, False], ids=["blas", "eigen"])
def test_relufast_moment(benchmark, data, machine, blas):
    """The kernel with its blocks' products by SciPy's dgemm and by Eigen's (BLAS_MIN_FEATURES)."""
    X, Y = data
    T = benchmark.pedantic(_moment, args=(X, Y, blas), rounds=5, warmup_rounds=1)
    ref = moment_numpy(X[:20000], Y[:20000])
    got = _moment(X[:20000], Y[:20000], blas)
    gflops = _flops(X, Y) / benchmark.stats.stats.min / 1e9
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "gflops": gflops,
            "fraction_of_gemm_rate": gflops / machine["numpy_gemm_gflops_default_threads"],
            "max_rel_diff_vs_numpy": float(np.abs(got - ref).max() / np.abs(ref).max()),
            "shape": T.shape,
            "products": "blas" if blas else "eigen",
        }
    )
    assert np.abs(got - ref).max() <= 1e-12 * np.abs(ref).max()


@pytest.mark.parametrize("threads", [1, 2])
def test_numpy_blocked_moment(benchmark, data, machine, threads):
    X, Y = data
    with threadpool_limits(threads):
        benchmark.pedantic(moment_numpy, args=(X, Y), rounds=3, warmup_rounds=1)
    benchmark.extra_info.update({"threads": threads, "gflops": _flops(X, Y) / benchmark.stats.stats.min / 1e9})


@pytest.mark.parametrize("threads", [1, 2])
def test_numpy_tall_skinny_product(benchmark, machine, threads):
    """The one-shot X.T @ Z product the issue warns about (n = 2e5, d = 64, m = 16)."""
    n, d, m = 200_000, 64, 16
    rng = np.random.default_rng(1)
    X = rng.standard_normal((n, d))
    Z = rng.standard_normal((n, m * d))
    with threadpool_limits(threads):
        benchmark.pedantic(lambda: X.T @ Z, rounds=3, warmup_rounds=1)
    benchmark.extra_info.update({"threads": threads, "gflops": 2.0 * n * m * d * d / benchmark.stats.stats.min / 1e9})
