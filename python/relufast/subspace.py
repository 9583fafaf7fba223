"""Inputs that span a subspace: run a method on the row space of X, report V there.

Real inputs often span a proper subspace of R^d (digits images have pixels that are zero in
every image). Then ``X z = 0`` for every z in the null space N of X, the outputs do not
change when a row of V moves along N, and no method can identify those components: V is
identifiable only on the row space of X. Several methods also break on such inputs (a
singular second-moment matrix in BJW19's whitening, GKLW19's detector).

:func:`restrict` rotates X to coordinates of its row space, ``X_r = X R^T`` with R of
shape (r, d) orthonormal (r = rank X): X_r has full column rank and ``X = X_r R`` exactly up
to rounding, so a method sees the same data in r dimensions. :func:`extend` maps the
result back: ``V = V_r R`` is the minimum-norm representative (no component along N, row
norms kept), every other network ``V + A N`` with any A fits equally well. A result that is
exact (or approximate) on the span becomes ``non_identifiable`` (the network is not unique)
with the errors within the span (the residual, over every sample, and the method's own
status in ``diagnostics["span_status"]``) and the unidentifiable
directions N in ``diagnostics["unidentifiable_directions"]`` (also ``["input_null_space"]``)
and ``diagnostics["input_rank"] = r``.

:func:`relufast._protocol.recovery_method` applies both around every units-free method, so
no algorithm needs its own code for this.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import numpy as np

__all__ = ["RowSpace", "restrict", "extend", "row_space_basis", "identify", "non_identifiable_from_null_space"]


class RowSpace(NamedTuple):
    """Orthonormal bases of the row space (R, shape (r, d)) and null space (N, (d - r, d)) of X."""

    R: np.ndarray
    N: np.ndarray

    @property
    def rank(self) -> int:
        return self.R.shape[0]

    @property
    def n_features(self) -> int:
        return self.R.shape[1]


def row_space_basis(N, d):
    """Orthonormal basis (d - dim N, d) of the orthogonal complement of the rows of N."""
    if N.shape[0] == 0:
        return np.eye(d)
    Q, _ = np.linalg.qr(N.T, mode="complete")
    R = Q[:, N.shape[0] :].T
    # Coordinate-aligned null spaces (zero columns) give a coordinate-aligned basis exactly.
    return np.ascontiguousarray(R)


def restrict(X, n_hidden) -> Optional[tuple]:
    """``(X_r, RowSpace)`` for an in-memory 2-D array X: X_r = X R^T when X spans a proper
    subspace of R^d of dimension r >= max(n_hidden, 1), X itself (R = I, N empty) when X has
    full column rank; None when X spans fewer than n_hidden dimensions (the method runs on X
    as given and reports what it can).

    Cost: the null-space test of :func:`relufast.stages.diagnostics.input_null_space` (an SVD
    of at most max(4 d, 2000) rows, one pass over X only when those are rank-deficient) and,
    when X is rank-deficient, one product ``X R^T`` (a copy of X with r columns).
    """
    from .stages.diagnostics import input_null_space

    n, d = X.shape
    N = input_null_space(X)
    r = d - N.shape[0]
    k = n_hidden if isinstance(n_hidden, (int, np.integer)) and not isinstance(n_hidden, bool) else 1
    if N.shape[0] == 0:
        return X, RowSpace(np.eye(d), N)
    if r < max(int(k), 1):
        return None
    # Zero columns (blank pixels) are the common case: use the coordinate basis when the null
    # space is exactly spanned by those columns, so V keeps exact zeros there.
    zero = np.flatnonzero(~np.any(np.asarray(X[: min(n, 65536)]) != 0, axis=0))
    if zero.size == N.shape[0] and _all_zero(X, zero):
        keep = np.setdiff1d(np.arange(d), zero)
        R = np.eye(d)[keep]
        N = np.eye(d)[zero]
        Xr = np.ascontiguousarray(np.asarray(X, dtype=np.float64)[:, keep])
    else:
        R = row_space_basis(N, d)
        Xr = np.ascontiguousarray(np.asarray(X, dtype=np.float64) @ R.T)
    return Xr, RowSpace(R, N)


def _all_zero(X, cols, block=1 << 16):
    for a in range(0, X.shape[0], block):
        if np.any(np.asarray(X[a : a + block, cols]) != 0):
            return False
    return True


def _lift(a, R):
    """An array of directions in R^r (last axis r) as directions in R^d."""
    a = np.asarray(a)
    return a @ R if a.ndim >= 1 and a.shape[-1] == R.shape[0] else a


def extend(res, space: RowSpace):
    """The result of a method run on ``X R^T`` as a result on X (see the module docstring)."""
    from ._result import Status, warn

    R, N = space
    r, d = R.shape
    diag = dict(res.diagnostics)
    if r == d:  # full column rank: nothing to map, but say that it was checked
        diag["input_rank"] = d
        return dataclasses.replace(res, diagnostics=diag)
    if "undetermined_directions" in diag:  # per row, directions in R^r; add the null space
        diag["undetermined_directions"] = tuple(
            np.vstack([_lift(a, R).reshape(-1, d), N]) for a in diag["undetermined_directions"]
        )
    diag.update(input_null_space=N, unidentifiable_directions=N, input_rank=r)
    span = f"the inputs span only {r} of {d} dimensions (a subspace of R^{d})"
    if res.V is None:
        message = f"{res.message}. ({span}; the method ran on the row space of X)"
        return dataclasses.replace(res, message=message, diagnostics=diag)
    V = res.V @ R
    if res.status in (Status.EXACT, Status.APPROXIMATE, Status.NON_IDENTIFIABLE):
        # The components along N are never determined, however good the fit within the span.
        exact_fit = res.status != Status.APPROXIMATE
        diag.update(undetermined_rows=tuple(range(V.shape[0])), span_residual=float(res.residual))
        diag["span_status"] = res.status.value
        fit = "exact" if exact_fit else "approximate (not exactly realizable: noise?)"
        message = (
            f"{res.message}. The fit on the row space of X is {fit}, relative residual "
            f"{res.residual:.2e} within it, but not unique: {span}, so every row of V is free "
            f"along the {d - r} input direction(s) in diagnostics['unidentifiable_directions']; "
            "returned the minimum-norm representative (rows on the row space of X)"
        )
        out = dataclasses.replace(
            res, V=V, status=Status.NON_IDENTIFIABLE, exact=False, message=message, diagnostics=diag
        )
        if res.status != Status.NON_IDENTIFIABLE:  # a new status: say so
            warn(message)
        return out
    message = (
        f"{res.message}. ({span}: the method ran on the row space of X; V is reported there, "
        "minimum norm, and its components along diagnostics['unidentifiable_directions'] are "
        "not identifiable)"
    )
    return dataclasses.replace(res, V=V, message=message, diagnostics=diag)


def non_identifiable_from_null_space(res, N):
    """Turn a fit into ``non_identifiable``: rows of V projected on the orthogonal complement
    of span(N) (the minimum-norm representatives, since X N^T = 0 leaves the fit unchanged),
    renormalised, with U rescaled to keep the network's outputs."""
    from ._result import Status

    V = res.V - (res.V @ N.T) @ N
    s = np.linalg.norm(V, axis=1)
    if not np.all(s > 0):  # a row entirely in the null space: its unit never fires
        s = np.where(s > 0, s, 1.0)
    d = V.shape[1]
    diag = dict(res.diagnostics)
    diag.update(
        input_null_space=N,
        unidentifiable_directions=N,
        input_rank=d - N.shape[0],
        undetermined_rows=tuple(range(V.shape[0])),
        span_residual=float(res.residual),
        span_status=res.status.value,
    )
    message = (
        f"{res.message}. The fit has relative residual {res.residual:.2e} but is not unique: the "
        f"inputs span only a {d - N.shape[0]}-dimensional subspace of R^{d}, so every row of V "
        f"is free along the {N.shape[0]} input direction(s) in diagnostics['input_null_space']; "
        "returned the minimum-norm representative (rows projected on the row space of X)"
    )
    return dataclasses.replace(
        res,
        U=res.U * s[None, :],
        V=V / s[:, None],
        b=None if res.b is None else res.b / s,
        status=Status.NON_IDENTIFIABLE,
        exact=False,
        message=message,
        diagnostics=diag,
    )


