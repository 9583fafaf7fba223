"""Whole bjw19-gaussian pipeline vs a straightforward NumPy implementation of it.

d = 50, k = 10, m = 20, n = 1e5 and 1e6, Gaussian inputs. The recovery error is recorded
in extra_info beside every time, so a faster but wrong run shows.
"""

import pytest
from threadpoolctl import threadpool_limits

import relufast as rf

from .numpy_pipeline import recover_numpy

D, K, M = 50, 10, 20


@pytest.fixture(scope="module", params=[100_000, 1_000_000], ids=lambda n: f"n{n}")
def planted(request):
    net = rf.planted.two_layer(d=D, k=K, m=M, random_state=0)
    X, Y = net.sample(request.param, random_state=1)
    return net, X, Y


def test_relufast_pipeline(benchmark, planted, machine):
    net, X, Y = planted
    res = benchmark.pedantic(
        rf.recover,
        args=(X, Y),
        kwargs={"n_hidden": K, "method": "bjw19-gaussian", "random_state": 0},
        rounds=3,
        warmup_rounds=1,
    )
    err = rf.metrics.parameter_error(res, net)
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "status": res.status.value,
            "error_U": err.U,
            "error_V": err.V,
            "residual": res.residual,
            "seconds": dict(res.seconds),
            "certified_rows": res.counts["certified_rows"],
        }
    )
    assert res.exact and err.U < 1e-10 and err.V < 1e-10


@pytest.mark.parametrize("threads", [1, 2])
def test_numpy_pipeline(benchmark, planted, threads):
    net, X, Y = planted
    with threadpool_limits(threads):
        U, V, residual = benchmark.pedantic(recover_numpy, args=(X, Y, K), rounds=2, warmup_rounds=0)
    err = rf.metrics.parameter_error((U, V), net)
    benchmark.extra_info.update({"threads": threads, "error_U": err.U, "error_V": err.V, "residual": residual})
    assert err.V < 1e-10


@pytest.mark.parametrize("n", [2000, 5000, 10000])
def test_success_rate_vs_n(benchmark, n):
    """How few samples suffice: exact recoveries out of 5 seeds at d = 50, k = 10, m = 20."""

    def study():
        ok = []
        for seed in range(5):
            net = rf.planted.two_layer(d=D, k=K, m=M, random_state=seed)
            X, Y = net.sample(n, random_state=seed + 1)
            res = rf.recover(X, Y, n_hidden=K, method="bjw19-gaussian", random_state=0)
            ok.append(bool(res.exact and rf.metrics.parameter_error(res, net).V < 1e-10))
        return ok

    ok = benchmark.pedantic(study, rounds=1, iterations=1)
    benchmark.extra_info.update(
        {"n": n, "exact_out_of_5": int(sum(ok)), "seconds_per_run": benchmark.stats.stats.min / 5}
    )
