"""Command line: ``relufast demo``, ``relufast recover``, ``relufast extract``, ``relufast reproduce``,
``relufast info``.

Nothing heavy is imported at module level: each command imports what it uses, so that
``relufast --help`` and a command's argument errors answer at once.
"""

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


def _positive_float(text):
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0; got {text!r}") from None
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0; got {text}")
    return value


def _n_estimate(text):
    """argparse type of --n-estimate: an integer >= 1 or 'all'."""
    if text == "all":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'all'; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'all'; got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr (exit code 2), not the usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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
            print(
                textwrap.fill(text, width=100, initial_indent="warning:  ", subsequent_indent="          "), file=stream
            )


def _demo(args):
    import relufast as rf

    _check_method(args.method)
    print(f"relufast {rf.__version__} (kernels: {rf.BACKEND})")
    print(
        f"planting y = U relu(V x): d = {args.d}, k = {args.k}, m = {args.m}; "
        f"n = {args.n} Gaussian samples, noise = {args.noise}"
    )
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


#: File types that --x and --y read, besides .npy (memory-mapped).
TEXT_FORMATS = {".csv": ",", ".txt": None}
_NPY_MAGIC = b"\x93NUMPY"


def _read_array(path, option, ndmin=1):
    """One array from --x or --y: a .npy file memory-mapped, a .csv or .txt file read by
    numpy.loadtxt (a header line is skipped; ``ndmin=2``: one column is one feature);
    anything else is a one-line error."""
    import numpy as np

    ext = os.path.splitext(path)[1].lower()
    if ext in TEXT_FORMATS:
        delimiter = TEXT_FORMATS[ext]
        try:
            return np.loadtxt(path, delimiter=delimiter, dtype=np.float64, ndmin=ndmin)
        except ValueError:
            try:  # a header line
                return np.loadtxt(path, delimiter=delimiter, dtype=np.float64, ndmin=ndmin, skiprows=1)
            except ValueError as exc:
                raise ValueError(f"{option} {path}: not a table of numbers ({exc})") from None
    with open(path, "rb") as f:
        magic = f.read(len(_NPY_MAGIC))
    if not magic:
        raise ValueError(f"{option} {path} is an empty file")
    if magic != _NPY_MAGIC:
        what = "an .npz archive (give it as DATA)" if magic[:2] == b"PK" else "not a .npy file"
        raise ValueError(
            f"{option} {path} is {what}; {option} reads .npy (memory-mapped), .csv and .txt (numpy.loadtxt)"
        )
    try:
        return np.load(path, mmap_mode="r")
    except EOFError:
        raise ValueError(f"{option} {path} is an empty or truncated .npy file") from None
    except ValueError as exc:  # e.g. "mmap length is greater than file size"
        if "length" in str(exc) or "size" in str(exc):
            raise ValueError(
                f"{option} {path} is a truncated .npy file (its header promises more data than it holds)"
            ) from None
        raise ValueError(f"{option} {path}: {exc}") from None


def _read_npz(path):
    """X and Y of an .npz archive (read whole: it cannot be mapped)."""
    import zipfile
    import zlib

    import numpy as np

    with open(path, "rb") as f:
        magic = f.read(len(_NPY_MAGIC))
    if magic == _NPY_MAGIC:
        raise ValueError(f"{path} holds one array; give an .npz with X and Y, or --x and --y")
    if magic[:2] != b"PK":
        raise ValueError(
            f"{path} is not an .npz archive; DATA is an .npz with arrays X and Y or a zarr store "
            "(for .npy, .csv or .txt files use --x and --y)"
        )
    try:
        with open(path, "rb") as f, np.load(f) as data:  # closed however the archive fails
            missing = [key for key in ("X", "Y") if key not in data]
            if missing:
                raise ValueError(f"{path} has arrays {list(data.keys())}; expected ones named 'X' and 'Y'")
            return data["X"], data["Y"]
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        raise ValueError(f"{path} is a corrupt .npz archive ({exc})") from None


