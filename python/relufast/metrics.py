"""Errors up to the symmetries of a two-layer ReLU network.

A network ``U relu(V x + b) + c`` is unchanged by permuting hidden units and by scaling
row j of V and b_j by s > 0 while dividing column j of U by s. Errors are measured after
normalising rows of V to unit norm (b with them) and matching hidden units by the best
permutation (Hungarian algorithm on the signed cosine of (v_j, b_j): the sign of a row is
identifiable for ReLU).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import linear_sum_assignment

from .network import as_network

__all__ = [
    "ParameterError",
    "canonical",
    "match_hidden_units",
    "match_rows",
    "row_angles",
    "parameter_error",
    "function_error",
    "matched_squared_error",
    "relu_kernel",
    "population_l2",
]


class ParameterError(NamedTuple):
    """Relative Frobenius errors after the best matching."""

    U: float  #: ||U - U*||_F / ||U*||_F
    V: float  #: ||V - V*||_F / ||V*||_F (unit rows)
    max_angle: float  #: largest angle (radians) between matched rows of V
    permutation: np.ndarray  #: row j of the estimate matches row permutation[j] of the truth
    b: float = 0.0  #: ||b - b*|| / ||b*|| (absolute when b* = 0), b scaled with the unit rows
    c: float = 0.0  #: ||c - c*|| / ||c*|| (absolute when c* = 0)


def _params(obj):
    net = as_network(obj)
    return net.U, net.V


def _relative(a, a0):
    den = float(np.linalg.norm(a0))
    return float(np.linalg.norm(a - a0) / (den if den > 0 else 1.0))


def canonical(U: ArrayLike, V: ArrayLike, degree: Optional[float] = 1.0) -> tuple[np.ndarray, np.ndarray]:
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


def match_rows(A: ArrayLike, B: ArrayLike, *, sign_invariant: bool = False) -> np.ndarray:
    """The permutation p maximising ``sum_j cos(A[j], B[p[j]])`` (``|cos|`` with
    ``sign_invariant``): row j of A matches row p[j] of B. The one row matching of relufast
    (Hungarian algorithm, :func:`scipy.optimize.linear_sum_assignment`)."""
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    if A.ndim != 2 or A.shape != B.shape:
        raise ValueError(f"row matching needs two matrices of the same shape; got {A.shape} and {B.shape}")
    An = A / np.maximum(np.linalg.norm(A, axis=1, keepdims=True), 1e-300)
    Bn = B / np.maximum(np.linalg.norm(B, axis=1, keepdims=True), 1e-300)
    C = An @ Bn.T
    rows, cols = linear_sum_assignment(-(np.abs(C) if sign_invariant else C))
    perm = np.empty(A.shape[0], dtype=int)
    perm[rows] = cols
    return perm


def match_hidden_units(V_est: np.ndarray, V_true: np.ndarray) -> np.ndarray:
    """Permutation p maximising sum_j cos(V_est[j], V_true[p[j]]) (:func:`match_rows`)."""
    if np.shape(V_est) != np.shape(V_true):
        raise ValueError(f"V shapes differ: estimate {np.shape(V_est)}, truth {np.shape(V_true)}")
    return match_rows(V_est, V_true)


def row_angles(V_est: ArrayLike, W_true: ArrayLike, *, sign_invariant: bool = False) -> np.ndarray:
    """Angles (radians) between the rows of V_est and their matched rows of W_true
    (:func:`match_rows`); ``sign_invariant`` matches and measures up to the sign of each row
    (GP19's Step 1 before its sign step, even activations)."""
    A = np.asarray(V_est, dtype=np.float64)
    B = np.asarray(W_true, dtype=np.float64)
    A = A / np.linalg.norm(A, axis=1, keepdims=True)
    B = B / np.linalg.norm(B, axis=1, keepdims=True)
    Bm = B[match_rows(A, B, sign_invariant=sign_invariant)]
    if sign_invariant:
        Bm = Bm * np.where(np.sum(A * Bm, axis=1) < 0, -1.0, 1.0)[:, None]
    # Angle from the chord between unit vectors (arccos of the cosine loses half the digits).
    return 2.0 * np.arcsin(np.clip(np.linalg.norm(A - Bm, axis=1) / 2.0, 0.0, 1.0))


def parameter_error(estimate: Any, truth: Any) -> ParameterError:
    """Relative errors of U and V after normalisation and the best permutation.

    Units are matched on (v, b): the rows of ``[V, b]`` after V is scaled to unit rows.

    Parameters
    ----------
    estimate, truth : RecoveryResult, Network, PlantedNetwork or (U, V[, b[, c]]) tuple

    Returns
    -------
    ParameterError
    """
    for name, obj in (("estimate", estimate), ("truth", truth)):
        if not isinstance(obj, tuple) and getattr(obj, "U", None) is None and getattr(obj, "W", None) is not None:
            # A GP19 DeepTeacher: f = P(u(W x - t)) has no output layer U to compare.
            raise TypeError(
                f"the {name} is a {type(obj).__name__} (f = P(u(W x - t))), not a two-layer network; "
                "compare the rows of W: relufast.metrics.row_angles(result.V, teacher.W)"
            )
    degree = _degree(truth)
    est, tru = as_network(estimate), as_network(truth)
    if est.U.shape != tru.U.shape:
        raise ValueError(f"U shapes differ: estimate {est.U.shape}, truth {tru.U.shape}")
    if est.V.shape != tru.V.shape:
        raise ValueError(f"V shapes differ: estimate {est.V.shape}, truth {tru.V.shape}")
    U, V, b = _canonical_biased(est, degree)
    U0, V0, b0 = _canonical_biased(tru, degree)
    if degree is None:  # match directions; the norms are compared in the error
        _, Vd, bd = _canonical_biased(est, 1.0)
        _, V0d, b0d = _canonical_biased(tru, 1.0)
        perm = match_rows(np.column_stack([Vd, bd]), np.column_stack([V0d, b0d]))
    else:
        perm = match_rows(np.column_stack([V, b]), np.column_stack([V0, b0]))
    Vm, Um, bm = V0[perm], U0[:, perm], b0[perm]
    # Angle from the chord between unit vectors (arccos of the cosine loses half the digits).
    Vu = V / np.linalg.norm(V, axis=1, keepdims=True)
    Vmu = Vm / np.linalg.norm(Vm, axis=1, keepdims=True)
    angles = 2.0 * np.arcsin(np.clip(np.linalg.norm(Vu - Vmu, axis=1) / 2.0, 0.0, 1.0))
    return ParameterError(
        U=float(np.linalg.norm(U - Um) / np.linalg.norm(Um)),
        V=float(np.linalg.norm(V - Vm) / np.linalg.norm(Vm)),
        max_angle=float(np.max(angles)),
        permutation=perm,
        b=_relative(b, bm),
        c=_relative(est.c, tru.c),
    )


def _canonical_biased(net, degree):
    """(U, V, b) with unit rows of V, b scaled with them and U compensating."""
    U, V = canonical(net.U, net.V, degree=degree)
    if degree is None:
        return U, V, net.b.copy()
    s = np.linalg.norm(net.V, axis=1)
    s[s == 0] = 1.0
    return U, V, net.b / s


def function_error(estimate: Any, truth: Any, X: ArrayLike) -> float:
    """Relative output error ``||f(X) - f*(X)||_F / ||f*(X)||_F`` on inputs X (n, d)."""
    est, tru = as_network(estimate), as_network(truth)
    if est.activation is None and tru.activation is not None:  # a bare (U, V) tuple
        est = dataclasses.replace(est, activation=tru.activation)
    F0 = tru.predict(X)
    return float(np.linalg.norm(est.predict(X) - F0) / np.linalg.norm(F0))


def matched_squared_error(estimate: Any, truth: Any) -> tuple[float, float]:
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


def _bvn_cdf(h, k, rho):
    """Phi_2(h, k; rho) = P(X <= h, Y <= k) for standard normals with correlation |rho| < 1,
    by one-dimensional quadrature of phi(x) Phi((k - rho x) / s) (accurate to ~1e-15)."""
    from scipy.integrate import quad
    from scipy.special import ndtr

    s = np.sqrt(1.0 - rho * rho)
    f = lambda x: np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi) * ndtr((k - rho * x) / s)
    # Split at the kink-free but steep part near x = k / rho to help the adaptive rule.
    val, _ = quad(f, -np.inf, h, epsabs=1e-16, epsrel=1e-13, limit=200)
    return float(val)


