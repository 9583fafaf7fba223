"""Chosen-query extraction (``relufast.extract(..., queries="chosen")``): queries and seconds
against network size and depth, beside the random-query mode on small two-layer networks.

Planted networks with biases (unit Gaussian rows, b ~ N(0, 1/4), Gaussian output layer and
offset) are queried through a NumPy callable in float64 or float32. Recorded in
``extra_info``: status, queries, model calls, per-stage seconds, the function error on fresh
inputs at scales 1 and 10 against the float64 network, and the figures of the public code of
Carlini, Jagielski and Mironov (CRYPTO 2020) on the same sizes, measured on this machine.

Run: python -m pytest bench/test_bench_chosen.py --benchmark-only -s
"""

import warnings

import numpy as np
import pytest

import relufast as rf

#: Queries and seconds of the public code of [CJM20] on the same planted sizes (2 cores).
CJM20 = {
    (10, (5,), 1): (6912, 1.75),
    (20, (10,), 1): (14598, 2.3),
    (40, (20,), 1): (45338, 5.0),
    (40, (20,), 20): (47460, 8.5),
    (10, (15, 15), 1): (91700, 18.6),
}


def planted(d, widths, m, seed):
    """A random ReLU network with biases (:func:`relufast.planted.deep_relu`)."""
    return rf.planted.deep_relu(d, widths, m, random_state=seed)


def model(hidden, out, dtype=np.float64, activation=None):
    """The network as a callable computed in ``dtype`` (:func:`relufast.planted.relu_function`)."""
    return rf.planted.relu_function(hidden, out, dtype, activation)


def function_error(res, f, d):
    if (getattr(res, "layers", None) is None) and getattr(res, "U", None) is None:
        return float("inf")
    rng = np.random.default_rng(123)
    errs = []
    for s in (1.0, 10.0):
        X = s * rng.standard_normal((2000, d))
        Y = f(X).reshape(len(X), -1)
        errs.append(float(np.abs(res.predict(X) - Y).max() / np.abs(Y).max()))
    return max(errs)


def record(benchmark, machine, res, f64, d, widths, m, queries, dtype):
    ref = CJM20.get((d, widths, m))
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "network": f"{d}-{'-'.join(map(str, widths))}-{m}",
            "queries_mode": queries,
            "dtype": dtype.__name__,
            "status": str(res.status),
            "exact": bool(res.exact),
            "queries": int(res.counts["queries"]),
            "function_error": function_error(res, f64, d),
            "stage_seconds": {k: round(v, 4) for k, v in res.seconds.items()},
            "cjm20_queries": None if ref is None else ref[0],
            "cjm20_seconds": None if ref is None else ref[1],
        }
    )


def run_extract(f, d, widths, queries):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        n_hidden = widths if queries == "chosen" else widths[0]
        return rf.extract(f, n_features=d, n_hidden=n_hidden, queries=queries, random_state=0)


SIZES = [(10, (5,), 1, 15), (20, (10,), 1, 31), (40, (20,), 1, 61), (40, (20,), 20, 80)]
DEEP = [
    (10, (6, 4), 1, 1),
    (10, (6, 4), 3, 8),
    (10, (8, 6), 1, 2),
    (12, (8, 6), 2, 1),
    (10, (15, 15), 1, 1),
    (10, (15, 15), 1, 2),
    (10, (15, 15), 1, 3),
    (8, (8, 6, 4), 1, 26),
    (8, (8, 6, 4), 1, 31),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("d,widths,m,seed", SIZES + DEEP, ids=lambda v: str(v))
def test_chosen(benchmark, machine, d, widths, m, seed, dtype):
    hidden, out = planted(d, widths, m, seed)
    f = model(hidden, out, dtype)
    res = benchmark.pedantic(run_extract, args=(f, d, widths, "chosen"), rounds=3 if len(widths) == 1 else 1)
    record(benchmark, machine, res, model(hidden, out, np.float64), d, widths, m, "chosen", dtype)
    if len(widths) == 1:
        assert res.exact and res.precision == dtype.__name__
    else:
        assert res.exact or res.status != "exact"


@pytest.mark.parametrize("d,widths,m,seed", SIZES[:2], ids=lambda v: str(v))
def test_random(benchmark, machine, d, widths, m, seed):
    hidden, out = planted(d, widths, m, seed)
    f = model(hidden, out, np.float64)
    res = benchmark.pedantic(run_extract, args=(f, d, widths, "random"), rounds=1)
    record(benchmark, machine, res, f, d, widths, m, "random", np.float64)
