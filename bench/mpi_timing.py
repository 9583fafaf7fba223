"""Run under ``mpiexec -n R python bench/mpi_timing.py N``: each rank draws its share of N
samples (d = 50, k = 10, m = 20), times ``recover(..., comm=COMM_WORLD)`` for the adaptive
and the "all" estimate, and rank 0 prints a dict of the slowest rank's seconds."""

import sys
import time
import warnings

from mpi4py import MPI

import relufast as rf

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
n = int(sys.argv[1])
net = rf.planted.two_layer(d=50, k=10, m=20, random_state=0)
X, Y = net.sample(n // size, random_state=100 + rank)
out = {"n": n, "ranks": size}
with warnings.catch_warnings():
    warnings.simplefilter("ignore", rf.RelufastWarning)
    for mode in (None, "all"):
        rf.recover(X, Y, n_hidden=10, method="bjw19-gaussian", random_state=0, n_estimate=mode, comm=comm)
        comm.Barrier()
        t = time.perf_counter()
        res = rf.recover(X, Y, n_hidden=10, method="bjw19-gaussian", random_state=0, n_estimate=mode, comm=comm)
        wall = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
        out[f"seconds_{mode or 'adaptive'}"] = wall
        out["status"] = res.status.value
        err = rf.metrics.parameter_error(res, net)
        out[f"error_V_{mode or 'adaptive'}"] = err.V
if rank == 0:
    print(repr(out))
