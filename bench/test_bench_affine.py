"""Chosen-query extraction of planted networks whose last hidden layer has units active at
every input (nonnegative weights on units that are >= 0, bias 1): the units found plus the
affine part that always-active units carry (``relufast.chosen.affine``). Records status,
certificate residual, the function's error on fresh points, queries and seconds beside the
number of units left to the affine part.

Run: python -m pytest bench/test_bench_affine.py --benchmark-only
"""

import time
import warnings

import numpy as np
import pytest

import relufast as rf
from relufast import planted as P

#: (d, widths, outputs, always-active last-layer units, planted seed)
CASES = [(10, (12, 8), 1, 3, 0), (20, (16, 12), 2, 5, 0), (30, (40, 30), 1, 10, 0), (10, (12, 10, 8), 1, 3, 2)]


def _network(d, widths, m, n_always, seed):
    hidden, out = P.deep_relu(d, list(widths), m, random_state=seed)
    W, b = (a.copy() for a in hidden[-1])
    W[:n_always], b[:n_always] = np.abs(W[:n_always]), 1.0
    return P.relu_function([*hidden[:-1], (W, b)], out)


@pytest.mark.parametrize("d, widths, m, n_always, seed", CASES, ids=lambda v: str(v))
def test_affine_rest(benchmark, machine, d, widths, m, n_always, seed):
    f = _network(d, widths, m, n_always, seed)
    out = {}

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rf.RelufastWarning)
            t = time.perf_counter()
            out["res"] = rf.extract(f, d, widths, queries="chosen", random_state=0)
            out["seconds"] = time.perf_counter() - t

    benchmark.pedantic(run, rounds=1, iterations=1)
    res = out["res"]
    X = 5.0 * np.random.default_rng(1).standard_normal((4000, d))
    err = float(np.abs(res.predict(X) - f(X)).max() / np.abs(f(X)).max()) if res.exact else None
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "network": "-".join(map(str, (d, *widths, m))),
            "always_active": n_always,
            "status": res.status.value,
            "residual": float(res.residual),
            "function_error": err,
            "queries": int(res.counts["queries"]),
            "seconds": out["seconds"],
            "affine_rest": res.diagnostics.get("affine_rest"),
        }
    )
    assert res.status == "exact", res.message
    assert res.diagnostics["affine_rest"] == n_always and err <= 1e-12
