"""Adaptive estimation vs the moment over every sample, and the cost of
one NumPy pass that only checks a given network.

d = 50, k = 10, m = 20, Gaussian inputs, bjw19-gaussian. For each n: relufast with the
default adaptive estimate, relufast with ``n_estimate="all"``, the NumPy checking pass
``||relu(X V^T) U^T - Y||`` at its best thread setting (1 or 2 threads, measured in the
same run), and, at n = 1e6, the straightforward NumPy pipeline (bench/numpy_pipeline.py)
at its best thread setting. Beyond memory the samples are a memmap under /tmp.

Default sizes: 1e4, 1e5, 1e6 (in memory). ``--adaptive-large`` adds 1e7 (4 GB of X in a
memmap written once under /tmp; about a minute to write). Quality figures (status, error)
are in ``extra_info`` beside every time; the bars are checked at n = 1e6: recovery <= 1.2x
the checking pass and >= 3x faster than the NumPy pipeline.
"""

import os
import tempfile
import time
import warnings

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import relufast as rf

from .numpy_pipeline import recover_numpy

D, K, M = 50, 10, 20
SIZES = [10_000, 100_000, 1_000_000]
LARGE = 10_000_000
#: Chunk of rows written at a time when the memmap is built (bounded memory).
WRITE_ROWS = 250_000


def _sizes(config):
    return SIZES + ([LARGE] if config.getoption("--adaptive-large", default=False) else [])


def _net():
    return rf.planted.two_layer(d=D, k=K, m=M, random_state=0)


def _memmap(n, net):
    folder = os.path.join(tempfile.gettempdir(), "relufast-bench")
    os.makedirs(folder, exist_ok=True)
    px, py = (os.path.join(folder, f"{a}_{n}_{D}_{K}_{M}.npy") for a in "XY")
    if not (os.path.exists(px) and os.path.exists(py)):
        X = np.lib.format.open_memmap(px + ".tmp", mode="w+", dtype=np.float64, shape=(n, D))
        Y = np.lib.format.open_memmap(py + ".tmp", mode="w+", dtype=np.float64, shape=(n, M))
        rng = np.random.default_rng(1)
        for s in range(0, n, WRITE_ROWS):
            Xc = rng.standard_normal((min(WRITE_ROWS, n - s), D))
            X[s : s + len(Xc)], Y[s : s + len(Xc)] = Xc, net.predict(Xc)
        X.flush(), Y.flush()
        del X, Y
        os.replace(px + ".tmp", px), os.replace(py + ".tmp", py)
    return np.load(px, mmap_mode="r"), np.load(py, mmap_mode="r")


_DATA = {}


def data(n):
    if n not in _DATA:
        net = _net()
        if n <= 1_000_000:
            X, Y = net.sample(n, random_state=1)
        else:
            X, Y = _memmap(n, net)
        _DATA.clear()
        _DATA[n] = (net, X, Y)
    return _DATA[n]


def checking_pass(X, Y, V, U):
    """One NumPy pass that only checks a given network (the issue's yardstick)."""
    return float(np.linalg.norm(np.maximum(X @ V.T, 0.0) @ U.T - Y))


def best_checking_time(X, Y, net, rounds=3):
    best = {}
    for threads in (1, 2):
        with threadpool_limits(threads):
            checking_pass(X, Y, net.V, net.U)
            best[threads] = min(_timed(checking_pass, X, Y, net.V, net.U) for _ in range(rounds))
    return min(best.values()), best


def _timed(fn, *args, **kw):
    t = time.perf_counter()
    fn(*args, **kw)
    return time.perf_counter() - t


def pytest_generate_tests(metafunc):
    if "n" in metafunc.fixturenames:
        metafunc.parametrize("n", _sizes(metafunc.config), ids=lambda n: f"n{n:.0e}")


@pytest.mark.parametrize("mode", [None, "all"], ids=["adaptive", "all"])
def test_recovery_vs_checking_pass(benchmark, n, mode, machine):
    net, X, Y = data(n)
    check, per_thread = best_checking_time(X, Y, net)

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rf.RelufastWarning)
            return rf.recover(X, Y, n_hidden=K, method="bjw19-gaussian", random_state=0, n_estimate=mode)

    res = benchmark.pedantic(run, rounds=3 if n <= 1_000_000 else 1, warmup_rounds=1 if n <= 1_000_000 else 0)
    err = rf.metrics.parameter_error(res, net)
    t = benchmark.stats.stats.min
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "n": n,
            "mode": mode or "adaptive",
            "memmap": isinstance(X, np.memmap) or n > 1_000_000,
            "status": res.status.value,
            "error_U": err.U,
            "error_V": err.V,
            "residual": res.residual,
            "counts": dict(res.counts),
            "seconds": dict(res.seconds),
            "kernel_threads": os.cpu_count(),
            "numpy_check_seconds_best": check,
            "numpy_check_seconds_by_threads": per_thread,
            "ratio_to_check": t / check,
        }
    )
    assert res.exact and err.U < 1e-10 and err.V < 1e-10
    if n == 1_000_000 and mode is None:
        assert t <= 1.2 * check, f"recovery {t:.3f} s > 1.2 x checking pass {check:.3f} s"


def test_numpy_pipeline_at_1e6(benchmark):
    """The straightforward NumPy pipeline at its best thread setting vs adaptive relufast."""
    net, X, Y = data(1_000_000)
    times = {}
    for threads in (1, 2):
        with threadpool_limits(threads):
            times[threads] = _timed(recover_numpy, X, Y, K)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        rf.recover(X, Y, n_hidden=K, method="bjw19-gaussian", random_state=0)
        ours = min(_timed(rf.recover, X, Y, n_hidden=K, method="bjw19-gaussian", random_state=0) for _ in range(3))
    benchmark.pedantic(lambda: None, rounds=1)
    benchmark.extra_info.update(
        {
            "numpy_pipeline_seconds_by_threads": times,
            "relufast_adaptive_seconds": ours,
            "speedup": min(times.values()) / ours,
        }
    )
    assert min(times.values()) >= 3.0 * ours