def identify(res, samples, tol=None):
    """:func:`extend`'s verdict for samples wherever they live (a
    :class:`relufast.stages.reduce.Samples`: NumPy, memmap, dask, MPI ranks): an exact or
    approximate fit becomes ``non_identifiable`` when the samples miss an input direction
    (the null space of the concatenated X, :func:`relufast.stages.diagnostics.sample_null_space`,
    identical on every rank). Records ``diagnostics["input_rank"]`` either way. ``tol``: the
    relative size below which an input direction is unseen (default: rounding of float64;
    results certified at float32 pass that precision's floor, and are checked even when X
    was found of full rank at float64)."""
    from ._result import Status
    from .stages.diagnostics import sample_null_space

    if res.V is None or res.status not in (Status.EXACT, Status.APPROXIMATE, Status.NON_IDENTIFIABLE):
        return res
    d = res.V.shape[1]
    if tol is None and res.diagnostics.get("input_rank") == d and res.status != Status.NON_IDENTIFIABLE:
        return res  # checked already (restrict/extend): X has full column rank
    if res.status == Status.NON_IDENTIFIABLE and "input_null_space" in res.diagnostics:
        return res  # the method reported the null space itself
    N = sample_null_space(samples, tol)
    if N.shape[0] == 0:
        return dataclasses.replace(res, diagnostics=dict(res.diagnostics, input_rank=d))
    return non_identifiable_from_null_space(res, N)
