"""A scikit-learn estimator over :func:`relufast.recover`.

``ReluNetRegressor`` fits ``y = U relu(V x + b) + c`` by provable recovery instead of
gradient descent (the method of ``method=``, default ``"auto"``: BJW19 Thm 1/7/11, GKLW19,
ATV21 Thm 3.1; see docs/results.md), so relufast drops into a ``Pipeline`` or a
``GridSearchCV`` beside ``MLPRegressor``. scikit-learn is needed by this module only
(``pip install "relufast[sklearn]"``); ``import relufast`` does not import it.

The certificate is in ``status_``: ``"exact"`` means the outputs are reproduced to rounding
by a network the data identify. Data that no network of ``n_hidden`` units fits (noise,
random targets) still give a fitted estimator: the method's estimate (``approximate`` or
``failed``, with a :class:`relufast.RelufastWarning` saying why), or, when the method
returns no network at all, the mean of the training outputs (also with a warning).
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data as _validate_data
except ImportError:  # pragma: no cover - older scikit-learn

    def _validate_data(estimator, *args, **kwargs):
        return estimator._validate_data(*args, **kwargs)


from ._api import recover
from ._result import RelufastWarning

__all__ = ["ReluNetRegressor"]

#: Standard errors beyond which a moment of X says it is not standard Gaussian.
GAUSS_SIGMAS = 6.0


def _not_standard_gaussian(X):
    """Why X is not standard Gaussian (a column's mean, variance, excess kurtosis or a pair's
    correlation beyond GAUSS_SIGMAS standard errors of N(0, I) at this n), or None."""
    n, d = X.shape
    mean, sd = X.mean(axis=0), X.std(axis=0)
    checks = [("mean", mean, 0.0, 1.0 / np.sqrt(n)), ("variance", sd**2, 1.0, np.sqrt(2.0 / n))]
    Z = (X - mean) / np.where(sd > 0, sd, 1.0)
    checks.append(("excess kurtosis", np.mean(Z**4, axis=0) - 3.0, 0.0, np.sqrt(24.0 / n)))
    for name, value, expected, se in checks:
        j = int(np.argmax(np.abs(value - expected)))
        if abs(value[j] - expected) > GAUSS_SIGMAS * se:
            return f"column {j} has {name} {value[j]:.3g} (standard Gaussian: {expected:g} +- {se:.2g} at n = {n})"
    if d > 1:
        C = np.abs(Z.T @ Z / n - np.eye(d))
        i, j = np.unravel_index(int(np.argmax(C)), C.shape)
        if C[i, j] > GAUSS_SIGMAS / np.sqrt(n):
            return f"columns {i} and {j} have correlation {C[i, j]:.3g} (standard Gaussian: 0 +- {1 / np.sqrt(n):.2g})"
    return None


def _fewer_outputs_message(m, k, reason, method_message):
    """The real cause when m < k outputs on non-Gaussian X end without a certificate."""
    which = (
        "the only method that applies is atv21 (bjw19-fpt needs m >= 2, the others m >= n_hidden), and it needs "
        "standard Gaussian X"
        if m == 1
        else "the methods that apply are bjw19-fpt and atv21, and atv21 needs standard Gaussian X"
    )
    return (
        f"no certified network: with m = {m} output(s) < n_hidden = {k}, {which}; X is not standard Gaussian: "
        f"{reason}. What to do: fit n_hidden <= {m} (bjw19-enumeration, for rank(Y) = n_hidden, accepts any X), "
        "or give Gaussian inputs x ~ N(0, I) (standardising does not make data Gaussian); with a model you can query, "
        "relufast.extract (chosen queries need neither); targets that are not exactly a ReLU network of X "
        "(measured data) have no certificate: MLPRegressor approximates them. The method's own diagnosis, which "
        f"assumes Gaussian X: {method_message}"
    )


class ReluNetRegressor(RegressorMixin, BaseEstimator):
    """Two-layer ReLU network ``y = U relu(V x + b) + c`` recovered by relufast.

    Parameters
    ----------
    n_hidden : int or None, default=None
        Hidden units k. None: the number of units visible in the training outputs
        (:func:`relufast.units.visible_units`), as :func:`relufast.extract` does.
    method : str, default="auto"
        A method of :data:`relufast.METHODS` or ``"auto"`` (:func:`relufast.recover`).
    time_limit : float or None, default=None
        Seconds for ``auto``'s enumeration step (None: ``recover``'s default, 60 s). Only
        ``auto`` and the methods that take ``time_limit`` accept it.
    random_state : None, int or numpy Generator, default=None
    n_jobs : int or None, default=None
        Threads of the C++ kernels (None: all cores).
    options : dict or None, default=None
        Further keyword options of the method (``tol``, ``n_estimate``, ...).

    Attributes
    ----------
    U_ : ndarray of shape (n_outputs, n_hidden) or None
        Output layer (None when the method returned no network).
    V_ : ndarray of shape (n_hidden, n_features_in_) or None
        Hidden layer, unit-norm rows.
    b_ : ndarray of shape (n_hidden,) or None
        Hidden biases (zeros for methods without biases).
    c_ : ndarray of shape (n_outputs,) or None
        Output offset.
    status_ : str
        ``"exact"``, ``"approximate"``, ``"failed"``, ``"non_identifiable"``, ... (docs/results.md).
    exact_ : bool
        True when every unit is certified and the fit is exact (the network is identified).
    residual_ : float
        Relative residual of the fit over the training samples.
    method_ : str
        The method that produced the result (``auto`` names the one it chose).
    n_hidden_ : int
        Hidden units asked for (``n_hidden``, or the number visible).
    result_ : relufast.RecoveryResult
        The full result (message, timings, counts, diagnostics).
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when X has feature names.

    Notes
    -----
    ``score`` is R^2 (``RegressorMixin``). ``predict`` returns shape (n,) when ``y`` was 1-D.
    A network is identified only up to a permutation of the hidden units and positive row
    scalings; ``V_`` has unit-norm rows.
    """

    def __init__(self, n_hidden=None, *, method="auto", time_limit=None, random_state=None, n_jobs=None, options=None):
        self.n_hidden = n_hidden
        self.method = method
        self.time_limit = time_limit
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.options = options

    def fit(self, X, y):
        """Recover the network from inputs X (n, d) and outputs y (n,) or (n, m); returns self."""
        X, y = _validate_data(self, X, y, multi_output=True, y_numeric=True, dtype=np.float64)
        if len(X) < 2:
            raise ValueError(f"n_samples = {len(X)}: a network is recovered from 2 samples or more")
        Y = y.reshape(len(y), -1)
        k = self._n_hidden(X, Y)
        options = dict(self.options or {})
        for name in ("random_state", "n_jobs", "time_limit"):
            value = getattr(self, name)
            if value is not None:
                options[name] = value
        m = Y.shape[1]
        not_gaussian = _not_standard_gaussian(X) if m < k else None
        with warnings.catch_warnings(record=not_gaussian is not None) as caught:
            if not_gaussian is not None:
                warnings.simplefilter("always")
            res = recover(X, y if y.ndim == 1 else Y, n_hidden=k, method=self.method, **options)
        if not_gaussian is not None and not res.exact:
            # The methods' own diagnosis assumes Gaussian X (never-active units, the detection
            # limit); the real cause is the input law with m < k: said first.
            message = _fewer_outputs_message(m, k, not_gaussian, res.message)
            res = dataclasses.replace(res, message=message)
            warnings.warn(message, RelufastWarning, stacklevel=2)
        elif caught:
            for w in caught:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        self.result_ = res
        self.n_hidden_ = k
        self.status_ = res.status.value
        self.exact_ = bool(res.exact)
        self.residual_ = float(res.residual)
        self.method_ = res.method
        self._single_output = y.ndim == 1
        self._mean = Y.mean(axis=0)
        network = res.network if res.has_finite_parameters else None
        self._network = network
        self.U_, self.V_, self.b_, self.c_ = (None,) * 4 if network is None else (res.U, res.V, res.b, res.c)
        if network is None:
            warnings.warn(
                f"{res.method} returned no network (status {self.status_}): predict returns the mean of the "
                f"training outputs. {res.message}",
                RelufastWarning,
                stacklevel=2,
            )
        return self

    def _n_hidden(self, X, Y):
        """``n_hidden``, or the units visible in the outputs (at least 1)."""
        from ._validation import check_positive_int

        if self.n_hidden is not None:
            return check_positive_int(self.n_hidden, "n_hidden")
        from .units import visible_units

        return max(1, min(visible_units(X, Y).count, X.shape[1]))

    def predict(self, X):
        """Outputs of the recovered network for X of shape (n, n_features_in_)."""
        check_is_fitted(self, "result_")
        X = _validate_data(self, X, reset=False, dtype=np.float64)
        if self._network is None:
            out = np.tile(self._mean, (len(X), 1))
        else:
            out = self._network.predict(X)
        return out[:, 0] if self._single_output else out

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = True
        # Random targets are not a two-layer ReLU network: no certified fit, only an estimate.
        tags.regressor_tags.poor_score = True
        return tags

    def _more_tags(self):  # scikit-learn < 1.6
        return {"multioutput": True, "poor_score": True}
