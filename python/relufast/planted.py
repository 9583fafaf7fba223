"""Planted two-layer networks and samplers (teacher networks for tests and studies).

Convention: samples are rows; ``Y = relu(X @ V.T) @ U.T``, V of shape (k, d) with unit
rows, U of shape (m, k).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validation import check_positive_int, check_random_state

__all__ = ["PlantedNetwork", "two_layer", "INPUT_DISTRIBUTIONS"]

#: Input laws accepted by :meth:`PlantedNetwork.sample`; all have mean 0 and identity
#: covariance, all but "gaussian" are symmetric and non-Gaussian.
INPUT_DISTRIBUTIONS = ("gaussian", "laplace", "uniform", "rademacher")


def _draw_inputs(rng, n, d, law):
    if law == "gaussian":
        return rng.standard_normal((n, d))
    if law == "laplace":
        return rng.laplace(scale=1.0 / np.sqrt(2.0), size=(n, d))
    if law == "uniform":
        return rng.uniform(-np.sqrt(3.0), np.sqrt(3.0), size=(n, d))
    if law == "rademacher":
        return rng.choice(np.array([-1.0, 1.0]), size=(n, d))
    raise ValueError(f"input must be one of {INPUT_DISTRIBUTIONS}; got {law!r}")


@dataclass(frozen=True)
class PlantedNetwork:
    """A teacher network ``y = U relu(V x)``.

    Attributes
    ----------
    U : ndarray of shape (n_outputs, n_hidden)
    V : ndarray of shape (n_hidden, n_features), unit-norm rows
    """

    U: np.ndarray
    V: np.ndarray

    @property
    def n_features(self):
        return self.V.shape[1]

    @property
    def n_hidden(self):
        return self.V.shape[0]

    @property
    def n_outputs(self):
        return self.U.shape[0]

    def __call__(self, X):
        """Outputs ``relu(X V^T) U^T`` for X of shape (n_samples, n_features)."""
        return np.maximum(np.asarray(X, dtype=np.float64) @ self.V.T, 0.0) @ self.U.T

    def sample(self, n, *, random_state=None, noise=0.0, input="gaussian"):
        """Draw n samples.

        Parameters
        ----------
        n : int
        random_state : None, int or numpy Generator
        noise : float, default=0.0
            Standard deviation of i.i.d. Gaussian noise added to the outputs.
        input : {"gaussian", "laplace", "uniform", "rademacher"}, default="gaussian"
            Law of the i.i.d. input coordinates (mean 0, variance 1).

        Returns
        -------
        X : ndarray of shape (n, n_features)
        Y : ndarray of shape (n, n_outputs)
        """
        n = check_positive_int(n, "n")
        if not (np.isfinite(noise) and noise >= 0):
            raise ValueError(f"noise must be a finite number >= 0; got {noise!r}")
        rng = check_random_state(random_state)
        X = _draw_inputs(rng, n, self.n_features, input)
        Y = self(X)
        if noise > 0:
            Y += noise * rng.standard_normal(Y.shape)
        return X, Y


def _condition(A):
    s = np.linalg.svd(A, compute_uv=False)
    return float(s[0] / s[-1]) if s[-1] > 0 else float(np.inf)


def two_layer(d, k, m, *, random_state=None, condition=None, max_condition=None, max_cos=None,
              max_output_condition=None, max_tries=10000):
    """Plant a random two-layer network with unit-norm hidden rows.

    Parameters
    ----------
    d, k, m : int
        Input dimension, hidden units, outputs.
    random_state : None, int or numpy Generator
    condition : float, optional
        Make V of condition number about ``condition`` (singular values spaced
        geometrically from 1 to 1/condition, then rows normalised). Without it, rows are
        i.i.d. uniform on the sphere.
    max_condition : float, optional
        Reject-and-redraw until kappa(V) <= max_condition.
    max_cos : float, optional
        Reject-and-redraw until every pair of rows has |cos| <= max_cos.
    max_output_condition : float, optional
        Reject-and-redraw until kappa(U) <= max_output_condition (needs m >= k).
    max_tries : int, default=10000

    Returns
    -------
    PlantedNetwork
    """
    d = check_positive_int(d, "d")
    k = check_positive_int(k, "k")
    m = check_positive_int(m, "m")
    if k > d:
        raise ValueError(f"k must be at most d for rank(V) = k; got k = {k}, d = {d}")
    if condition is not None and not condition >= 1:
        raise ValueError(f"condition must be >= 1; got {condition!r}")
    rng = check_random_state(random_state)
    for _ in range(max_tries):
        if condition is None:
            V = rng.standard_normal((k, d))
        else:
            Q1 = np.linalg.qr(rng.standard_normal((k, k)))[0]
            Q2 = np.linalg.qr(rng.standard_normal((d, k)))[0]
            V = Q1 @ np.diag(np.geomspace(1.0, 1.0 / condition, k)) @ Q2.T
        V /= np.linalg.norm(V, axis=1, keepdims=True)
        if max_condition is not None and _condition(V) > max_condition:
            continue
        if max_cos is not None and k > 1:
            C = np.abs(V @ V.T) - np.eye(k)
            if C.max() > max_cos:
                continue
        U = rng.standard_normal((m, k))
        if max_output_condition is not None and (m < k or _condition(U) > max_output_condition):
            continue
        return PlantedNetwork(U=U, V=V)
    raise ValueError(
        f"no network met the constraints (max_condition={max_condition}, max_cos={max_cos}, "
        f"max_output_condition={max_output_condition}) in {max_tries} draws; relax them"
    )
