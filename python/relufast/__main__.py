"""Command line: ``relufast demo``, ``relufast recover``, ``relufast info``."""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings


class _CommandError(Exception):
    """A user mistake on the command line: printed as one line, no traceback."""


def _positive_int(text):
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1; got {value}")
    return value


def _nonnegative_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0; got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0; got {text}")
    return value


class _Warnings:
    """Collect RelufastWarnings during a command and print each distinct one once, readably."""

    def __enter__(self):
        import relufast as rf

        self._ctx = warnings.catch_warnings(record=True)
        self.caught = self._ctx.__enter__()
        warnings.simplefilter("always", rf.RelufastWarning)
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        return False

    def print(self, stream=None):
        import textwrap

        stream = stream or sys.stderr
        for text in dict.fromkeys(str(w.message) for w in self.caught):
            print(textwrap.fill(text, width=100, initial_indent="warning:  ", subsequent_indent="          "),
                  file=stream)


def _demo(args):
    import relufast as rf

    print(f"relufast {rf.__version__} (kernels: {rf.BACKEND})")
    print(f"planting y = U relu(V x): d = {args.d}, k = {args.k}, m = {args.m}; "
          f"n = {args.n} Gaussian samples, noise = {args.noise}")
    net = rf.planted.two_layer(d=args.d, k=args.k, m=args.m, random_state=args.seed)
    X, Y = net.sample(args.n, random_state=args.seed + 1, noise=args.noise)
    t = time.perf_counter()
    with _Warnings() as caught:
        options = {"random_state": args.seed}
        if args.n_jobs is not None:
            options["n_jobs"] = args.n_jobs
        res = rf.recover(X, Y, n_hidden=args.k, method=args.method, **options)
    elapsed = time.perf_counter() - t
    print(f"method:   {res.method}")
    if "auto" in res.diagnostics:
        print(f"auto:     {res.diagnostics['auto']}")
    print(f"status:   {res.status.value} (exact = {res.exact})")
    print(f"message:  {res.message}")
    print(f"residual: {res.residual:.3e}")
    if res.U is not None and res.V is not None:
        err = rf.metrics.parameter_error(res, net)
        print(f"error:    U {err.U:.3e}, V {err.V:.3e} (relative, after best permutation)")
    else:
        print("error:    - (no network returned)")
    print("seconds:  " + ", ".join(f"{k} {v:.3f}" for k, v in res.seconds.items()))
    print(f"wall:     {elapsed:.3f} s")
    caught.print(sys.stdout)
    return 0 if res.success else 1


def _recover(args):
    import numpy as np

    import relufast as rf

    def load(path, key):
        if not os.path.isfile(path):
            raise _CommandError(f"no such input file: {path}")
        try:
            data = np.load(path)
        except (OSError, ValueError) as exc:
            raise _CommandError(f"cannot read {path} as .npy/.npz: {exc}") from None
        if isinstance(data, np.ndarray):
            return data
        if key not in data:
            raise _CommandError(f"{path} has arrays {list(data.keys())}; expected one named {key!r}")
        return data[key]

    if args.out:
        folder = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(folder):
            raise _CommandError(f"the output folder {folder} does not exist")
    X = load(args.x if args.x else args.data, "X")
    Y = load(args.y if args.y else args.data, "Y")
    options = {"random_state": args.seed}
    if args.n_jobs is not None:
        options["n_jobs"] = args.n_jobs
    with _Warnings() as caught:
        res = rf.recover(X, Y, n_hidden=args.n_hidden, method=args.method, **options)
    print(res)
    print(res.message)
    caught.print()
    if args.out:
        # Only the arrays the result has (never None saved as an object array).
        arrays = {name: getattr(res, name) for name in ("U", "V", "b", "c") if getattr(res, name) is not None}
        np.savez(args.out, status=res.status.value, message=res.message, exact=res.exact,
                 residual=res.residual, method=res.method, **arrays)
        print(f"wrote {args.out}" + ("" if arrays else " (status and message only: no network returned)"))
    return 0 if res.success else 1


