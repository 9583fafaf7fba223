"""Command line: ``relufast demo``, ``relufast recover``, ``relufast info``."""
from __future__ import annotations

import argparse
import sys
import time
import warnings


def _demo(args):
    import relufast as rf

    print(f"relufast {rf.__version__} (kernels: {rf.BACKEND})")
    print(f"planting y = U relu(V x): d = {args.d}, k = {args.k}, m = {args.m}; "
          f"n = {args.n} Gaussian samples, noise = {args.noise}")
    net = rf.planted.two_layer(d=args.d, k=args.k, m=args.m, random_state=args.seed)
    X, Y = net.sample(args.n, random_state=args.seed + 1, noise=args.noise)
    t = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", rf.RelufastWarning)
        options = {"random_state": args.seed}
        if args.n_jobs is not None:
            options["n_jobs"] = args.n_jobs
        res = rf.recover(X, Y, n_hidden=args.k, method=args.method, **options)
    elapsed = time.perf_counter() - t
    err = rf.metrics.parameter_error(res, net)
    print(f"method:   {res.method}")
    print(f"status:   {res.status.value} (exact = {res.exact})")
    print(f"message:  {res.message}")
    print(f"residual: {res.residual:.3e}")
    print(f"error:    U {err.U:.3e}, V {err.V:.3e} (relative, after best permutation)")
    print("seconds:  " + ", ".join(f"{k} {v:.3f}" for k, v in res.seconds.items()))
    print(f"wall:     {elapsed:.3f} s")
    for w in caught:
        print(f"warning:  {w.message}")
    return 0 if res.success else 1


def _recover(args):
    import numpy as np

    import relufast as rf

    def load(path, key):
        data = np.load(path)
        if isinstance(data, np.ndarray):
            return data
        if key not in data:
            raise SystemExit(f"relufast: {path} has arrays {list(data.keys())}; expected one named {key!r}")
        return data[key]

    X = load(args.x if args.x else args.data, "X")
    Y = load(args.y if args.y else args.data, "Y")
    options = {"random_state": args.seed}
    if args.n_jobs is not None:
        options["n_jobs"] = args.n_jobs
    res = rf.recover(X, Y, n_hidden=args.n_hidden, method=args.method, **options)
    print(res)
    print(res.message)
    if args.out:
        np.savez(args.out, U=res.U, V=res.V, status=res.status.value, residual=res.residual)
        print(f"wrote {args.out}")
    return 0 if res.success else 1


def _reproduce(args):
    from relufast import reproduce

    reproduce.main(args.experiment, full=args.full, trials=args.trials, out=args.out, seed=args.seed,
                   progress=False if args.no_progress else None)
    return 0


def _info(args):
    import relufast as rf

    print(f"relufast {rf.__version__}")
    print(f"kernels: {rf.BACKEND}")
    for name, (_, cite) in sorted(rf.METHODS.items()):
        print(f"  {name}: {cite}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="relufast", description="Provable recovery of two-layer ReLU networks.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="plant a network, recover it, print errors and timings")
    p.add_argument("--d", type=int, default=20, help="input dimension (default 20)")
    p.add_argument("--k", type=int, default=5, help="hidden units (default 5)")
    p.add_argument("--m", type=int, default=8, help="outputs (default 8)")
    p.add_argument("--n", type=int, default=20000, help="samples (default 20000)")
    p.add_argument("--noise", type=float, default=0.0, help="output noise standard deviation")
    p.add_argument("--method", default="bjw19-gaussian")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-jobs", type=int, default=None)
    p.set_defaults(func=_demo)

    p = sub.add_parser("recover", help="recover a network from .npz/.npy files")
    p.add_argument("data", nargs="?", help=".npz file holding arrays X and Y")
    p.add_argument("--x", help=".npy file of inputs (n, d)")
    p.add_argument("--y", help=".npy file of outputs (n, m)")
    p.add_argument("--n-hidden", type=int, required=True)
    p.add_argument("--method", default="auto")
    p.add_argument("--out", help="write U, V, status and residual to this .npz file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-jobs", type=int, default=None)
    p.set_defaults(func=_recover)

    p = sub.add_parser("reproduce", help="reproduce a paper's experiment to a CSV and a PNG figure")
    p.add_argument("experiment", choices=["gklw19-fig2", "gklw19-fig3", "gklw19-fig4"])
    p.add_argument("--full", action="store_true", help="the paper's sizes (slow)")
    p.add_argument("--trials", type=int, default=5, help="trials per point (paper: 5)")
    p.add_argument("--out", default=".", help="output folder (default: current folder)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_reproduce)

    p = sub.add_parser("info", help="version, kernel build and methods")
    p.set_defaults(func=_info)

    args = parser.parse_args(argv)
    if args.command == "recover" and not (args.data or (args.x and args.y)):
        parser.error("recover needs an .npz file with X and Y, or both --x and --y")
    try:
        return args.func(args)
    except (ValueError, TypeError) as exc:
        print(f"relufast: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
