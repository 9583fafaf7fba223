"""Reductions: the one place that knows how partial sums meet (local, MPI, dask).

Every relufast moment keeps raw sums (a dict of arrays and scalars), so partial results
from sample blocks, threads, MPI ranks and dask blocks combine by addition. Pipelines
call :func:`allreduce_state` and :func:`row_blocks` and never branch on the engine.
"""
from __future__ import annotations

import numpy as np

__all__ = ["is_dask", "row_blocks", "allreduce_state"]


def is_dask(a):
    """True for a dask array (duck-typed: dask is an optional dependency)."""
    return hasattr(a, "dask") and hasattr(a, "chunks") and not isinstance(a, np.ndarray)


def row_blocks(X, Y):
    """Aligned row blocks of dask (or NumPy) arrays X and Y, as NumPy arrays, one at a time."""
    import dask.array as da

    X = da.asarray(X)
    Y = da.asarray(Y)
    if X.ndim != 2 or Y.ndim not in (1, 2) or X.shape[0] != Y.shape[0]:
        raise ValueError(f"X must be (n, d) and Y (n, m) or (n,) with the same n; got {X.shape} and {Y.shape}")
    if Y.ndim == 1:
        Y = Y[:, None]
    X = X.rechunk({1: -1})
    Y = Y.rechunk({0: X.chunks[0], 1: -1})
    for i in range(X.numblocks[0]):
        yield np.asarray(X.blocks[i, 0].compute()), np.asarray(Y.blocks[i, 0].compute())


def allreduce_state(state, comm):
    """Sum every entry of a state dict over the ranks of an mpi4py communicator.

    Entries are summed in rank order by ``comm.allreduce``, so every rank receives the same
    bits. ``comm=None`` returns the state unchanged.
    """
    if comm is None:
        return dict(state)
    return {key: comm.allreduce(value) for key, value in state.items()}
