"""GKLW19: detector accumulation (C++ vs NumPy) and end-to-end error and time vs n."""

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import relufast as rf
from relufast.algorithms.gklw19 import detector_matrix, detector_matrix_reference


@pytest.fixture(scope="module")
def data32():
    net = rf.planted.gklw19_network(32, random_state=0)
    X, Y = net.sample(100_000, random_state=1)
    return X, Y


def test_detector_relufast(benchmark, data32, machine):
    X, Y = data32
    T, _, _ = benchmark.pedantic(detector_matrix, args=(X, Y), rounds=3, warmup_rounds=1)
    R, _, _ = detector_matrix_reference(X[:20000], Y[:20000])
    S, _, _ = detector_matrix(X[:20000], Y[:20000])
    D1 = D2 = 32 * 33 // 2
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "gflops_2nD1D2": 2.0 * len(X) * D1 * D2 / benchmark.stats.stats.min / 1e9,
            "max_rel_diff_vs_numpy": float(np.abs(S - R).max() / np.abs(R).max()),
        }
    )


@pytest.mark.parametrize("threads", [1, 2])
def test_detector_numpy(benchmark, data32, threads):
    X, Y = data32

    def blocked():  # the straightforward NumPy form, in blocks to bound memory
        return detector_matrix_reference(X, Y)

    with threadpool_limits(threads):
        benchmark.pedantic(blocked, rounds=2, warmup_rounds=1)
    benchmark.extra_info.update({"threads": threads})


@pytest.mark.parametrize("practical", [False, True])
@pytest.mark.parametrize("n", [2000, 5000, 10000, 50000])
def test_gklw19_end_to_end(benchmark, n, practical):
    net = rf.planted.gklw19_network(10, random_state=0)
    X, Y = net.sample(n, random_state=1)
    res = benchmark.pedantic(
        rf.recover,
        args=(X, Y),
        # The paper's method alone (its error curve); test_gklw19_region_refinement adds the exact step.
        kwargs={"n_hidden": 10, "method": "gklw19", "practical": practical, "refine": False, "random_state": 0},
        rounds=3,
        warmup_rounds=1,
    )
    eW, eA = rf.metrics.matched_squared_error(res, net)
    Xt, Yt = net.sample(5000, random_state=2)
    benchmark.extra_info.update(
        {
            "error_W": eW,
            "error_A": eA,
            "mse_fresh": float(np.mean((res.predict(Xt) - Yt) ** 2)),
            "status": res.status.value,
        }
    )


@pytest.mark.parametrize("noise", [0.0, 0.05])
@pytest.mark.parametrize("refine", [False, True])
@pytest.mark.parametrize("n", [10000, 50000])
def test_gklw19_region_refinement(benchmark, n, refine, noise, machine):
    """Unsymmetrised Gaussian samples: the paper's estimate vs the same made exact by the
    activation-region refinement when the data are noiseless (left unchanged when noisy)."""
    net = rf.planted.gklw19_network(10, random_state=0)
    X, Y = net.sample(n, random_state=1, noise=noise)
    res = benchmark.pedantic(
        rf.recover,
        args=(X, Y),
        kwargs={"n_hidden": 10, "method": "gklw19", "refine": refine, "random_state": 0, "n_jobs": 2},
        rounds=2,
        warmup_rounds=1,
    )
    err = rf.metrics.parameter_error(res, net)
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "threads": 2,
            "status": res.status.value,
            "error_U": err.U,
            "error_V": err.V,
            "residual": res.residual,
            "region_rounds": res.counts.get("region_rounds", 0),
            "probe_residual": res.diagnostics.get("region_refine_residual", float("nan")),
        }
    )
