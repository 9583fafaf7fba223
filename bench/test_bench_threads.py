"""Thread scaling: the whole recovery and one NumPy checking pass side by side at 1, 2, 4,
... threads up to every core (issue: from 2 cores to 16).

For each planted network (Gaussian inputs) and each thread count t: relufast's recovery
with ``n_jobs=t`` and NumPy's BLAS limited to t threads, and the checking pass
``||relu(X V^T + b) U^T + c - Y||`` of the true network at the same t threads (best of
three). Bias-free networks go to ``bjw19-gaussian``, biased ones to ``atv21``. Recorded in
``extra_info``: status, weight error, seconds (and per stage), the checking pass, their
ratio, and the speedup of both over the fewest threads measured (``base_threads``). A
machine with more cores measures more points; the ratio and the speedup from 2 threads to
all cores are the issue's figures.

Default cases: (50, 10, 20) at n = 1e6 and (200, 100, 100) at n = 4e5, bias-free;
``--threads-large`` adds (784, 128, 128) at n = 2e5, bias-free and with every bias 0.5 and
an output offset 0.3 (15-25 s a run at 2 threads on 2 cores). ``--threads-list 2,16``
measures those thread counts only.

Run: python -m pytest bench/test_bench_threads.py --benchmark-only -s
"""

import time
import warnings

import numpy as np
from threadpoolctl import threadpool_limits

import relufast as rf
from relufast._blas import cores

#: (d, k, m, n, bias): bias None (bias-free) or one bias for every unit (offset 0.3).
CASES = [(50, 10, 20, 1_000_000, None), (200, 100, 100, 400_000, None)]
LARGE = [(784, 128, 128, 200_000, None), (784, 128, 128, 200_000, 0.5)]


def thread_counts(config=None):
    """1, 2, 4, ... and every core (this process's CPU affinity), or ``--threads-list``."""
    given = config.getoption("--threads-list", default=None) if config is not None else None
    if given:
        return [int(t) for t in given.split(",")]
    n = cores()
    counts = [1]
    while counts[-1] * 2 <= n:
        counts.append(counts[-1] * 2)
    return counts + ([n] if counts[-1] != n else [])


def _id(case):
    d, k, m, n, bias = case
    return f"{d}-{k}-{m}-{n}" + ("" if bias is None else f"-bias{bias}")


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames:
        cases = CASES + (LARGE if metafunc.config.getoption("--threads-large", default=False) else [])
        metafunc.parametrize("case", cases, ids=_id)
        metafunc.parametrize("threads", thread_counts(metafunc.config))


_DATA: dict = {}
_BASE: dict = {}


def data(case):
    if case not in _DATA:
        d, k, m, n, bias = case
        kw = {} if bias is None else dict(bias=bias, offset=0.3)
        net = rf.planted.two_layer(d, k, m, random_state=0, **kw)
        _DATA.clear()
        _DATA[case] = (net, *net.sample(n, random_state=1))
    return _DATA[case]


def checking_pass(X, Y, net):
    """||relu(X V^T + b) U^T + c - Y||_F, with the bias and offset additions (in place) only
    where the network has them."""
    Z = X @ net.V.T
    if np.any(net.b):
        Z += net.b
    out = np.maximum(Z, 0.0, out=Z) @ net.U.T
    if np.any(net.c):
        out += net.c
    out -= Y
    return float(np.linalg.norm(out))


def test_threads(benchmark, machine, case, threads):
    net, X, Y = data(case)
    d, k, m, n, bias = case
    method = "bjw19-gaussian" if bias is None else "atv21"
    with threadpool_limits(threads, user_api="blas"):
        best = np.inf
        for _ in range(3):
            t = time.perf_counter()
            checking_pass(X, Y, net)
            best = min(best, time.perf_counter() - t)

        def fit():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", rf.RelufastWarning)
                return rf.recover(X, Y, n_hidden=k, method=method, n_jobs=threads, random_state=0)

        # One unrecorded run first at the fewest threads of a small case (the first call loads
        # and warms up; a large case's run is long enough not to need it).
        warm = case not in _BASE and case not in LARGE
        # Best of five for the small case (a fifth of a second a run varies by tens of percent).
        rounds = 5 if d * k <= 1000 else 1
        res = benchmark.pedantic(fit, rounds=rounds, iterations=1, warmup_rounds=1 if warm else 0)
    seconds = benchmark.stats.stats.min
    err = rf.metrics.parameter_error(res, net)
    info = dict(
        machine,
        d=d,
        k=k,
        m=m,
        n=n,
        bias=bias,
        method=method,
        threads=threads,
        status=res.status.value,
        weight_error=float(max(err.U, err.V, err.b)),
        seconds=seconds,
        stage_seconds={key: round(v, 3) for key, v in res.seconds.items()},
        checking_pass_seconds=best,
        ratio_to_checking_pass=seconds / best,
    )
    base = _BASE.setdefault(case, dict(threads=threads, seconds=seconds, check=best))
    if base["threads"] != threads:
        info.update(
            base_threads=base["threads"], speedup=base["seconds"] / seconds, checking_pass_speedup=base["check"] / best
        )
    benchmark.extra_info.update(info)
    shown = ("d", "k", "bias", "threads", "status", "seconds", "ratio_to_checking_pass", "speedup", "stage_seconds")
    print({key: info[key] for key in shown if key in info})
    assert res.status == "exact", res.message
