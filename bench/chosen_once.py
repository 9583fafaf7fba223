"""One chosen-query extraction of a planted deep network, printed as JSON (status, residual,
queries, seconds, seconds by stage, peak memory): for a machine held for minutes
(``bench/many_core.sh``), where the pytest-benchmark suite ``bench/test_bench_chosen_size.py``
is too long.

Run: python bench/chosen_once.py 784 64,64 10 [--float32]
"""

import argparse
import json
import resource
import time
import warnings

import numpy as np

import relufast as rf


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("d", type=int)
    ap.add_argument("widths", help="hidden widths, comma-separated")
    ap.add_argument("m", type=int)
    ap.add_argument("--float32", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    widths = tuple(int(w) for w in a.widths.split(","))
    hidden, out = rf.planted.deep_relu(a.d, list(widths), a.m, random_state=a.seed)
    f = rf.planted.relu_function(hidden, out, dtype=np.float32 if a.float32 else np.float64)
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = rf.extract(f, a.d, widths, queries="chosen", random_state=a.seed)
    print(
        json.dumps(
            dict(
                network=f"{a.d}-{'-'.join(map(str, widths))}-{a.m}",
                float32=a.float32,
                status=str(res.status.value),
                residual=float(res.residual),
                queries=int(res.counts["queries"]),
                seconds=round(time.perf_counter() - t, 2),
                stages={k: round(v, 2) for k, v in res.seconds.items()},
                queries_by_stage=res.diagnostics.get("queries_by_stage"),
                peak_gb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2),
            )
        )
    )


if __name__ == "__main__":
    main()
