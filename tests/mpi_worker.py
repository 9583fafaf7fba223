"""Run under ``mpiexec -n R python tests/mpi_worker.py OUT``: every rank recovers planted
networks from its own share of the samples with ``comm=MPI.COMM_WORLD`` and writes what it
got to ``OUT.rank<r>.npz`` (tests/test_mpi.py compares the ranks with one process).

Also exercised: the errors that must reach every rank without a deadlock.
"""

import sys
import warnings

import numpy as np
from mpi4py import MPI

import relufast as rf
from tests.mpi_cases import CASES, case_data

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
out = {}
for name, (method, kw) in CASES.items():
    X, Y, k = case_data(name)
    parts = np.array_split(np.arange(len(X)), size)
    idx = parts[rank]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        res = rf.recover(X[idx], Y[idx], n_hidden=k, method=method, comm=comm, **kw)
    out[name + ".U"], out[name + ".V"] = res.U, res.V
    out[name + ".status"] = np.array(str(res.status))
    out[name + ".residual"] = np.array(res.residual)

# Errors on every rank, no deadlock: ranks with different d; NaN on one rank only.
X, Y, k = case_data("gaussian")
Xbad = X[:5000, : 8 + rank]
try:
    rf.recover(Xbad, Y[:5000], n_hidden=3, method="bjw19-gaussian", comm=comm)
    out["err.d"] = np.array("")
except ValueError as exc:
    out["err.d"] = np.array(str(exc))
Xn = X[:20000].copy()
if rank == size - 1:
    Xn[3, 1] = np.nan
try:
    rf.recover(Xn, Y[:20000], n_hidden=3, method="bjw19-noisy", comm=comm)
    out["err.nan"] = np.array("")
except ValueError as exc:
    out["err.nan"] = np.array(str(exc))
np.savez(f"{sys.argv[1]}.rank{rank}.npz", **out)