def relu_kernel(b1: float, b2: float, rho: float) -> float:
    """``K(b1, b2, rho) = E[(X + b1)_+ (Y + b2)_+]`` for standard normals with correlation rho.

    Closed form (ATV21 population L2 distance, relufast's derivation):
    ``K = (rho + b1 b2) Phi_2(b1, b2; rho) + b2 phi(b1) Phi((b2 - rho b1)/s)
    + b1 phi(b2) Phi((b1 - rho b2)/s) + s phi(b1) phi((b2 - rho b1)/s)``, s = sqrt(1 - rho^2),
    with the limits at rho = +-1.
    """
    from scipy.special import ndtr

    b1, b2, rho = float(b1), float(b2), float(np.clip(rho, -1.0, 1.0))
    phi = lambda t: np.exp(-0.5 * t * t) / np.sqrt(2 * np.pi)
    if rho >= 1.0 - 1e-15:
        mu = min(b1, b2)
        return float((1 + b1 * b2) * ndtr(mu) + (b1 + b2 - mu) * phi(mu))
    if rho <= -1.0 + 1e-15:
        if b1 + b2 <= 0:
            return 0.0
        return float((b1 * b2 - 1) * (ndtr(b1) + ndtr(b2) - 1) + b2 * phi(b1) + b1 * phi(b2))
    s = np.sqrt(1.0 - rho * rho)
    return float(
        (rho + b1 * b2) * _bvn_cdf(b1, b2, rho)
        + b2 * phi(b1) * ndtr((b2 - rho * b1) / s)
        + b1 * phi(b2) * ndtr((b1 - rho * b2) / s)
        + s * phi(b1) * phi((b2 - rho * b1) / s)
    )


