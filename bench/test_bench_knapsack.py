"""Signs of a layer wider than its equations: the subset sum solved by lattice reduction.

Two levels, each recorded with its quality figure beside the time:
- :func:`relufast._knapsack.binary_combination` on random Gaussian ``A`` (r equations, k
  units, half of them flipped), A seen with 1e-13 relative error (the accuracy of fitted
  terms): found or not, and the seconds, over 4 draws;
- chosen-query extraction of planted one-hidden-layer networks with k > d m (one output),
  whose signs need it: status, error, queries, seconds.

Run: python -m pytest bench/test_bench_knapsack.py --benchmark-only -s
"""

import time
import warnings

import numpy as np
import pytest

import relufast as rf
from relufast._knapsack import binary_combination


@pytest.mark.parametrize("k, r", [(30, 5), (60, 10), (100, 10), (100, 30), (150, 10)])
def test_subset_sum(benchmark, machine, k, r):
    draws = []

    def run():
        draws.clear()
        for seed in range(4):
            rng = np.random.default_rng(seed)
            A = rng.standard_normal((r, k))
            delta = rng.random(k) < 0.5
            seen = A * (1 + 1e-13 * rng.standard_normal(A.shape))
            t0 = time.perf_counter()
            found = binary_combination(seen, A @ delta, tol=1e-9 * np.linalg.norm(A))
            ok = found is not None and bool(np.array_equal(found[0], delta))
            draws.append((ok, time.perf_counter() - t0))

    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "units": k,
            "equations": r,
            "found": f"{sum(ok for ok, _ in draws)} of {len(draws)}",
            "seconds_each": [round(s, 3) for _, s in draws],
            "density_at_46_bits": round(k / (46 * r), 3),
        }
    )
    secs = [round(s, 2) for _, s in draws]
    print(f"\n{k} units, {r} equations: found {benchmark.extra_info['found']}, seconds {secs}")


@pytest.mark.parametrize("d, k", [(3, 7), (10, 25), (10, 100), (30, 100), (10, 150)])
def test_wide_one_hidden_layer(benchmark, machine, d, k):
    hidden, out = rf.planted.deep_relu(d, (k,), 1, random_state=0)
    f = rf.planted.relu_function(hidden, out)
    box = {}

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rf.RelufastWarning)
            box["res"] = rf.extract(f, n_features=d, n_hidden=k, queries="chosen", random_state=0)

    benchmark.pedantic(run, rounds=1, iterations=1)
    res = box["res"]
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "network": f"{d}-{k}-1",
            "status": str(res.status),
            "residual": float(res.residual),
            "queries": int(res.counts["queries"]),
            "signs_resolved": bool(res.diagnostics.get("signs_resolved")),
            "seconds_signs": float(res.seconds.get("signs", 0.0)),
        }
    )
    print(f"\n{d}-{k}-1: {res.status} {res.residual:.2g}, {res.counts['queries']} queries")
