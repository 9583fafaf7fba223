"""One registered method run the same way every time (:func:`_run`): options checked,
units rescaled, breakdowns -> ``failed``, inputs that span a subspace, and the cause notes."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from ._protocol import call_method
from ._result import (
    RelufastWarning,
    Status,
    warn,
)
from ._units import map_back, plain_array, rescale
from .methods import METHODS, _check_options
from .subspace import non_identifiable_from_null_space

#: Samples ``auto`` uses for its cheap checks and for the first enumeration run.
AUTO_CHECK_ROWS = 20000
#: A coordinate mean this many standard errors from zero (and above 5% of its standard
#: deviation) means X is not centred.
MEAN_Z_LIMIT = 6.0


# --------------------------------------------------------------------------- causes
def _float32_note(X, Y, options):
    tol = options.get("tol", 1e-10)
    notes = []
    given = options.get("precision")
    for name, A in (("X", X), ("Y", Y)):
        dt = getattr(A, "dtype", None)
        if name == "Y" and isinstance(given, str) and given in ("float32", "float16"):
            dt = np.dtype(given)  # auto converted Y to float64; its precision travels as an option
        if dt is not None and np.issubdtype(dt, np.floating) and np.finfo(dt).eps > 1e-12:
            eps = float(np.finfo(dt).eps)
            notes.append(
                f"{name} is {np.dtype(dt).name} (relative precision {eps:.1e}), so a relative "
                f"residual below tol = {tol:.0e} is out of reach unless the data are exact in "
                f"that precision; pass float64 data, or tol={10 * eps:.0e} to certify at "
                f"{np.dtype(dt).name} precision"
            )
    return notes


def _identify(res, X):
    """An exact result is identified only if the inputs span R^d: otherwise the rows of V
    are free along the null space of X; return the minimum-norm representative."""
    from .stages.diagnostics import input_null_space

    if res.status != Status.EXACT or res.V is None or res.activation is not None:
        return res
    if res.diagnostics.get("input_rank") == res.V.shape[1]:
        return res  # relufast.subspace found X (or a subset of its rows) of full rank already
    Xa = plain_array(X)
    if Xa is None or Xa.ndim != 2:
        return res
    N = input_null_space(np.asarray(Xa, dtype=np.float64))
    if not N.shape[0]:
        return res
    return non_identifiable_from_null_space(res, N)


def _causes(res, X, Y, n_hidden, options):
    """Notes on what may have caused a non-exact result, appended to its message."""
    if res.status == Status.EXACT:
        return []
    notes = _float32_note(X, Y, options)
    if res.precision != "float64":  # the method already judged Y at its precision
        notes = [t for t in notes if not t.startswith("Y is")]
    Xa, Ya = plain_array(X), plain_array(Y)
    if Xa is None or Ya is None or Xa.ndim != 2:
        return notes
    Ya = Ya.reshape(len(Ya), -1)
    Xs = np.asarray(Xa[:AUTO_CHECK_ROWS], dtype=np.float64)
    Ys = np.asarray(Ya[: min(len(Ya), 2000)], dtype=np.float64)
    if len(Xs) > 2:
        mz, rel = _mean_statistic(Xs)
        if mz > MEAN_Z_LIMIT and rel > 0.05:
            notes.append(
                f"X has a nonzero mean (largest |mean| / sd = {rel:.2f}): the methods assume "
                "centred inputs, and an input offset acts as hidden biases b = V mean(X); "
                "use atv21 (biases and offsets)"
            )
    if Ys.shape[0] > Ys.shape[1] and isinstance(n_hidden, (int, np.integer)):
        from .stages.diagnostics import RANK_TOL, numerical_rank
        from .stages.precision import resolve_precision

        try:
            rtol = resolve_precision(Y, options.get("precision")).tol(RANK_TOL, Xs.shape[1], int(n_hidden))
        except (TypeError, ValueError):
            rtol = RANK_TOL
        r = numerical_rank(np.linalg.svd(Ys, compute_uv=False), rtol)
        rc = numerical_rank(np.linalg.svd(Ys - Ys.mean(axis=0), compute_uv=False), rtol)
        m = Ys.shape[1]
        if r < min(n_hidden, m):  # with m < n_hidden outputs, rank(Y) = m says nothing
            notes.append(
                f"rank(Y) = {r} < n_hidden = {n_hidden}: either n_hidden is larger than the number "
                "of hidden units the outputs show, or U has rank < k (bjw19-fpt handles "
                "rank-deficient U)"
            )
        elif r > n_hidden and r < min(m, Ys.shape[0]) and not (rc < r and rc == n_hidden):
            notes.append(
                f"rank(Y) = {r} > n_hidden = {n_hidden} with a clear gap after sigma_{r}: the "
                f"outputs look like a network with {r} hidden units; try n_hidden = {r}"
            )
        if rc < r and rc >= 1:
            notes.append(
                f"the centred outputs have rank {rc} < rank(Y) = {r}: Y looks like it has a "
                "constant offset c (y = U relu(V x + b) + c); use atv21 (biases and offsets)"
            )
    return notes


def _mean_statistic(Xs):
    """(largest |mean_j| in standard errors, largest |mean_j| / sd_j) over the coordinates."""
    mu = Xs.mean(axis=0)
    sd = Xs.std(axis=0)
    ok = sd > 0
    if not np.any(ok):
        return 0.0, 0.0
    z = np.abs(mu[ok]) / (sd[ok] / np.sqrt(len(Xs)))
    return float(z.max()), float((np.abs(mu[ok]) / sd[ok]).max())


#: An eigenvalue of the sum of the ranks' null-space projectors this close to the number
#: of ranks belongs to a direction in every rank's null space (the projectors are exact
#: orthonormal bases, so rounding is the only slack).
NULL_INTERSECTION_TOL = 1e-8


def _identify_over_ranks(res, X, comm):
    """:func:`_identify` for samples spread over MPI ranks: the inputs of all ranks miss a
    direction only if every rank's inputs do, so the null space of the concatenated X is
    the intersection of the ranks' null spaces (gathered, and intersected alike on every
    rank)."""
    from .stages.diagnostics import input_null_space

    if res.status != Status.EXACT or res.V is None or res.activation is not None:
        return res
    d = res.V.shape[1]
    Xa = plain_array(X)
    local = np.eye(d) if Xa is None or Xa.ndim != 2 or len(Xa) == 0 else input_null_space(np.asarray(Xa, float))
    parts = comm.allgather(local)
    if any(N.shape[0] == 0 for N in parts):
        return res
    w, E = np.linalg.eigh(sum(N.T @ N for N in parts))
    N = np.ascontiguousarray(E[:, w > len(parts) - NULL_INTERSECTION_TOL].T)
    return non_identifiable_from_null_space(res, N) if N.shape[0] else res


# --------------------------------------------------------------------------- running a method
def _run(name, X, Y, n_hidden, options, *, quiet=False):
    """One method through the common treatment (see the module docstring)."""
    function = METHODS[name].function
    _check_options(name, function, options)
    # Methods marked by relufast._protocol.recovery_method rescale units themselves.
    if getattr(function, "rescales_units", False) or not METHODS[name].units_free:
        Xs, Ys, opts, scale = X, Y, options, (0, 0, 1.0)
    else:
        Xs, Ys, opts, scale = rescale(X, Y, options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RelufastWarning)
        res = call_method(name, function, Xs, Ys, n_hidden, opts)
    method_message, method_status = res.message, res.status
    comm = options.get("comm")
    if comm is None:
        res = _identify(map_back(res, scale), X)
        notes = _causes(res, X, Y, n_hidden, options)
    else:  # each rank holds other samples: only what the ranks agree on
        res, notes = _identify_over_ranks(map_back(res, scale), X, comm), []
    if notes:
        res = dataclasses.replace(res, message=res.message.rstrip(". ") + ". " + ". ".join(notes))
    texts = tuple(dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, RelufastWarning)))
    for w in caught:
        if not issubclass(w.category, RelufastWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if texts:
        diag = dict(res.diagnostics)
        diag["warnings"] = texts
        res = dataclasses.replace(res, diagnostics=diag)
    if not quiet:
        # Each distinct warning once; the method's final message replaced by the full one
        # (methods that return an expected status quietly, like bjw19-noisy, stay quiet).
        for t in texts:
            if t != method_message:
                warn(t)
        if method_message in texts or res.status != method_status:
            warn(res.message)
    return res
