"""``relufast.recover``: one entry point dispatching over the registry of methods.

Every method runs under one protocol (:func:`relufast._protocol.recovery_method`, in the
method's function, so a direct call behaves the same):

* options are checked against the method's options (a misspelled option is a TypeError
  that lists them); ``time_limit`` stops any method at its next stage or kernel check;
* X and Y are rescaled by exact powers of two to unit root-mean-square entries and the
  parameters are mapped back (``diagnostics["units"]``), so the units of the data do not
  matter;
* a numerical breakdown inside the method (``LinAlgError``) becomes a ``failed`` result
  with the cause, never an exception;
* an ``exact`` result whose inputs span a subspace becomes ``non_identifiable`` with the
  minimum-norm representative (rows of V projected on the row space of X);
* a non-exact result says what its cause may be (float32 data, an offset in the outputs,
  inputs with a nonzero mean, n_hidden against the rank of Y).

``method="auto"`` tries the certified methods in order of cost and returns the best
result, with every attempt in ``diagnostics["auto_attempts"]`` (see :func:`recover`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ._auto import AUTO_TIME_LIMIT, _auto
from ._result import (
    RecoveryResult,
    warn,
)
from ._units import plain_array
from .methods import METHODS, MethodSpec, run_method

__all__ = ["recover", "METHODS", "MethodSpec", "AUTO_TIME_LIMIT"]


def _explain(res, X, Y, n_hidden, options):
    """Add what the data cannot show to a result that is not exact: units invisible in the
    outputs (dead or pruned) and near-duplicate recovered rows (:mod:`relufast.units`). A
    near-duplicate pair is merged into one effective unit when the merged network fits Y
    better (status ``approximate``, :func:`relufast.units.merged_result`)."""
    if res.exact or X is None or Y is None or hasattr(X, "chunks") or hasattr(Y, "chunks"):
        return res  # query mode (the method drew its own samples) or lazy arrays
    from .units import invisible_message, merged_result, near_duplicate_message, near_duplicates, visible_units

    try:
        vis = visible_units(X, Y, precision=options.get("precision"))
    except (ValueError, TypeError, np.linalg.LinAlgError):
        return res
    merged = None
    if plain_array(X) is not None and plain_array(Y) is not None:
        merged = merged_result(res, X, Y, n_jobs=options.get("n_jobs"))
    notes = [
        "" if _shows_all(Y, vis.count, n_hidden, options) else invisible_message(vis.count, n_hidden),
        "" if res.V is None or merged is not None else near_duplicate_message(near_duplicates(res.V)),
    ]
    notes = [n for n in notes if n]
    if merged is not None:
        res = merged
    if not notes:
        if merged is not None:
            warn(res.message)
        return res
    diag = dict(res.diagnostics, visible_units=vis.count)
    res = dataclasses.replace(res, message=res.message + ". " + ". ".join(notes), diagnostics=diag)
    if merged is not None:
        warn(res.message)
    return res


def _shows_all(Y, count, n_hidden, options):
    """Whether the centred outputs over every sample have rank >= n_hidden at the rounding
    floor although fewer units were counted visible: a unit is then weak (an output column of
    1e-8) or rarely active, not dead or pruned, and the invisible-units note would be false."""
    from .stages.diagnostics import RANK_FLOOR, numerical_rank, output_singular_values
    from .stages.precision import resolve_precision

    Ya = plain_array(Y)
    if count >= n_hidden or Ya is None:
        return False
    Ya = np.asarray(Ya, dtype=np.float64).reshape(len(Ya), -1)
    if Ya.shape[1] < n_hidden:
        return False
    try:
        tol = resolve_precision(Y, options.get("precision")).tol(RANK_FLOOR, Ya.shape[1], int(n_hidden))
    except (TypeError, ValueError):
        return False
    return numerical_rank(output_singular_values(Ya - Ya.mean(axis=0)), tol) >= n_hidden


def recover(X: Any, Y: Any, *, n_hidden: int, method: str = "auto", **options: Any) -> RecoveryResult:
    """Recover a two-layer network ``Y = relu(X V^T + b) U^T + c`` (+ noise) from samples.

    Most methods fit the bias-free model (b = 0, c = 0; the result's ``b`` and ``c`` are
    None); ``atv21`` and ``atv21-general`` fit the hidden biases b and the output offset c.
    GP19's methods fit the lowest layer of ``P(u(X W^T - t))`` (see their docstrings).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    Y : array-like of shape (n_samples, n_outputs) or (n_samples,)
    n_hidden : int
        Number of hidden units k.
    method : str, default="auto"
        A key of :data:`METHODS`, or "auto". ``auto`` tries the certified methods in order
        of cost and stops at the first ``exact`` result: ``atv21`` first when X looks
        standard Gaussian and the outputs show an offset or hidden biases, else
        ``bjw19-gaussian`` (when m >= k;
        a certificate is valid whatever the input law), ``bjw19-fpt`` (rank(Y) < k), ``atv21`` (standard
        Gaussian X, m < k),
        ``gklw19`` (rank(Y) >= k, symmetric-looking inputs, d (d + 1) / 2 <= 2000), then
        ``bjw19-enumeration`` (rank(Y) = k) on a subsample and then on all samples, within
        ``time_limit`` seconds (default :data:`AUTO_TIME_LIMIT`). It returns the best
        status (exact, non_identifiable, approximate, failed, ...; ties to the smaller
        residual) with every attempt in ``diagnostics["auto_attempts"]`` and the checks of
        the data in ``diagnostics["auto_facts"]``. With ``comm=`` (MPI ranks) or dask
        arrays, ``auto`` decides from the same first 20,000 rows of the concatenated
        samples, gathered on every rank, so every rank chooses the same method, and plans
        only the methods that take ``comm`` (docs/results.md, docs/scale.md).
    **options
        Passed to the method's function (see its docstring); an unknown option is a
        TypeError listing the valid ones. Every method takes ``random_state``, ``n_jobs``
        (threads: None or -1 all cores, see ``docs/results.md``), ``tol`` and
        ``time_limit`` (seconds; a method it stops returns ``failed`` with
        ``diagnostics["stopped_by"] = "time_limit"``). With ``auto``, each method gets the
        options it takes and ``time_limit`` is the budget of its enumeration stage.

    Returns
    -------
    RecoveryResult
        Parameters in the caller's units (the data are rescaled internally by powers of two,
        ``diagnostics["units"]``).
    """
    distributed = options.get("comm") is not None
    if method == "auto":
        res = _auto(X, Y, n_hidden, options)
    elif not isinstance(method, str) or method not in METHODS:
        mr19 = (
            "; MR19's problems (codes and column spaces of rectified data) are not this model: "
            "call relufast.algorithms.mr19 directly"
            if isinstance(method, str) and method.startswith("mr19")
            else ""
        )
        raise ValueError(
            f"unknown method {method!r}; valid methods are 'auto', "
            + ", ".join(repr(k) for k in sorted(METHODS))
            + mr19
        )
    else:
        res = run_method(method, X, Y, n_hidden, options)
    # With comm= each rank holds other samples: notes drawn from the local rows could differ
    # between ranks, and every rank must return the same result.
    return res if distributed else _explain(res, X, Y, n_hidden, options)
