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
        res = recover(X, y if y.ndim == 1 else Y, n_hidden=k, method=self.method, **options)
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
