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


def _jsonable(value):
    """Diagnostics as JSON: arrays to lists, NumPy scalars to Python, the rest as text."""
    import numpy as np

    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _load_inputs(args, rank, size):
    """This rank's rows of X and Y: .npy pairs are memory-mapped (never loaded whole), a
    zarr store becomes dask arrays, an .npz is read (it cannot be mapped)."""
    import os

    import numpy as np

    def share(n):
        return slice(n * rank // size, n * (rank + 1) // size)

    if args.x or args.y:
        X = np.load(args.x, mmap_mode="r")
        Y = np.load(args.y, mmap_mode="r")
        if not isinstance(X, np.ndarray) or not isinstance(Y, np.ndarray):
            raise ValueError("--x and --y must be .npy files (one array each); use an .npz as DATA")
    elif args.data.rstrip("/").endswith(".zarr") or os.path.isdir(args.data):
        try:
            import dask.array as da
        except ImportError:
            raise ValueError("reading a zarr store needs dask and zarr: pip install 'relufast[dask]' zarr") from None
        X, Y = da.from_zarr(args.data, component="X"), da.from_zarr(args.data, component="Y")
    else:
        data = np.load(args.data)
        if isinstance(data, np.ndarray):
            raise ValueError(f"{args.data} holds one array; give an .npz with X and Y, or --x and --y")
        missing = [key for key in ("X", "Y") if key not in data]
        if missing:
            raise ValueError(f"{args.data} has arrays {list(data.keys())}; expected ones named 'X' and 'Y'")
        X, Y = data["X"], data["Y"]
    if len(X) != len(Y):
        raise ValueError(f"X has {len(X)} rows and Y {len(Y)}; they must match")
    part = share(len(X))
    return X[part], Y[part], len(X)


def _recover(args):
    import json
    import time

    import numpy as np

    import relufast as rf

    comm, rank, size = None, 0, 1
    if args.mpi:
        try:
            from mpi4py import MPI
        except ImportError:
            raise ValueError("--mpi needs mpi4py: pip install 'relufast[mpi]', then run under "
                             "mpiexec -n R relufast recover ... --mpi") from None
        comm = MPI.COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()

    def say(msg):
        if rank == 0 and not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    X, Y, n = _load_inputs(args, rank, size)
    kind = "dask arrays" if hasattr(X, "chunks") and not isinstance(X, np.ndarray) else \
        "memory-mapped" if isinstance(X, np.memmap) else "in memory"
    say(f"relufast: {n} samples, d = {X.shape[1]}, m = {1 if Y.ndim == 1 else Y.shape[1]} ({kind}"
        f"{f', {size} MPI ranks' if size > 1 else ''}); recovering with {args.method}, k = {args.n_hidden} ...")
    options = {"random_state": args.seed}
    if args.n_jobs is not None:
        options["n_jobs"] = args.n_jobs
    if args.n_estimate is not None:
        options["n_estimate"] = args.n_estimate if args.n_estimate == "all" else int(args.n_estimate)
    if comm is not None:
        options["comm"] = comm
    method = args.method
    if method == "auto" and (comm is not None or kind != "in memory"):
        raise ValueError("--method auto looks at the data in memory on one process; name the method "
                         "(e.g. --method bjw19-gaussian) for memory-mapped, zarr or MPI inputs")
    res = rf.recover(X, Y, n_hidden=args.n_hidden, method=method, **options)
    say(f"relufast: done in {time.perf_counter() - t0:.2f} s")
    if rank == 0:
        print(res)
        print(res.message)
        if args.out:
            np.savez(args.out, U=res.U, V=res.V, b=res.b, c=res.c, status=res.status.value,
                     residual=res.residual, exact=res.exact)
            print(f"wrote {args.out}")
        if args.diagnostics:
            report = {"method": res.method, "status": res.status.value, "exact": res.exact,
                      "residual": res.residual, "message": res.message, "n_samples": n,
                      "mpi_ranks": size, "seconds": res.seconds, "counts": res.counts,
                      "diagnostics": res.diagnostics}
            with open(args.diagnostics, "w") as f:
                json.dump(_jsonable(report), f, indent=2)
            print(f"wrote {args.diagnostics}")
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

    p = sub.add_parser("recover", help="recover a network from .npz/.npy files or a zarr store")
    p.add_argument("data", nargs="?", help=".npz file holding arrays X and Y, or a zarr store "
                                           "(folder) with arrays X and Y (read as dask arrays)")
    p.add_argument("--x", help=".npy file of inputs (n, d), memory-mapped")
    p.add_argument("--y", help=".npy file of outputs (n, m), memory-mapped")
    p.add_argument("--n-hidden", type=int, required=True)
    p.add_argument("--method", default="auto", help="a method of relufast.METHODS (default auto)")
    p.add_argument("--out", help="write the network (U, V, b, c, status, residual) to this .npz file")
    p.add_argument("--diagnostics", help="write status, timings, counts and diagnostics to this JSON file")
    p.add_argument("--n-estimate", default=None, help="samples of the moment estimate: an integer or 'all' "
                                                      "(default: adaptive)")
    p.add_argument("--mpi", action="store_true", help="run under mpiexec -n R: each rank reads its "
                                                      "share of the rows; rank 0 writes the outputs")
    p.add_argument("--quiet", action="store_true", help="no progress messages on stderr")
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
