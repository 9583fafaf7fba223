"""Errors up to the symmetries of a two-layer ReLU network.

A network ``U relu(V x)`` is unchanged by permuting hidden units and by scaling row j of V
by c > 0 while dividing column j of U by c. Errors are measured after normalising rows of
V to unit norm and matching hidden units by the best permutation (Hungarian algorithm on
the signed cosine: the sign of a row is identifiable for ReLU).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.optimize import linear_sum_assignment

__all__ = ["ParameterError", "canonical", "match_hidden_units", "parameter_error", "function_error",
           "matched_squared_error"]


class ParameterError(NamedTuple):
    """Relative Frobenius errors after the best matching."""

    U: float  #: ||U - U*||_F / ||U*||_F
    V: float  #: ||V - V*||_F / ||V*||_F (unit rows)
    max_angle: float  #: largest angle (radians) between matched rows of V
    permutation: np.ndarray  #: row j of the estimate matches row permutation[j] of the truth


def _params(obj):
    if isinstance(obj, tuple) and len(obj) == 2:
        U, V = obj
    else:
        U, V = getattr(obj, "U", None), getattr(obj, "V", None)
    if U is None or V is None:
        raise ValueError("expected an object with U and V (a result or a network) or a (U, V) tuple")
    return np.asarray(U, dtype=np.float64), np.asarray(V, dtype=np.float64)


def canonical(U, V, degree=1.0):
    """Scale rows of V to unit norm and columns of U by ``norm^degree`` (network unchanged).

    ``degree`` is the homogeneity degree of the activation (1 for ReLU); None (a
    non-homogeneous activation, whose row norms are identifiable) leaves both as they are.
    """
    U = np.asarray(U, dtype=np.float64)
    V = np.asarray(V, dtype=np.float64)
    if degree is None:
        return U, V
    s = np.linalg.norm(V, axis=1)
    s[s == 0] = 1.0
    return U * s[None, :] ** degree, V / s[:, None]


def _degree(obj):
    act = getattr(obj, "activation", None)
    return 1.0 if act is None else act.degree


def match_hidden_units(V_est, V_true):
    """Permutation p maximising sum_j cos(V_est[j], V_true[p[j]]) (unit rows assumed)."""
    if V_est.shape != V_true.shape:
        raise ValueError(f"V shapes differ: estimate {V_est.shape}, truth {V_true.shape}")
    rows, cols = linear_sum_assignment(-(V_est @ V_true.T))
    perm = np.empty(V_est.shape[0], dtype=int)
    perm[rows] = cols
    return perm


def parameter_error(estimate, truth):
    """Relative errors of U and V after normalisation and the best permutation.

    Parameters
    ----------
    estimate, truth : RecoveryResult, PlantedNetwork or (U, V) tuple

    Returns
    -------
    ParameterError
    """
    degree = _degree(truth)
    U, V = canonical(*_params(estimate), degree=degree)
    U0, V0 = canonical(*_params(truth), degree=degree)
    if U.shape != U0.shape:
        raise ValueError(f"U shapes differ: estimate {U.shape}, truth {U0.shape}")
    if degree is None:  # match directions; the norms are compared in the error
        perm = match_hidden_units(canonical(U, V)[1], canonical(U0, V0)[1])
    else:
        perm = match_hidden_units(V, V0)
    Vm, Um = V0[perm], U0[:, perm]
    # Angle from the chord between unit vectors (arccos of the cosine loses half the digits).
    Vu = V / np.linalg.norm(V, axis=1, keepdims=True)
    Vmu = Vm / np.linalg.norm(Vm, axis=1, keepdims=True)
    angles = 2.0 * np.arcsin(np.clip(np.linalg.norm(Vu - Vmu, axis=1) / 2.0, 0.0, 1.0))
    return ParameterError(
        U=float(np.linalg.norm(U - Um) / np.linalg.norm(Um)),
        V=float(np.linalg.norm(V - Vm) / np.linalg.norm(Vm)),
        max_angle=float(np.max(angles)),
        permutation=perm,
    )


def function_error(estimate, truth, X):
    """Relative output error ``||f(X) - f*(X)||_F / ||f*(X)||_F`` on inputs X (n, d)."""
    U, V = _params(estimate)
    U0, V0 = _params(truth)
    X = np.asarray(X, dtype=np.float64)
    act = getattr(truth, "activation", None)
    f = (lambda Z: np.maximum(Z, 0.0)) if act is None else act
    F = f(X @ V.T) @ U.T
    F0 = f(X @ V0.T) @ U0.T
    return float(np.linalg.norm(F - F0) / np.linalg.norm(F0))


def matched_squared_error(estimate, truth):
    """GKLW19's error (Sec. 4.1): squared distance of normalised, matched parameters.

    Rows of W (= V) and columns of A (= U) are normalised to unit norm, units are matched
    by the Hungarian algorithm on the rows of W, and the squared distances are summed over
    units. Returns (error_W, error_A).
    """
    U, V = _params(estimate)
    U0, V0 = _params(truth)
    nv = lambda M: M / np.maximum(np.linalg.norm(M, axis=1, keepdims=True), 1e-300)
    Vn, V0n = nv(V), nv(V0)
    Un, U0n = nv(U.T), nv(U0.T)
    perm = match_hidden_units(Vn, V0n)
    return float(np.sum((Vn - V0n[perm]) ** 2)), float(np.sum((Un - U0n[perm]) ** 2))
