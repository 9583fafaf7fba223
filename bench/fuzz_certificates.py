"""Fuzz the certificates: ``exact`` must mean the network is right on fresh inputs.

Seeded random planted networks across methods, layouts of the samples (NumPy, memmap, dask,
two MPI ranks simulated by threads: ``tests/threadcomm.py``), scales of X and Y, inputs in
a subspace, hidden biases, dead units, zero output columns, constant outputs and float32
outputs. For every case that comes back ``exact`` the script draws fresh inputs from the full
input law (R^d, even when the samples spanned a subspace) and checks that the recovered
network's relative error against the planted one is at rounding level (1e-8 for float64
outputs, 1e-5 for float32). Any other status is allowed (it promises nothing about the
network), but no call may raise on valid data.

Run: ``python bench/fuzz_certificates.py --cases 200 [--seed 0] [--minutes 5]``. Prints one
line per failure and a summary; exits 1 when a certificate was wrong or a call raised.
``tests/test_trust3.py`` runs a few cases of it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import relufast  # noqa: E402
from relufast.planted import PlantedNetwork  # noqa: E402

METHODS = (
    "auto",
    "bjw19-gaussian",
    "bjw19-enumeration",
    "bjw19-fpt",
    "bjw19-ica",
    "bjw19-noisy",
    "gklw19",
    "atv21",
)
LAYOUTS = ("numpy", "memmap", "dask", "ranks")
#: Largest relative error on fresh inputs of an ``exact`` network.
ROUNDING = {"float64": 1e-8, "float32": 1e-5}


def draw_case(rng):
    """One case: a dict of what to plant and how to present it."""
    method = str(rng.choice(METHODS))
    d = int(rng.integers(3, 9))
    k = int(rng.integers(1, min(d, 4) + 1))
    m = int(rng.integers(1, 6))
    biased = method in ("atv21", "auto") and rng.random() < 0.5
    return {
        "method": method,
        "layout": str(rng.choice(LAYOUTS)),
        "d": d,
        "k": k,
        "m": m,
        "n": int(rng.choice([400, 2000, 20000])) if method != "atv21" else int(rng.choice([20000, 40000])),
        "x_scale": float(10.0 ** rng.uniform(-3, 3)) if rng.random() < 0.5 else 1.0,
        "y_scale": float(10.0 ** rng.uniform(-6, 6)) if rng.random() < 0.5 else 1.0,
        "subspace": str(rng.choice(["none", "none", "zero", "rotated"])),
        "biased": bool(biased),
        "dead": bool(biased and rng.random() < 0.2),
        "zero_column": bool(rng.random() < 0.1),
        "constant": bool(rng.random() < 0.04),
        "float32": bool(rng.random() < 0.15),
        "seed": int(rng.integers(2**31)),
    }


def plant(case):
    """(network, X, Y, null-space basis or None) of a case."""
    rng = np.random.default_rng(case["seed"])
    d, k, m, n = case["d"], case["k"], case["m"], case["n"]
    V = rng.standard_normal((k, d))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    U = rng.standard_normal((m, k))
    if case["zero_column"]:
        U[:, rng.integers(k)] = 0.0
    b = c = None
    if case["biased"]:
        b = rng.uniform(-0.5, 0.5, k)
        c = rng.standard_normal(m)
        if case["dead"]:
            b[rng.integers(k)] = -7.0
    net = PlantedNetwork(U=U * case["y_scale"], V=V, b=b, c=None if c is None else c * case["y_scale"])
    X = rng.standard_normal((n, d))
    Q = None
    if case["subspace"] == "zero":
        j = int(rng.integers(d))
        X[:, j] = 0.0
        Q = np.eye(d)[[j]]
    elif case["subspace"] == "rotated":
        Q = np.linalg.qr(rng.standard_normal((d, 1)))[0].T
        X -= (X @ Q.T) @ Q
    Y = net.predict(X)
    if case["constant"]:
        Y = np.tile(rng.standard_normal(m) * case["y_scale"], (n, 1))
    Xs = X * case["x_scale"]
    # the network on the caller's inputs: V x / s
    net_x = PlantedNetwork(U=net.U, V=net.V / case["x_scale"], b=net.b, c=net.c)
    if case["float32"]:
        Xs = Xs.astype(np.float32)
        Y = net_x.predict(Xs.astype(np.float64)) if not case["constant"] else Y
        Y = Y.astype(np.float32)
    return net_x, Xs, Y, Q


def _recover_ranks(X, Y, k, method, opts):
    from tests.threadcomm import run_ranks

    parts = np.array_split(np.arange(len(X)), 2)
    out, _ = run_ranks(
        2, lambda r, comm: relufast.recover(X[parts[r]], Y[parts[r]], n_hidden=k, method=method, comm=comm, **opts)
    )
    if out[0].status != out[1].status:
        raise AssertionError(f"the ranks disagree: {out[0].status} vs {out[1].status}")
    return out[0]


def recover(case, X, Y, tmpdir):
    """``relufast.recover`` on the case's layout (warnings silenced)."""
    method, k = case["method"], case["k"]
    opts = {"random_state": 0}
    if method in ("auto", "bjw19-enumeration"):
        opts["time_limit"] = 5.0
    layout = case["layout"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if layout == "memmap":
            path = os.path.join(tmpdir, f"X{case['seed']}.npy")
            np.save(path, X)
            Xl = np.load(path, mmap_mode="r")
            return relufast.recover(Xl, Y, n_hidden=k, method=method, **opts)
        if layout == "dask":
            import dask.array as da

            chunks = max(len(X) // 3, 1)
            return relufast.recover(
                da.from_array(X, chunks=(chunks, -1)),
                da.from_array(Y, chunks=(chunks, -1)),
                n_hidden=k,
                method=method,
                **opts,
            )
        if layout == "ranks":
            return _recover_ranks(X, Y, k, method, opts)
        return relufast.recover(X, Y, n_hidden=k, method=method, **opts)


def fresh_error(res, net, case, n=4000):
    """Relative error of the result against the planted network on fresh inputs of R^d."""
    rng = np.random.default_rng(case["seed"] + 1)
    Xf = rng.standard_normal((n, case["d"])) * case["x_scale"]
    Yt = net.predict(Xf)
    den = np.linalg.norm(Yt)
    return float(np.linalg.norm(res.predict(Xf) - Yt) / den) if den > 0 else float(np.linalg.norm(res.predict(Xf)))


def run_case(case, tmpdir):
    """Run one case; returns (status, fresh error or None, problem or None)."""
    net, X, Y, _ = plant(case)
    try:
        res = recover(case, X, Y, tmpdir)
    except (ValueError, TypeError) as exc:  # a refusal with a clear message is allowed
        return "refused", None, None if str(exc) else f"empty {type(exc).__name__}"
    except Exception:  # noqa: BLE001 - anything else is a bug
        return "raised", None, traceback.format_exc(limit=3)
    if res.status != "exact":
        if res.success and not np.isfinite(res.residual):
            return res.status.value, None, "success with a non-finite residual"
        return res.status.value, None, None
    err = fresh_error(res, net, case)
    limit = ROUNDING["float32" if case["float32"] else "float64"]
    problem = None if err <= limit else f"exact but the fresh-input error is {err:.3g} > {limit:g}"
    return "exact", err, problem


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--minutes", type=float, default=None, help="stop starting new cases after this")
    ap.add_argument("--verbose", action="store_true", help="one line per case")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    counts, problems, ran = {}, [], 0
    with tempfile.TemporaryDirectory() as tmpdir:
        for i in range(args.cases):
            if args.minutes is not None and time.perf_counter() - t0 > 60 * args.minutes:
                break
            case = draw_case(rng)
            if args.verbose:
                print(f"case {i}: {case}", flush=True)
            status, err, problem = run_case(case, tmpdir)
            if args.verbose:
                print(f"  -> {status} {'' if err is None else f'{err:.2g}'}", flush=True)
            ran += 1
            counts[status] = counts.get(status, 0) + 1
            if problem:
                problems.append((i, case, problem))
                print(f"case {i}: {problem}\n  {case}", flush=True)
    print(f"{ran} cases in {time.perf_counter() - t0:.0f} s; statuses {counts}; {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
