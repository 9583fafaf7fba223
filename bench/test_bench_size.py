"""Networks of real size: whole recovery against one NumPy pass that checks the true network
on the same samples (best of 1 and 2 BLAS threads, measured in the same run).

Bias-free networks go to ``bjw19-gaussian`` (m = k), biased ones to ``atv21`` (m = k, Algorithm 5
on the affine lift). Each case records the status, the weight error after matching, the
samples used, the seconds per stage, the candidates refined and the ratio to the checking
pass in ``extra_info``.

Run: python -m pytest bench/test_bench_size.py --benchmark-only (the largest cases take
minutes: select with -k). Threads: the C++ kernels use all cores; NumPy runs single-threaded
inside the pipelines.
"""

import time
import warnings

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import relufast as rf

#: (d, k, m, n, bias): the issue's sizes and smaller steps toward them.
CASES = [
    (50, 25, 25, 100_000, False),
    (100, 50, 50, 200_000, False),
    (200, 100, 100, 400_000, False),
    (20, 10, 10, 100_000, True),
    (40, 20, 20, 200_000, True),
    (60, 30, 30, 300_000, True),
]


def checking_pass(net, X, Y):
    """Seconds of the best NumPy pass computing ||Y - f(X)|| for the true network."""
    best = np.inf
    for threads in (1, 2):
        with threadpool_limits(threads):
            t = time.perf_counter()
            Z = X @ net.V.T
            if net.b is not None:
                Z += net.b
            R = np.maximum(Z, 0.0) @ net.U.T
            if net.c is not None:
                R += net.c
            np.linalg.norm(Y - R)
            best = min(best, time.perf_counter() - t)
    return best


@pytest.mark.parametrize("d,k,m,n,bias", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}{'-bias' if c[4] else ''}" for c in CASES])
def test_size(benchmark, machine, d, k, m, n, bias):
    kw = dict(bias="random", offset="random") if bias else {}
    net = rf.planted.two_layer(d=d, k=k, m=m, random_state=0, **kw)
    X, Y = net.sample(n, random_state=1)
    method = "atv21" if bias else "bjw19-gaussian"
    out = {}

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rf.RelufastWarning)
            out["res"] = rf.recover(X, Y, n_hidden=k, method=method, random_state=0)

    benchmark.pedantic(run, rounds=1, warmup_rounds=0)
    res = out["res"]
    check = checking_pass(net, X, Y)
    err = rf.metrics.parameter_error(res, net) if res.V is not None and res.V.shape == net.V.shape else None
    benchmark.extra_info.update(
        machine,
        method=method,
        status=res.status.value,
        weight_error=None if err is None else float(max(err.U, err.V, err.b)),
        seconds={key: round(v, 3) for key, v in res.seconds.items()},
        counts={key: int(v) for key, v in res.counts.items() if isinstance(v, (int, np.integer))},
        checking_pass_seconds=check,
        ratio_to_checking_pass=benchmark.stats.stats.max / check,
    )
    assert res.status.value == "exact", res.message
    assert err is not None and max(err.U, err.V, err.b) < 1e-8


@pytest.mark.parametrize("d,k,m", [(10, 5, 5), (20, 10, 10), (40, 20, 20)])
def test_extract_biased(benchmark, machine, d, k, m):
    """``extract`` with random Gaussian queries on a biased planted network (a callable):
    queries and seconds; the anchor (chosen queries, CJM20's code on this machine) took
    8.5 s at (40, 20, 20)."""
    net = rf.planted.two_layer(d=d, k=k, m=m, bias="random", offset="random", random_state=0)
    out = {}

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rf.RelufastWarning)
            out["res"] = rf.extract(net.predict, n_features=d, n_hidden=k, random_state=0)

    benchmark.pedantic(run, rounds=1, warmup_rounds=0)
    res = out["res"]
    err = rf.metrics.parameter_error(res, net)
    benchmark.extra_info.update(
        machine,
        status=res.status.value,
        queries=int(res.counts["queries"]),
        weight_error=float(max(err.U, err.V, err.b)),
        seconds={key: round(v, 3) for key, v in res.seconds.items()},
    )
    assert res.status.value == "exact" and max(err.U, err.V, err.b) < 1e-8