def _check_shapes(X, Y, x_source, y_source):
    """X of shape (n, d) and Y of shape (n, m) or (n,), with as many rows."""
    if X.ndim != 2:
        hint = ": for one feature, save X.reshape(-1, 1)" if X.ndim == 1 else ""
        raise ValueError(f"X ({x_source}) has shape {tuple(X.shape)}; expected a 2-D array (n, d){hint}")
    if Y.ndim not in (1, 2):
        raise ValueError(f"Y ({y_source}) has shape {tuple(Y.shape)}; expected (n, m) or (n,)")
    if len(X) != len(Y):
        raise ValueError(f"X has {len(X)} rows and Y {len(Y)}; they must match")


def _load_inputs(args, rank, size):
    """This rank's rows of X and Y: .npy pairs are memory-mapped (never loaded whole), .csv
    and .txt pairs read by numpy.loadtxt, a zarr store becomes dask arrays, an .npz is read
    (it cannot be mapped)."""

    def share(n):
        return slice(n * rank // size, n * (rank + 1) // size)

    if args.x or args.y:
        X, Y = _read_array(args.x, "--x", ndmin=2), _read_array(args.y, "--y")
        sources = (f"--x {args.x}", f"--y {args.y}")
    elif args.data.rstrip("/").endswith(".zarr") or os.path.isdir(args.data):
        try:
            import dask.array as da
        except ImportError:
            raise ValueError("reading a zarr store needs dask and zarr: pip install 'relufast[dask]' zarr") from None
        X, Y = da.from_zarr(args.data, component="X"), da.from_zarr(args.data, component="Y")
        sources = (args.data, args.data)
    else:
        (X, Y), sources = _read_npz(args.data), (args.data, args.data)
    _check_shapes(X, Y, *sources)
    part = share(len(X))
    return X[part], Y[part], len(X)


def _connect_mpi(args):
    """(comm, rank, size) of the MPI run (``--mpi``), or (None, 0, 1)."""
    if not args.mpi:
        return None, 0, 1
    try:
        from mpi4py import MPI
    except ImportError:
        raise _CommandError(
            "--mpi needs mpi4py: pip install 'relufast[mpi]', then run under mpiexec -n R relufast recover ... --mpi"
        ) from None
    comm = MPI.COMM_WORLD
    return comm, comm.Get_rank(), comm.Get_size()


def _save_result(args, res, arrays, **extra):
    """Write the result's status, message, certificate and ``arrays`` to ``--out`` (.npz);
    returns the path written."""
    import numpy as np

    out = _out_path(args)
    np.savez(
        out,
        status=res.status.value,
        message=res.message,
        exact=res.exact,
        residual=res.residual,
        method=res.method,
        **extra,
        **arrays,
    )
    return out


def _out_path(args):
    """The file --out writes (np.savez adds .npz to a name without it)."""
    return args.out if args.out is None or args.out.endswith(".npz") else args.out + ".npz"


def _output_problem(given, option, path=None, example="net.npz"):
    """Why an output file cannot be written (None when it can): checked before any work by
    opening it for appending (an existing file is left as it is, a new one removed).
    ``given`` is the name on the command line, ``path`` the file written (default: given)."""
    if os.path.isdir(given) or given.endswith(("/", os.sep)):
        return f"{option} {given} is a folder; give a file name, e.g. {os.path.join(given, example)}"
    path = path or given
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        parent = folder
        while not os.path.exists(parent) and os.path.dirname(parent) != parent:
            parent = os.path.dirname(parent)
        if os.path.exists(parent) and not os.path.isdir(parent):
            return f"cannot write {option} {given}: {parent} is a file, not a folder"
        return f"the output folder {folder} does not exist"
    existed = os.path.exists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        return f"cannot write {option} {path}: {exc.strerror or exc}"
    if not existed:
        os.remove(path)
    return None


def _check_paths(args, comm=None, rank=0):
    """Input files that do not exist, and outputs that cannot be written, are user errors,
    found before any work (rank 0 probes the outputs and tells every rank)."""
    if args.data and (args.x or args.y):
        raise _CommandError("give either DATA (an .npz or a zarr store) or --x and --y, not both")
    for path in (args.data, args.x, args.y):
        if path and not os.path.exists(path):
            raise _CommandError(f"no such input file: {path}")
    problem = None
    if rank == 0:
        if args.out:
            problem = _output_problem(args.out, "--out", _out_path(args))
        if args.diagnostics and not problem:
            problem = _output_problem(args.diagnostics, "--diagnostics", example="diagnostics.json")
    if comm is not None:
        problem = comm.bcast(problem, root=0)
    if problem:
        raise _CommandError(problem)


def _storage(X):
    """How the inputs are held: "dask arrays", "memory-mapped" or "in memory"."""
    import numpy as np

    if hasattr(X, "chunks") and not isinstance(X, np.ndarray):
        return "dask arrays"
    return "memory-mapped" if isinstance(X, np.memmap) else "in memory"


def _recover_options(args, comm):
    """Keyword options of :func:`relufast.recover` from the command line."""
    options = {"random_state": args.seed}
    if args.n_jobs is not None:
        options["n_jobs"] = args.n_jobs
    if args.n_estimate is not None:
        options["n_estimate"] = args.n_estimate
    if comm is not None:
        options["comm"] = comm
    return options


def _recover(args):
    """``relufast recover``: read the inputs (this rank's share), recover, print and write."""
    import time

    import relufast as rf

    comm, rank, size = _connect_mpi(args)

    def say(msg):
        if rank == 0 and not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    _check_paths(args, comm, rank)
    _check_method(args.method)
    t0 = time.perf_counter()
    try:
        X, Y, n = _load_inputs(args, rank, size)
    except (OSError, ValueError, EOFError) as exc:
        raise _CommandError(f"cannot read the inputs: {exc}") from None
    kind = _storage(X)
    say(
        f"relufast: {n} samples, d = {X.shape[1]}, m = {1 if Y.ndim == 1 else Y.shape[1]} ({kind}"
        f"{f', {size} MPI ranks' if size > 1 else ''}); recovering with {args.method}, k = {args.n_hidden} ..."
    )
    options = _recover_options(args, comm)
    with _Warnings() as caught:
        res = rf.recover(X, Y, n_hidden=args.n_hidden, method=args.method, **options)
    say(f"relufast: done in {time.perf_counter() - t0:.2f} s")
    if rank == 0:
        print(res)
        print(res.message)
        caught.print()
        _write_outputs(args, res, n, size)
    return 0 if res.success else 1


def _write_outputs(args, res, n, size):
    """``--out`` (.npz of the network, status and message) and ``--diagnostics`` (JSON)."""
    import json

    if args.out:
        # Only the arrays the result has (never None saved as an object array).
        arrays = {name: getattr(res, name) for name in ("U", "V", "b", "c") if getattr(res, name) is not None}
        out = _save_result(args, res, arrays)
        print(f"wrote {out}" + ("" if arrays else " (status and message only: no network returned)"))
    if args.diagnostics:
        report = {
            "method": res.method,
            "status": res.status.value,
            "exact": res.exact,
            "residual": res.residual,
            "message": res.message,
            "n_samples": n,
            "mpi_ranks": size,
            "seconds": res.seconds,
            "counts": res.counts,
            "diagnostics": res.diagnostics,
        }
        with open(args.diagnostics, "w") as f:
            json.dump(_jsonable(report), f, indent=2)
        print(f"wrote {args.diagnostics}")


def _reproduce(args):
    from relufast import reproduce

    parent = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(parent):
        raise _CommandError(f"the folder {parent} (parent of --out {args.out}) does not exist")

    reproduce.main(
        args.experiment,
        full=args.full,
        trials=args.trials,
        out=args.out,
        seed=args.seed,
        progress=False if args.no_progress else None,
    )
    return 0


def _info(args):
    import relufast as rf

    print(f"relufast {rf.__version__}")
    print(f"kernels: {rf.BACKEND}")
    print("recover: passive recovery of a two-layer network from samples (X, Y), by the methods below")
    print(
        "extract: a model you can query (torch, scikit-learn, a callable); one hidden layer by random "
        "queries, several by chosen queries (relufast extract --help)"
    )
    print("methods of recover:")
    for name, entry in sorted(rf.METHODS.items()):
        print(f"  {name}: {entry.citation}")
    return 0


def _methods():
    """(names, help text) of --method: imports the registry, so only the commands that take it call this."""
    from relufast._result import DOCS_URL
    from relufast.methods import METHODS

    methods = ["auto"] + sorted(METHODS)
    method_help = (
        "recovery method: " + ", ".join(methods) + " (auto tries the certified methods in "
        f"order of cost; {DOCS_URL}/results.md)"
    )
    return methods, method_help


def _add_method_option(p, listing):
    """``--method``. Its help lists the methods, which imports the registry and the algorithms,
    only when help is asked for (``listing``); otherwise the name is checked when the command
    runs (:func:`_check_method`), after the cheap checks of the other arguments."""
    methods, method_help = _methods() if listing else (None, "recovery method (default auto; --help lists them)")
    p.add_argument("--method", default="auto", choices=methods, metavar="METHOD", help=method_help)


def _check_method(method):
    methods, _ = _methods()
    if method not in methods:
        raise _CommandError(f"--method {method!r} is not a method; expected one of {', '.join(methods)}")


def _add_demo(sub, name, summary, listing=True):
    p = sub.add_parser(
        name,
        help=summary,
        description="Plant a random network, sample Gaussian inputs, recover it and "
        "print the status, errors and timings.",
    )
    p.add_argument("--d", type=_positive_int, default=20, help="input dimension d (default 20)")
    p.add_argument("--k", type=_positive_int, default=5, help="hidden units k (default 5)")
    p.add_argument(
        "--m", type=_positive_int, default=8, help="outputs m (default 8; auto handles m < k by bjw19-fpt or atv21)"
    )
    p.add_argument("--n", type=_positive_int, default=20000, help="samples n (default 20000)")
    p.add_argument(
        "--noise",
        type=_nonnegative_float,
        default=0.0,
        help="standard deviation of Gaussian output noise (default 0: exact outputs)",
    )
    _add_method_option(p, listing)
    p.add_argument("--seed", type=int, default=0, help="seed of the planted network and samples (default 0)")
    p.add_argument(
        "--n-jobs",
        type=_positive_int,
        default=None,
        help="threads for the C++ kernels of random queries (default: all cores; chosen queries refuse it)",
    )
    p.set_defaults(func=_demo)


def _add_recover(sub, name, summary, listing=True):
    p = sub.add_parser(
        name,
        help=summary,
        description="Recover U and V (and b, c) from inputs X (n, d) and outputs Y (n, m).",
    )
    p.add_argument(
        "data",
        nargs="?",
        help=".npz file holding arrays named X and Y, or a zarr store "
        "(folder) with arrays X and Y (read as dask arrays)",
    )
    p.add_argument(
        "--x",
        help="inputs X of shape (n, d) (with --y, instead of DATA): a .npy file, memory-mapped, or a .csv or "
        ".txt file (numpy.loadtxt)",
    )
    p.add_argument("--y", help="outputs Y of shape (n, m) or (n,) (with --x, instead of DATA): .npy, .csv or .txt")
    p.add_argument("--n-hidden", type=_positive_int, required=True, help="number of hidden units k")
    _add_method_option(p, listing)
    p.add_argument(
        "--out", help="write U, V (when recovered), b, c, status, message and residual to this .npz file (a file name)"
    )
    p.add_argument("--diagnostics", help="write status, timings, counts and diagnostics to this JSON file")
    p.add_argument(
        "--n-estimate",
        type=_n_estimate,
        default=None,
        help="samples of the moment estimate: an integer >= 1 or 'all' (default: adaptive)",
    )
    p.add_argument(
        "--mpi",
        action="store_true",
        help="run under mpiexec -n R: each rank reads its share of the rows; rank 0 writes the outputs",
    )
    p.add_argument("--quiet", action="store_true", help="no progress messages on stderr")
    p.add_argument("--seed", type=int, default=0, help="random seed of the method (default 0)")
    p.add_argument(
        "--n-jobs",
        type=_positive_int,
        default=None,
        help="threads for the C++ kernels of random queries (default: all cores; chosen queries refuse it)",
    )
    p.set_defaults(func=_recover)


def _add_reproduce(sub, name, summary, listing=True):
    from relufast.reproduce import EXPERIMENTS

    p = sub.add_parser(
        name,
        help=summary,
        description="Reproduce a figure of a paper: " + "; ".join(f"{k}: {v}" for k, v in EXPERIMENTS.items()),
    )
    p.add_argument("experiment", choices=sorted(EXPERIMENTS), help="experiment: " + ", ".join(sorted(EXPERIMENTS)))
    p.add_argument("--full", action="store_true", help="the paper's sizes (slow: hours on 2 cores)")
    p.add_argument("--trials", type=_positive_int, default=5, help="trials per point, >= 1 (paper: 5)")
    p.add_argument("--out", default=".", help="output folder for the CSV and PNG (default: current folder)")
    p.add_argument("--seed", type=int, default=0, help="base seed of the trials (default 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=_reproduce)


def _extract(args):
    """``relufast extract``: load the model, extract it, print the result and write ``--out``."""
    from relufast import _cli_extract as cli

    if args.out:
        problem = _output_problem(args.out, "--out", _out_path(args))
        if problem:
            raise _CommandError(problem)
    model = cli.load_model(args.model)
    n_features = args.n_features or cli.n_features_of(model)
    if n_features is None:
        raise _CommandError(f"give --n-features: {args.model} does not state its input dimension")
    import relufast as rf

    options = {"queries": args.queries, "random_state": args.random_state, "progress": False if args.quiet else None}
    for name in ("max_queries", "n_jobs", "time_limit"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if not args.quiet:
        how = f"{args.queries} queries" if args.queries else "the query mode relufast.extract picks"
        print(f"relufast: extracting {args.model} (d = {n_features}) with {how} ...", file=sys.stderr)
    t0 = time.perf_counter()
    with _Warnings() as caught:
        res = rf.extract(model, n_features, args.n_hidden, **options)
    print(res)
    print(f"status:   {res.status.value}")
    print(f"message:  {res.message}")
    print(f"queries:  {res.counts.get('queries', 0)}")
    print(f"seconds:  {time.perf_counter() - t0:.2f}")
    caught.print()
    if args.out:
        arrays = cli.arrays_of(res)
        out = _save_result(
            args, res, arrays, queries=res.counts.get("queries", 0), precision=getattr(res, "precision", "float64")
        )
        print(f"wrote {out} ({', '.join(arrays) or 'status and message only: no network returned'})")
    return 0 if res.success else 1


def _add_extract(sub, name, summary, listing=True):
    p = sub.add_parser(
        name,
        help=summary,
        description="Extract y = U relu(V x + b) + c (one hidden layer, random or chosen queries) or a network "
        "with several hidden layers (--n-hidden 20,10 --queries chosen) from a model you can query, by "
        "relufast.extract. Reading a torch file or a pickle runs the code it holds, and module:function imports "
        "the module: give only files and modules you trust.",
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        help="a torch.nn.Module saved by torch.save (.pt, .pth; read with weights_only=False), a pickled model "
        "such as a fitted scikit-learn MLPRegressor/MLPClassifier (.pkl, .pickle, .joblib), or module:function, "
        "a callable on arrays (n, d) (the current folder is searched first)",
    )
    p.add_argument(
        "--n-features",
        type=_positive_int,
        default=None,
        help="input dimension d (default: read from the model: its first nn.Linear, n_features_in_)",
    )
    p.add_argument(
        "--n-hidden",
        type=_widths,
        default=None,
        help="hidden units k, or the widths of several hidden layers separated by commas (20,10); default: "
        "the model's widths (torch, scikit-learn), else with random queries the units visible in the outputs",
    )
    p.add_argument(
        "--queries",
        choices=("random", "chosen"),
        default=None,
        help="random: Gaussian queries, one hidden layer; chosen: chosen queries, any depth (default: as "
        "relufast.extract, chosen for a torch or scikit-learn model and for several hidden layers, else random)",
    )
    p.add_argument("--max-queries", type=_positive_int, default=None, help="budget of queries (default: extract's)")
    p.add_argument(
        "--time-limit", type=_positive_float, default=None, help="seconds the extraction may take (default: no limit)"
    )
    p.add_argument("--random-state", "--seed", type=int, default=0, help="random seed of the queries (default 0)")
    p.add_argument(
        "--out", help="write the network (U, V, b, c, or W1, b1, ... per layer), status and message to this .npz file"
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr (shown on a terminal otherwise)")
    p.add_argument(
        "--n-jobs",
        type=_positive_int,
        default=None,
        help="threads for the C++ kernels of random queries (default: all cores; chosen queries refuse it)",
    )
    p.set_defaults(func=_extract)


def _widths(text):
    """argparse type of extract's --n-hidden (see relufast._cli_extract.widths)."""
    from relufast._cli_extract import widths

    return widths(text)


def _add_info(sub, name, summary, listing=True):
    sub.add_parser(name, help=summary, description=summary).set_defaults(func=_info)


#: The subcommands: name -> (one-line help, function adding its parser).
COMMANDS = {
    "demo": ("plant a network, recover it, print errors and timings", _add_demo),
    "recover": ("recover a two-layer network from samples: .npz/.npy/.csv files or a zarr store", _add_recover),
    "extract": (
        "extract a network from a model you can query: a torch file, a pickled sklearn model or module:function",
        _add_extract,
    ),
    "reproduce": ("reproduce a paper's experiment to a CSV and a PNG figure", _add_reproduce),
    "info": ("version, kernel build and methods with their citations", _add_info),
}


def _parser(command=None, listing=True):
    """The argument parser. Only ``command``'s own parser is built in full; the others are
    listed by name and help, so that ``relufast --help`` imports neither NumPy nor the
    algorithms. ``listing``: whether ``--method``'s help lists the methods (imports the registry)."""
    from relufast import __version__

    parser = _Parser(
        prog="relufast",
        description="Weight recovery of ReLU networks, with certificates: recover a two-layer network "
        "y = U relu(V x + b) + c from samples (X, Y), or extract a network, deep ones included, from a model "
        "you can query.",
    )
    parser.add_argument("--version", action="version", version=f"relufast {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (summary, add) in COMMANDS.items():
        if name == command:
            add(sub, name, summary, listing=listing)
        else:
            sub.add_parser(name, help=summary, add_help=False)
    return parser


def main(argv=None):
    """Run the command line; returns the exit code (0 success, 1 no network, 2 user error,
    130 interrupted)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # The top-level options take no value: the first word that is not an option is the command.
    command = next((word for word in argv if not word.startswith("-")), None)
    parser = _parser(command, listing=any(word in ("-h", "--help") for word in argv))
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
