"""The methods: one :class:`MethodSpec` per name in :data:`METHODS`, and :func:`run_method`.

Every registered function carries the method protocol
(:func:`relufast._protocol.recovery_method`): the option check, ``time_limit``, unit
rescaling, the row space of X, breakdowns as ``failed`` results, the settling against every
sample and the cause notes. A method called through :func:`relufast.recover`, through
:func:`run_method` or directly (``relufast.algorithms.bjw19.gaussian(X, Y, k)``) runs the
same code and gives the same result.
"""

from __future__ import annotations

import warnings
from typing import Callable, NamedTuple

from ._protocol import COMMON_OPTIONS
from ._result import RelufastWarning
from .algorithms import atv21, bjw19, gklw19, gp19

__all__ = ["MethodSpec", "METHODS", "COMMON_OPTIONS", "run_method"]


class MethodSpec(NamedTuple):
    """A registry entry. ``function(X, Y, n_hidden, **options)`` returns a
    :class:`relufast.RecoveryResult`; the other fields are read from the protocol it carries."""

    name: str
    function: Callable
    #: The paper, with the theorem and algorithms the method implements.
    citation: str
    #: False where the model fixes the units of X (GP19's known threshold t): no rescaling.
    units_free: bool
    #: In-memory inputs are whitened first (the model is x ~ N(0, I)).
    whiten: bool
    #: Its options, the common ones (:data:`COMMON_OPTIONS`) included.
    options: tuple

    @property
    def takes_comm(self) -> bool:
        """The method takes an mpi4py ``comm`` (each rank passes its own samples)."""
        return "comm" in self.options


def _spec(function, citation):
    protocol = function.protocol
    return MethodSpec(protocol.name, function, citation, protocol.units_free, protocol.whiten, protocol.options)


#: name -> MethodSpec.
METHODS = {
    spec.name: spec
    for spec in (
        _spec(bjw19.gaussian, bjw19.CITATION),
        _spec(bjw19.enumeration, bjw19.CITATION + " Theorem 1, Algorithms 1-2."),
        _spec(bjw19.fpt, bjw19.CITATION + " Theorem 11, Algorithm 7."),
        _spec(bjw19.noisy, bjw19.CITATION + " Theorem 10, Algorithm 6."),
        _spec(bjw19.sparse_noise, bjw19.CITATION + " Section 8, Theorem 14."),
        _spec(bjw19.ica, bjw19.CITATION + " Theorem 4, Algorithm 3."),
        _spec(bjw19.independent_noise, bjw19.CITATION + " Theorem 13, Algorithm 8."),
        _spec(gklw19.recover, gklw19.CITATION + " Algorithms 1-4 (practical=True: Section 4)."),
        # GP19: f = P(u(W x - t)); X, Y may be None with f=callable (query mode).
        _spec(
            gp19.lowest_layer,
            gp19.CITATION + " Section 2: Step 1 (landscape G / whitened TPM), Step 2 (Algorithms 1-2).",
        ),
        _spec(gp19.halfspaces, gp19.CITATION + " Section 2.3, Theorem 6."),
        _spec(gp19.correlation_graph_supports, gp19.CITATION + " Algorithm 3, Theorem 8."),
        _spec(gp19.even_activation, gp19.CITATION + " Theorem 10."),
        _spec(
            atv21.atv21,
            atv21.CITATION
            + " Theorem 3.1, Algorithm 6 (Algorithms 2-4), then activation-region refinement (relufast).",
        ),
        _spec(atv21.atv21_general, atv21.CITATION + " Theorem 3.2, Algorithm 4 with l = 2 (fit=True: Algorithm 5)."),
    )
}


def run_method(name, X, Y, n_hidden, options, *, quiet=False):
    """``METHODS[name].function(X, Y, n_hidden, **options)``: the direct call (the protocol is
    in the function). ``quiet`` silences the method's :class:`RelufastWarning` s; they stay
    listed in ``diagnostics["warnings"]``."""
    function = METHODS[name].function
    if not quiet:
        return function(X, Y, n_hidden, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RelufastWarning)
        return function(X, Y, n_hidden, **options)
