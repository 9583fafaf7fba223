"""``relufast.recover``: one entry point dispatching over the registry of methods."""
from __future__ import annotations

import dataclasses

from .algorithms import bjw19

__all__ = ["recover", "METHODS"]

#: name -> (function, citation). Each function takes (X, Y, n_hidden, **options).
METHODS = {
    "bjw19-gaussian": (bjw19.gaussian, bjw19.CITATION),
    "bjw19-enumeration": (bjw19.enumeration, bjw19.CITATION + " Theorem 1, Algorithms 1-2."),
    "bjw19-fpt": (bjw19.fpt, bjw19.CITATION + " Theorem 11, Algorithm 7."),
}


def recover(X, Y, *, n_hidden, method="auto", **options):
    """Recover a planted two-layer network ``Y = relu(X V^T) U^T`` (+ noise).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    Y : array-like of shape (n_samples, n_outputs) or (n_samples,)
    n_hidden : int
        Number of hidden units k.
    method : str, default="auto"
        A key of :data:`METHODS`, or "auto" to choose from what the data allow (the
        choice and its reason are recorded in ``result.diagnostics["auto"]``).
    **options
        Passed to the method's function (see its docstring).

    Returns
    -------
    RecoveryResult
    """
    if method == "auto":
        name = "bjw19-gaussian"
        reason = "bjw19-gaussian is the only method implemented so far"
        func = METHODS[name][0]
        res = func(X, Y, n_hidden, **options)
        diag = dict(res.diagnostics)
        diag["auto"] = f"chose {name}: {reason}"
        return dataclasses.replace(res, diagnostics=diag)
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"unknown method {method!r}; valid methods are 'auto', "
                         + ", ".join(repr(k) for k in sorted(METHODS)))
    return METHODS[method][0](X, Y, n_hidden, **options)