def population_l2(net_a: Any, net_b: Any) -> float:
    """Exact L2 distance ``sqrt(E ||f_a(x) - f_b(x)||^2)`` of two ReLU networks, x ~ N(0, I).

    Networks may have biases and offsets (``y = U relu(V x + b) + c``) and different numbers
    of hidden units. ``f_a - f_b`` is one network with the units of both (output weights
    ``U_a`` and ``-U_b``) and offset ``c_a - c_b``; with unit rows ``w``,
    ``E[relu(w_i.x + b_i) relu(w_j.x + b_j)] = K(b_i, b_j, <w_i, w_j>)`` (:func:`relu_kernel`)
    and ``E[relu(w.x + b)] = b Phi(b) + phi(b)``. Cost O((k_a + k_b)^2) one-dimensional
    quadratures.

    Parameters
    ----------
    net_a, net_b : Network, PlantedNetwork, RecoveryResult or (U, V[, b[, c]]) tuples

    Returns
    -------
    float
    """
    from scipy.special import ndtr

    A, B = as_network(net_a), as_network(net_b)
    if A.activation is not None or B.activation is not None:
        raise ValueError("population_l2 needs ReLU networks (activation None)")
    if A.V.shape[1] != B.V.shape[1] or A.U.shape[0] != B.U.shape[0]:
        raise ValueError(
            f"the networks must have the same input and output dimensions; got V "
            f"{A.V.shape} / {B.V.shape} and U {A.U.shape} / {B.U.shape}"
        )
    V = np.vstack([A.V, B.V])
    b = np.concatenate([np.asarray(A.b), np.asarray(B.b)])
    U = np.hstack([A.U, -B.U])
    gamma = np.asarray(A.c) - np.asarray(B.c)
    r = np.linalg.norm(V, axis=1)
    zero = r == 0
    # A zero row is the constant relu(b): fold it into the offset.
    gamma = gamma + U[:, zero] @ np.maximum(b[zero], 0.0)
    U, V, b, r = U[:, ~zero] * r[~zero], V[~zero] / r[~zero, None], b[~zero] / r[~zero], r[~zero]
    k = V.shape[0]
    C = V @ V.T
    K = np.empty((k, k))
    for i in range(k):
        for j in range(i, k):
            K[i, j] = K[j, i] = relu_kernel(b[i], b[j], C[i, j])
    mean = b * ndtr(b) + np.exp(-0.5 * b * b) / np.sqrt(2 * np.pi)
    sq = np.einsum("oi,ij,oj->", U, K, U) + 2.0 * gamma @ (U @ mean) + gamma @ gamma
    return float(np.sqrt(max(sq, 0.0)))
