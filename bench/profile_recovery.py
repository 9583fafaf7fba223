"""Where the time of one recovery goes, and how much of it is serial.

Profiles ``recover`` on a planted network (cProfile) and splits the wall time into the
parts that run on several threads (relufast's C++ kernels, the BLAS products lifted to the
method's threads, the waits of its thread pools) and the rest: Python and NumPy on one
thread, the serial part that bounds the speedup from more cores. Prints the stages'
seconds, that split and the functions with the most own time.

cProfile of Python 3.12 and later books the work of thread-pool threads under the main
thread's entries as well, so there the split overstates the part on one thread; the
estimate from two thread counts (``t = S + P / threads``, bench/test_bench_threads.py) does
not depend on the profiler.

Run: python bench/profile_recovery.py 784 128 128 200000 [--bias 0.5] [--threads 2] [--top 30]
"""

import argparse
import cProfile
import pstats
import time
import warnings

from threadpoolctl import threadpool_limits

import relufast as rf

#: cProfile entries that run on several threads: (file or module, function name); "" = any.
PARALLEL = [
    ("~", "relufast._core"),  # the C++ kernels (builtins of _core, _core_avx2, _core_avx512)
    ("~", "acquire"),  # waits of relufast._blas.thread_map for its pool
    ("moments.py", "_kernel_update"),  # one call into a C++ accumulator (its time shows here)
]


def split(stats):
    """(seconds on several threads, total own seconds) from a pstats.Stats."""
    parallel = total = 0.0
    for (filename, _line, name), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():
        total += tottime
        if any(where in filename and (what in name) for where, what in PARALLEL):
            parallel += tottime
    return parallel, total


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("d", type=int)
    ap.add_argument("k", type=int)
    ap.add_argument("m", type=int)
    ap.add_argument("n", type=int)
    ap.add_argument("--bias", type=float, default=None, help="one bias for every unit (atv21), offset 0.3")
    ap.add_argument("--threads", type=int, default=None, help="n_jobs and BLAS threads (default: all cores)")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    kw = {} if args.bias is None else dict(bias=args.bias, offset=0.3)
    net = rf.planted.two_layer(args.d, args.k, args.m, random_state=0, **kw)
    X, Y = net.sample(args.n, random_state=1)
    method = "bjw19-gaussian" if args.bias is None else "atv21"
    with threadpool_limits(args.threads, user_api="blas"), warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        warm = min(args.n, max(2000, 25 * args.k, 3 * (args.d + 1)))  # enough rows for atv21 (20 k)
        rf.recover(X[:warm], Y[:warm], n_hidden=args.k, method=method, n_jobs=args.threads, random_state=0)  # imports
        profile = cProfile.Profile()
        t = time.perf_counter()
        profile.enable()
        res = rf.recover(X, Y, n_hidden=args.k, method=method, n_jobs=args.threads, random_state=0)
        profile.disable()
        wall = time.perf_counter() - t
    stats = pstats.Stats(profile)
    parallel, total = split(stats)
    err = rf.metrics.parameter_error(res, net)
    print(f"{args.d}-{args.k}-{args.m} n={args.n} bias={args.bias} method={method} threads={args.threads}")
    print(f"status {res.status.value}, weight error {max(err.U, err.V, err.b):.2g}, wall {wall:.2f} s (profiled)")
    print("stages:", {key: round(v, 2) for key, v in res.seconds.items()})
    print(
        f"on several threads {parallel:.2f} s, on one thread {total - parallel:.2f} s "
        f"= {(total - parallel) / total:.1%} of {total:.2f} s"
    )
    stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
