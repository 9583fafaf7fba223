"""Subspace metrics of MR19: principal angles, distances, Davis-Kahan and Theorem 3."""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg as sla

from ..._result import warn
from ..._validation import as_float_matrix, check_positive_int
from .laws import _check_law


def _orthonormal(B, name):
    B = as_float_matrix(B, name)
    Q, R = np.linalg.qr(B)
    if np.min(np.abs(np.diag(R))) <= 1e-12 * max(np.max(np.abs(np.diag(R))), 1e-300):
        raise ValueError(f"{name} must have full column rank; got a rank-deficient {B.shape} matrix")
    return Q


def principal_angles(U, V):
    """Principal angles (radians, ascending) between span(U) and span(V), both (d, k):
    :func:`scipy.linalg.subspace_angles` (accurate for small and large angles) after the
    shape and rank checks."""
    Qu, Qv = _orthonormal(U, "U"), _orthonormal(V, "V")
    if Qu.shape != Qv.shape:
        raise ValueError(f"U and V must have the same shape; got {Qu.shape} and {Qv.shape}")
    return np.sort(sla.subspace_angles(Qu, Qv))


def subspace_distance(estimate, truth):
    """Distances between the column spaces of ``estimate`` and ``truth`` (both (d, k)).

    Returns
    -------
    sin_theta : float
        ``||sin Theta||_F = sqrt(k - ||U^T U-hat||_F^2)`` (at most sqrt(k)).
    procrustes : float
        ``min_O ||U - U-hat O||_F`` over orthogonal O (the left side of (45)/(72)).
    angles : ndarray
        Principal angles in radians.
    """
    U, Uh = _orthonormal(truth, "truth"), _orthonormal(estimate, "estimate")
    if U.shape != Uh.shape:
        raise ValueError(f"estimate and truth must have the same shape; got {Uh.shape} and {U.shape}")
    ang = principal_angles(Uh, U)
    W, _, Zt = np.linalg.svd(Uh.T @ U)
    O = W @ Zt
    return float(np.linalg.norm(np.sin(ang))), float(np.linalg.norm(U - Uh @ O)), ang


def davis_kahan_bound(M, M_hat, k):
    """Right-hand sides of MR19 (71) and (72) (Theorem 5, Yu, Wang and Samworth's variant).

    With ``E = M_hat - M``, U and U-hat the top-k left singular vectors (paper's
    orientation: pass the paper's d x n matrices, or our (n, d) ones transposed):
    ``||sin Theta||_F <= 2 (2 s_1 + ||E||) min(sqrt(k) ||E||, ||E||_F) / (s_k^2 - s_{k+1}^2)``
    and the Procrustes distance is at most the same with 2^{3/2}.

    Returns
    -------
    sin_theta_bound, procrustes_bound : float
    """
    M = as_float_matrix(M, "M")
    M_hat = as_float_matrix(M_hat, "M_hat")
    if M.shape != M_hat.shape:
        raise ValueError(f"M and M_hat must have the same shape; got {M.shape} and {M_hat.shape}")
    k = check_positive_int(k, "k")
    sv = np.linalg.svd(M, compute_uv=False)
    E = M_hat - M
    en, ef = np.linalg.norm(E, 2), np.linalg.norm(E)
    gap = sv[k - 1] ** 2 - (sv[k] ** 2 if sv.size > k else 0.0)
    if gap <= 0:
        return float("inf"), float("inf")
    core = (2 * sv[0] + en) * min(math.sqrt(k) * en, ef) / gap
    return 2.0 * core, 2.0**1.5 * core


def theorem3_constants(bias, gamma, margin, *, grid=20001):
    """The constants of MR19 Theorem 3's bound (35), for reporting (never an oracle).

    ``beta = inf_{|x|<=gamma} p'(x)^2 / (4 p(x))``,
    ``L = max(sup p(x) / P(B <= x), sup |p'(x)| / p(x))`` (absolute value: the proof needs
    |p'|/p), ``omega = min over windows [t, t + margin] in [-gamma, gamma] of P(B in window)``
    and ``bound_per_d = C0 L gamma / (beta omega)`` with ``C0 = 4e`` (the paper's 4/e is a
    typo: (4/C0)^t <= 1/(d+n) with t = log(d+n) needs C0 >= 4e). ``bound_per_d`` bounds
    ``||M - M-hat||_F^2 / d``; it is inf (with a warning) when beta = 0, e.g. for a Gaussian
    bias whose mode lies in [-gamma, gamma].

    Returns
    -------
    dict with keys beta, L, omega, C0, bound_per_d
    """
    law = _check_law(bias, allow_point=False)
    gamma, margin = float(gamma), float(margin)
    if not gamma > 0 or not 0 < margin < 2 * gamma:
        raise ValueError(f"need gamma > 0 and 0 < margin < 2 gamma; got gamma={gamma}, margin={margin}")
    x = np.linspace(-gamma, gamma, grid)
    h = 1e-6 * max(gamma, 1.0)
    p = law.pdf(x)
    dp = (law.pdf(x + h) - law.pdf(x - h)) / (2 * h)
    with np.errstate(divide="ignore", invalid="ignore"):
        beta = float(np.min(np.where(p > 0, dp * dp / (4 * p), 0.0)))
        L = float(max(np.max(p / law.cdf(x)), np.max(np.abs(dp) / p)))
    t = np.linspace(-gamma, gamma - margin, grid)
    omega = float(np.min(law.cdf(t + margin) - law.cdf(t)))
    beta = 0.0 if beta < 1e-12 * max(np.max(p), 1e-300) else beta
    C0 = 4.0 * math.e
    bound = C0 * L * gamma / (beta * omega) if beta > 0 and omega > 0 else float("inf")
    if not np.isfinite(bound):
        warn(
            "Theorem 3's bound is vacuous for this law (beta_gamma(p) = 0: p is not strictly monotone on "
            "[-gamma, gamma]; vacuous_bound)"
        )
    return {"beta": beta, "L": L, "omega": omega, "C0": C0, "bound_per_d": bound}
