"""``relufast.recover``: one entry point dispatching over the registry of methods."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

from ._result import RecoveryResult, RelufastWarning
from .algorithms import atv21, bjw19, gklw19

__all__ = ["recover", "METHODS", "Method"]


class Method(NamedTuple):
    """A registry entry: the function (called as ``function(X, Y, n_hidden, **options)``)
    and the citation of the paper, with the theorem and algorithms it implements."""

    function: Callable
    citation: str


#: name -> Method(function, citation).
METHODS = {
    "bjw19-gaussian": Method(bjw19.gaussian, bjw19.CITATION),
    "bjw19-enumeration": Method(bjw19.enumeration, bjw19.CITATION + " Theorem 1, Algorithms 1-2."),
    "bjw19-fpt": Method(bjw19.fpt, bjw19.CITATION + " Theorem 11, Algorithm 7."),
    "bjw19-noisy": Method(bjw19.noisy, bjw19.CITATION + " Theorem 10, Algorithm 6."),
    "bjw19-sparse-noise": Method(bjw19.sparse_noise, bjw19.CITATION + " Section 8, Theorem 14."),
    "bjw19-ica": Method(bjw19.ica, bjw19.CITATION + " Theorem 4, Algorithm 3."),
    "bjw19-independent-noise": Method(bjw19.independent_noise, bjw19.CITATION + " Theorem 13, Algorithm 8."),
    "gklw19": Method(gklw19.recover, gklw19.CITATION + " Algorithms 1-4 (practical=True: Section 4)."),
    "atv21": Method(atv21.atv21, atv21.CITATION + " Theorem 3.1, Algorithm 6 (Algorithms 2-4), "
                    "then activation-region refinement (relufast)."),
    "atv21-general": Method(atv21.atv21_general, atv21.CITATION + " Theorem 3.2, Algorithm 4 with l = 2 "
                            "(fit=True: Algorithm 5)."),
}


def _choose(X, Y, n_hidden):
    """Pick a method from what the data allow (cheap checks on at most 2000 samples)."""
    import numpy as np

    from ._validation import check_positive_int, check_xy
    from .stages.diagnostics import gaussianity as _gaussianity

    # Cheap: look at a subsample only; the chosen method validates all of the data.
    Xa, Ya = np.asarray(X), np.asarray(Y)
    if Xa.ndim != 2 or Ya.ndim not in (1, 2) or len(Xa) != len(Ya):
        return "bjw19-gaussian", "the data's shape is invalid; bjw19-gaussian reports why"
    X, Y = check_xy(Xa[:20000], Ya[:20000])
    k = check_positive_int(n_hidden, "n_hidden")
    sub = Y[: min(len(Y), 2000)]
    sv = np.linalg.svd(sub, compute_uv=False)
    rank = int(np.sum(sv > 1e-8 * sv[0])) if sv.size and sv[0] > 0 else 0
    gaussian = _gaussianity(X)["gaussian_ok"]
    Wh = None
    if not gaussian:  # Gaussian with another covariance? (bjw19-gaussian whitens those)
        ev, E = np.linalg.eigh(X.T @ X / len(X))
        if ev.min() > 1e-12 * ev.max():
            Wh = (E / np.sqrt(ev)) @ E.T
            gaussian = _gaussianity(X, Wh)["gaussian_ok"]
    if gaussian and k <= X.shape[1]:
        from .stages.diagnostics import bias_evidence

        bias = bias_evidence(X, Y, Wh)
        if bias["biased"] and Wh is None:
            return "atv21", (f"X looks standard Gaussian and the outputs have an offset or hidden biases "
                             f"(bias statistic |z| = {np.max(np.abs(bias['z'])):.1f} > 6): ATV21's model")
        if Y.shape[1] == 1 and k > 1 and Wh is None:
            return "atv21", (f"X looks standard Gaussian and m = 1 < k = {k}: ATV21 handles any number "
                             "of outputs")
        if Y.shape[1] < k and Wh is None:
            # Alg. 7 is exact from few samples when it applies; ATV21 needs ~1e5 samples.
            return ("bjw19-fpt", "atv21"), (f"X looks standard Gaussian and m = {Y.shape[1]} < k = {k}, no "
                                            "sign of biases: bjw19-fpt (Alg. 7), then atv21 if that is "
                                            "not exact")
    if gaussian and rank >= k:
        return "bjw19-gaussian", f"X looks standard Gaussian and rank(Y) = {rank} >= k = {k}"
    if gaussian and Y.shape[1] >= 2:
        return "bjw19-fpt", (f"X looks standard Gaussian and rank(Y) = {rank} < k = {k}: "
                             "rank-deficient U needs Alg. 7")
    if rank == k:
        return "bjw19-enumeration", f"X is not Gaussian and rank(Y) = k = {k}: Thm 1 holds for any X"
    return "bjw19-gaussian", (f"no method's assumptions hold (Gaussian X: {gaussian}, rank(Y) = "
                              f"{rank}, k = {k}); running bjw19-gaussian, which reports why it fails")


def recover(X: Any, Y: Any, *, n_hidden: int, method: str = "auto", **options: Any) -> RecoveryResult:
    """Recover a planted two-layer network ``Y = relu(X V^T) U^T`` (+ noise).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    Y : array-like of shape (n_samples, n_outputs) or (n_samples,)
    n_hidden : int
        Number of hidden units k.
    method : str, default="auto"
        A key of :data:`METHODS`, or "auto" to choose from what the data allow (the
        choice and its reason are recorded in ``result.diagnostics["auto"]``):
        standard Gaussian X with an output offset or hidden biases, or with fewer outputs
        than hidden units (m < k) -> "atv21"; Gaussian-looking X with rank(Y) >= k ->
        "bjw19-gaussian"; Gaussian X with rank(Y) < k -> "bjw19-fpt"; other X with
        rank(Y) = k -> "bjw19-enumeration".
    **options
        Passed to the method's function (see its docstring).

    Returns
    -------
    RecoveryResult
    """
    if method == "auto":
        from .stages.reduce import is_dask

        if options.get("comm") is not None or is_dask(X) or is_dask(Y):
            raise ValueError("method='auto' looks at the data in memory on one process; with comm= or "
                             "dask arrays name the method (e.g. method='bjw19-gaussian')")
        names, reason = _choose(X, Y, n_hidden)
        names = (names,) if isinstance(names, str) else names
        for i, name in enumerate(names):
            last = i == len(names) - 1
            if last:
                res = METHODS[name][0](X, Y, n_hidden, **options)
            else:
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RelufastWarning)
                    res = METHODS[name][0](X, Y, n_hidden, **options)
                if res.exact:
                    break
                reason += f"; {name} ended {res.status.value}"
        diag = dict(res.diagnostics)
        diag["auto"] = f"chose {name}: {reason}"
        return dataclasses.replace(res, diagnostics=diag)
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"unknown method {method!r}; valid methods are 'auto', "
                         + ", ".join(repr(k) for k in sorted(METHODS)))
    return METHODS[method][0](X, Y, n_hidden, **options)