def _reproduce(args):
    from relufast import reproduce

    parent = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(parent):
        raise _CommandError(f"the folder {parent} (parent of --out {args.out}) does not exist")

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
    import relufast as rf

    methods = ["auto"] + sorted(rf.METHODS)
    method_help = ("recovery method: " + ", ".join(methods) + " (auto tries the certified methods in "
                   "order of cost; docs/results.md)")
    parser = argparse.ArgumentParser(
        prog="relufast", description="Provable weight recovery of two-layer ReLU networks "
        "y = U relu(V x) from inputs X and outputs Y.")
    parser.add_argument("--version", action="version", version=f"relufast {rf.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="plant a network, recover it, print errors and timings",
                       description="Plant a random network, sample Gaussian inputs, recover it and "
                       "print the status, errors and timings.")
    p.add_argument("--d", type=_positive_int, default=20, help="input dimension d (default 20)")
    p.add_argument("--k", type=_positive_int, default=5, help="hidden units k (default 5)")
    p.add_argument("--m", type=_positive_int, default=8,
                   help="outputs m (default 8; m < k is handled by bjw19-fpt under auto)")
    p.add_argument("--n", type=_positive_int, default=20000, help="samples n (default 20000)")
    p.add_argument("--noise", type=_nonnegative_float, default=0.0,
                   help="standard deviation of Gaussian output noise (default 0: exact outputs)")
    p.add_argument("--method", default="auto", choices=methods, metavar="METHOD", help=method_help)
    p.add_argument("--seed", type=int, default=0, help="seed of the planted network and samples (default 0)")
    p.add_argument("--n-jobs", type=_positive_int, default=None,
                   help="threads for the C++ kernels (default: all cores)")
    p.set_defaults(func=_demo)

    p = sub.add_parser("recover", help="recover a network from .npz/.npy files",
                       description="Recover U and V from inputs X (n, d) and outputs Y (n, m).")
    p.add_argument("data", nargs="?", help=".npz file holding arrays named X and Y")
    p.add_argument("--x", help=".npy file of inputs X of shape (n, d) (with --y, instead of DATA)")
    p.add_argument("--y", help=".npy file of outputs Y of shape (n, m) (with --x, instead of DATA)")
    p.add_argument("--n-hidden", type=_positive_int, required=True, help="number of hidden units k")
    p.add_argument("--method", default="auto", choices=methods, metavar="METHOD", help=method_help)
    p.add_argument("--out", help="write U, V (when recovered), b, c, status, message and residual to "
                   "this .npz file")
    p.add_argument("--seed", type=int, default=0, help="random seed of the method (default 0)")
    p.add_argument("--n-jobs", type=_positive_int, default=None,
                   help="threads for the C++ kernels (default: all cores)")
    p.set_defaults(func=_recover)

    from relufast.reproduce import EXPERIMENTS

    p = sub.add_parser("reproduce", help="reproduce a paper's experiment to a CSV and a PNG figure",
                       description="Reproduce a figure of a paper: " + "; ".join(
                           f"{k}: {v}" for k, v in EXPERIMENTS.items()))
    p.add_argument("experiment", choices=sorted(EXPERIMENTS), help="experiment: " + ", ".join(sorted(EXPERIMENTS)))
    p.add_argument("--full", action="store_true", help="the paper's sizes (slow: hours on 2 cores)")
    p.add_argument("--trials", type=_positive_int, default=5, help="trials per point, >= 1 (paper: 5)")
    p.add_argument("--out", default=".", help="output folder for the CSV and PNG (default: current folder)")
    p.add_argument("--seed", type=int, default=0, help="base seed of the trials (default 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=_reproduce)

    p = sub.add_parser("info", help="version, kernel build and methods with their citations")
    p.set_defaults(func=_info)

    args = parser.parse_args(argv)
    if args.command == "recover" and not (args.data or (args.x and args.y)):
        parser.error("recover needs an .npz file with X and Y, or both --x and --y")
    try:
        return args.func(args)
    except (ValueError, TypeError, _CommandError) as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"relufast: error: {text[:500]}", file=sys.stderr)  # one line, never a traceback
        return 2
    except KeyboardInterrupt:
        print("relufast: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
