"""The registry of methods: name -> :class:`Method` (function, citation, whether it is
units-free), and the check of a call's options against the method's signature."""

from __future__ import annotations

import difflib
import inspect
from typing import Callable, NamedTuple

from ._protocol import recovery_method
from .algorithms import atv21, bjw19, gklw19, gp19


class Method(NamedTuple):
    """A registry entry: the function (called as ``function(X, Y, n_hidden, **options)``)
    and the citation of the paper, with the theorem and algorithms it implements."""

    function: Callable
    citation: str
    #: False where the model fixes the units of X (GP19's known threshold t): no rescaling.
    units_free: bool = True


#: name -> Method(function, citation[, units_free]).
METHODS = {
    "bjw19-gaussian": Method(bjw19.gaussian, bjw19.CITATION),
    "bjw19-enumeration": Method(bjw19.enumeration, bjw19.CITATION + " Theorem 1, Algorithms 1-2."),
    "bjw19-fpt": Method(bjw19.fpt, bjw19.CITATION + " Theorem 11, Algorithm 7."),
    "bjw19-noisy": Method(bjw19.noisy, bjw19.CITATION + " Theorem 10, Algorithm 6."),
    "bjw19-sparse-noise": Method(bjw19.sparse_noise, bjw19.CITATION + " Section 8, Theorem 14."),
    "bjw19-ica": Method(bjw19.ica, bjw19.CITATION + " Theorem 4, Algorithm 3."),
    "bjw19-independent-noise": Method(bjw19.independent_noise, bjw19.CITATION + " Theorem 13, Algorithm 8."),
    "gklw19": Method(gklw19.recover, gklw19.CITATION + " Algorithms 1-4 (practical=True: Section 4)."),
    # GP19: f = P(u(W x - t)); X, Y may be None with f=callable (query mode).
    "gp19": Method(
        gp19.lowest_layer,
        gp19.CITATION + " Section 2: Step 1 (landscape G / whitened TPM), Step 2 (Algorithms 1-2).",
        units_free=False,
    ),
    "gp19-halfspaces": Method(gp19.halfspaces, gp19.CITATION + " Section 2.3, Theorem 6.", units_free=False),
    "gp19-support": Method(
        gp19.correlation_graph_supports, gp19.CITATION + " Algorithm 3, Theorem 8.", units_free=False
    ),
    "gp19-even": Method(gp19.even_activation, gp19.CITATION + " Theorem 10.", units_free=False),
    # Decorated here (not in atv21.py) so that atv21 too runs on the row space of X.
    "atv21": Method(
        recovery_method("atv21", whiten=True)(atv21.atv21),
        atv21.CITATION + " Theorem 3.1, Algorithm 6 (Algorithms 2-4), then activation-region refinement (relufast).",
    ),
    "atv21-general": Method(
        recovery_method("atv21-general", whiten=True)(atv21.atv21_general),
        atv21.CITATION + " Theorem 3.2, Algorithm 4 with l = 2 (fit=True: Algorithm 5).",
    ),
}


# --------------------------------------------------------------------------- options
def _accepted_options(function):
    """Names of the keyword options of a method (None when it takes ``**kwargs``)."""
    params = list(inspect.signature(function).parameters.values())[3:]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    # Names starting with "_" are the package's own switches, not options for users.
    return [
        p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and not p.name.startswith("_")
    ]


def _check_options(name, function, options):
    valid = _accepted_options(function)
    if valid is None:
        return
    unknown = [o for o in options if o not in valid]
    if unknown:
        hints = []
        for o in unknown:
            close = difflib.get_close_matches(o, valid, n=1)
            hints.append(f"{o!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise TypeError(
            f"method {name!r} got unknown option(s) {', '.join(hints)}; its options are " + ", ".join(valid)
        )
