"""Run under ``mpiexec -n R python bench/mpi_timing.py N [gaussian|enumeration]``: each rank
holds its share of N samples and times ``recover(..., comm=COMM_WORLD)``; rank 0 prints a
dict of the slowest rank's seconds.

- ``gaussian`` (default): d = 50, k = 10, m = 20, bjw19-gaussian with the adaptive and the
  "all" estimate.
- ``enumeration``: Laplace inputs, d = 5, k = 4, m = 4, bjw19-enumeration (the candidate
  patterns split across the ranks), with its counts of patterns, LPs and linear systems
  (equal for every number of ranks: the work is split, not repeated); then outputs no
  network gives (random, rank 3, n / 5 samples), where each of 200 candidate patterns
  costs an LP pair (one kernel thread per rank).
"""

import sys
import time
import warnings

import numpy as np
from mpi4py import MPI

import relufast as rf

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
n = int(sys.argv[1])
case = sys.argv[2] if len(sys.argv) > 2 else "gaussian"
out = {"n": n, "ranks": size, "case": case}


def timed(X, Y, k, **kw):
    comm.Barrier()
    t = time.perf_counter()
    res = rf.recover(X, Y, n_hidden=k, comm=comm, **kw)
    return res, comm.allreduce(time.perf_counter() - t, op=MPI.MAX)


with warnings.catch_warnings():
    warnings.simplefilter("ignore", rf.RelufastWarning)
    if case == "gaussian":
        net = rf.planted.two_layer(d=50, k=10, m=20, random_state=0)
        X, Y = net.sample(n // size, random_state=100 + rank)
        for mode in (None, "all"):
            kw = {"method": "bjw19-gaussian", "random_state": 0, "n_estimate": mode}
            timed(X, Y, 10, **kw)  # warm-up: imports, thread pools
            res, wall = timed(X, Y, 10, **kw)
            out[f"seconds_{mode or 'adaptive'}"] = wall
            out["status"] = res.status.value
            out[f"error_V_{mode or 'adaptive'}"] = rf.metrics.parameter_error(res, net).V
    else:
        net = rf.planted.two_layer(d=5, k=4, m=4, random_state=4, max_cos=0.9)
        X, Y = net.sample(n, random_state=5, input="laplace")
        share = slice(n * rank // size, n * (rank + 1) // size)
        kw = {"method": "bjw19-enumeration", "random_state": 0, "progress": False}
        res, wall = timed(X[share], Y[share], 4, **kw)
        out.update(seconds=wall, status=res.status.value, error_V=rf.metrics.parameter_error(res, net).V)
        out.update({key: res.counts[key] for key in ("patterns_tried", "lps_solved", "linear_systems")})
        out["search_seconds"] = comm.allreduce(res.seconds.get("search", 0.0), op=MPI.MAX)
        # Outputs of rank k that no ReLU network of these inputs gives: every candidate
        # pattern goes to the LPs of Algorithm 1 (a fixed number, max_patterns).
        rng = np.random.default_rng(6)
        Xs = rng.laplace(size=(n // 5, 5))
        Ys = rng.standard_normal((n // 5, 3)) @ rng.standard_normal((3, 4))
        share = slice(len(Xs) * rank // size, len(Xs) * (rank + 1) // size)
        res, wall = timed(Xs[share], Ys[share], 3, max_patterns=200, n_jobs=1, **kw)
        out.update(lp_case_seconds=wall, lp_case_status=res.status.value)
        out.update({"lp_case_" + key: res.counts[key] for key in ("patterns_tried", "lps_solved", "linear_systems")})
if rank == 0:
    print(repr(out))
