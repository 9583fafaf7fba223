"""Thread scaling: the whole recovery and one NumPy checking pass side by side at 1, 2, 4,
... threads up to every core (issue: from 2 cores to 16).

For each planted bias-free network (bjw19-gaussian, Gaussian inputs) and each thread count
t: relufast's recovery with ``n_jobs=t`` and NumPy's BLAS limited to t threads, and the
checking pass ``||relu(X V^T) U^T - Y||`` of the true network at the same t threads (best of
three). Recorded in ``extra_info``: status, weight error, seconds, the checking pass, their
ratio, and the speedup of both over one thread. A machine with more cores measures more
points; the ratio and the speedup from 2 threads to all cores are the issue's figures.

Default cases: (50, 10, 20) at n = 1e6 and (200, 100, 100) at n = 4e5; ``--threads-large``
adds (784, 128, 128) at n = 2e5 (about a minute a thread count on 2 cores).

Run: python -m pytest bench/test_bench_threads.py --benchmark-only -s
"""

import os
import time
import warnings

import numpy as np
from threadpoolctl import threadpool_limits

import relufast as rf

CASES = [(50, 10, 20, 1_000_000), (200, 100, 100, 400_000)]
LARGE = [(784, 128, 128, 200_000)]


def thread_counts():
    """1, 2, 4, ... and every core."""
    n = os.cpu_count() or 1
    counts = [1]
    while counts[-1] * 2 <= n:
        counts.append(counts[-1] * 2)
    return counts + ([n] if counts[-1] != n else [])


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames:
        cases = CASES + (LARGE if metafunc.config.getoption("--threads-large", default=False) else [])
        metafunc.parametrize("case", cases, ids=lambda c: "-".join(map(str, c)))
        metafunc.parametrize("threads", thread_counts())


_DATA: dict = {}
_ONE: dict = {}


def data(case):
    if case not in _DATA:
        d, k, m, n = case
        net = rf.planted.two_layer(d, k, m, random_state=0)
        _DATA.clear()
        _DATA[case] = (net, *net.sample(n, random_state=1))
    return _DATA[case]


def checking_pass(X, Y, V, U):
    return float(np.linalg.norm(np.maximum(X @ V.T, 0.0) @ U.T - Y))


def test_threads(benchmark, machine, case, threads):
    net, X, Y = data(case)
    d, k, m, n = case
    with threadpool_limits(threads, user_api="blas"):
        best = np.inf
        for _ in range(3):
            t = time.perf_counter()
            checking_pass(X, Y, net.V, net.U)
            best = min(best, time.perf_counter() - t)

        def fit():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", rf.RelufastWarning)
                return rf.recover(X, Y, n_hidden=k, method="bjw19-gaussian", n_jobs=threads, random_state=0)

        # One unrecorded run first at one thread (the first call of a case loads and warms up).
        res = benchmark.pedantic(fit, rounds=1, iterations=1, warmup_rounds=1 if threads == 1 else 0)
    seconds = benchmark.stats.stats.min
    err = rf.metrics.parameter_error(res, net)
    info = dict(
        machine,
        d=d,
        k=k,
        m=m,
        n=n,
        threads=threads,
        status=res.status.value,
        weight_error=float(max(err.U, err.V)),
        seconds=seconds,
        checking_pass_seconds=best,
        ratio_to_checking_pass=seconds / best,
    )
    one = _ONE.setdefault(case, {})
    if threads == 1:
        one.update(seconds=seconds, check=best)
    elif one:
        info.update(speedup=one["seconds"] / seconds, checking_pass_speedup=one["check"] / best)
    benchmark.extra_info.update(info)
    shown = ("d", "k", "threads", "status", "seconds", "ratio_to_checking_pass", "speedup")
    print({key: info[key] for key in shown if key in info})
    assert res.status == "exact", res.message
