"""Chosen-query extraction at the size of trained networks: queries, seconds and peak memory
against the number of parameters, float64 and float32 (issue targets: 784-32-1, 784-128-1
and 100-64-64-10 exact within 30 s, 784-64-64-10 within 60 s, 784-128-128-10 within 3
minutes, under 2 GB, at most 30 queries a parameter).

Each network runs in a child process with a time budget (a size that does not finish is
recorded as such, with the stage it was in, rather than stalling the suite), and the child
reports its peak resident memory. Recorded in ``extra_info``: status, residual, queries,
queries per parameter, seconds by stage, peak memory, and the rows refitted per layer.
After the runs, the fitted exponents of queries and seconds against parameters over the
float64 networks that ended exact are printed and stored with the last case.

Run: python -m pytest bench/test_bench_chosen_size.py --benchmark-only -s
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

#: (d, widths, m, float32?, time budget in seconds)
NETWORKS = [
    (10, (5,), 1, False, 60),
    (100, (32,), 1, False, 120),
    (200, (50,), 1, False, 120),
    (784, (32,), 1, False, 180),
    (784, (128,), 1, False, 300),
    (784, (32,), 1, True, 300),
    # float32 with more inputs than finite differences resolve (first-layer rows refitted
    # through kinks around their own), and a deep float32 network.
    (100, (32,), 1, True, 120),
    (200, (32,), 1, True, 120),
    (784, (128,), 1, True, 400),
    (20, (10, 10), 10, True, 120),
    (64, (32, 32), 10, True, 300),
    (20, (10, 10), 10, False, 120),
    # First layers wider than the input (signs from the second layer's first units).
    (10, (20, 10), 1, False, 120),
    (16, (40, 20), 2, False, 120),
    (12, (30, 10), 3, False, 120),
    (64, (32, 32), 10, False, 400),
    (100, (64, 64), 10, False, 400),
    (784, (64, 64), 10, False, 400),
    (784, (128, 128), 10, False, 400),
]

CHILD = r"""
import json, resource, sys, time, warnings
import numpy as np
import relufast as rf
d, widths, m, f32 = json.loads(sys.argv[1])
hidden, out = rf.planted.deep_relu(d, list(widths), m, random_state=0)
f = rf.planted.relu_function(hidden, out, dtype=np.float32 if f32 else np.float64)
t = time.perf_counter()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    res = rf.extract(f, d, tuple(widths), queries="chosen", random_state=0)
print(json.dumps(dict(
    status=str(res.status.value), residual=float(res.residual), queries=int(res.counts["queries"]),
    seconds=time.perf_counter() - t, stages={k: round(v, 3) for k, v in res.seconds.items()},
    peak_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
    refitted=res.diagnostics.get("refitted_rows"), signs=res.diagnostics.get("signs_by_wiggle"),
    undetermined=len(res.undetermined_units or ()))))
"""

_RESULTS: list = []


def n_params(d, widths, m):
    dims = [d, *widths, m]
    return sum(dims[i + 1] * (dims[i] + 1) for i in range(len(dims) - 1))


def run_child(code, argument, budget):
    """Run ``code`` in a child Python with ``argument`` (JSON) as ``sys.argv[1]``; its last
    line of output parsed as JSON, or the status of a child that ran past ``budget`` seconds
    or failed (also used by bench/test_bench_trained.py)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t = time.perf_counter()
    try:
        r = subprocess.run(
            [sys.executable, "-c", code, json.dumps(argument)],
            capture_output=True,
            text=True,
            timeout=budget,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"status": f"not done in {budget} s", "seconds": time.perf_counter() - t}
    if r.returncode != 0:
        return {"status": "error", "error": r.stderr[-500:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _run(d, widths, m, f32, budget):
    return run_child(CHILD, [d, list(widths), m, f32], budget)


@pytest.mark.parametrize("d,widths,m,f32,budget", NETWORKS, ids=lambda v: str(v))
def test_chosen_size(benchmark, machine, d, widths, m, f32, budget):
    out = benchmark.pedantic(_run, args=(d, widths, m, f32, budget), rounds=1)
    P = n_params(d, widths, m)
    name = f"{d}-{'-'.join(map(str, widths))}-{m}" + (" float32" if f32 else "")
    info = dict(machine, network=name, parameters=P, **out)
    if "queries" in out:
        info["queries_per_parameter"] = out["queries"] / P
    _RESULTS.append(info)
    exact = [r for r in _RESULTS if r.get("status") == "exact" and not r["network"].endswith("float32")]
    if len(exact) >= 3:
        lp = np.log([r["parameters"] for r in exact])
        info["queries_exponent"] = float(np.polyfit(lp, np.log([r["queries"] for r in exact]), 1)[0])
        info["seconds_exponent"] = float(np.polyfit(lp, np.log([r["seconds"] for r in exact]), 1)[0])
    benchmark.extra_info.update(info)
    print(json.dumps({k: v for k, v in info.items() if k not in machine}))
    assert out["status"] != "error", out.get("error")
