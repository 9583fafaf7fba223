"""Principal component pursuit (robust PCA) by the inexact augmented Lagrangian method.

Splits ``M = L + S`` with L low rank and S sparse by minimising ``||L||_* + lam ||S||_1``
subject to ``L + S = M`` (Candes, Li, Ma, Wright 2011, with their ``lam = 1/sqrt(max(m, n))``;
BJW19 Section 8 prints the objective without lam, docs/bjw19.md, erratum 9). The solver is the inexact
ALM of Lin, Chen and Ma (2010): singular-value thresholding (a partial, randomised SVD of
growing rank when the matrix is large) and soft thresholding, with mu growing by rho.

References
----------
.. [1] E. J. Candes, X. Li, Y. Ma, J. Wright. Robust principal component analysis?
   Journal of the ACM 58(3), 2011.
.. [2] Z. Lin, M. Chen, Y. Ma. The augmented Lagrange multiplier method for exact recovery
   of corrupted low-rank matrices. arXiv:1009.5055, 2010.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._deadline import check as check_deadline

__all__ = ["PCPResult", "principal_component_pursuit"]


@dataclass(frozen=True)
class PCPResult:
    L: np.ndarray
    S: np.ndarray
    rank: int
    iterations: int
    converged: bool
    relative_residual: float  #: ||M - L - S||_F / ||M||_F


def _svt(A, tau, rank_guess, rng, full_below=200):
    """Singular-value thresholding; partial randomised SVD when min(A.shape) is large."""
    small = min(A.shape)
    if small <= full_below:
        U, s, Vt = np.linalg.svd(A, full_matrices=False)
    else:
        r = min(small, rank_guess + 10)
        while True:
            Om = rng.standard_normal((A.shape[1], r))
            Yq = A @ Om
            for _ in range(2):  # power iterations for accuracy
                Yq = A @ (A.T @ np.linalg.qr(Yq)[0])
            Qb = np.linalg.qr(Yq)[0]
            Ub, s, Vt = np.linalg.svd(Qb.T @ A, full_matrices=False)
            U = Qb @ Ub
            if s[-1] <= tau or r >= small:
                break
            r = min(small, 2 * r)
    keep = s > tau
    return (U[:, keep] * (s[keep] - tau)) @ Vt[keep], int(keep.sum())


def principal_component_pursuit(M, *, lam=None, tol=1e-9, max_iter=500, rho=1.5, random_state=0):
    """Split M (n, m) into low-rank L plus sparse S (principal component pursuit).

    Parameters
    ----------
    M : ndarray of shape (n, m)
    lam : float, optional
        Weight of ``||S||_1`` (default ``1 / sqrt(max(n, m))``).
    tol : float, default=1e-9
        Stop when ``||M - L - S||_F / ||M||_F < tol``.
    max_iter : int, default=500
    rho : float, default=1.5
        Growth factor of the penalty mu.

    Returns
    -------
    PCPResult
    """
    M = np.asarray(M, dtype=np.float64)
    rng = np.random.default_rng(random_state)
    n, m = M.shape
    lam = 1.0 / np.sqrt(max(n, m)) if lam is None else float(lam)
    normM = np.linalg.norm(M)
    if normM == 0:
        return PCPResult(M.copy(), np.zeros_like(M), 0, 0, True, 0.0)
    norm2 = np.linalg.norm(M, 2)
    Yd = M / max(norm2, np.abs(M).max() / lam)
    mu, mu_max = 1.25 / norm2, 1.25 / norm2 * 1e7
    S = np.zeros_like(M)
    rank, res = 0, 1.0
    for it in range(1, max_iter + 1):
        check_deadline("in a principal component pursuit iteration")
        L, rank = _svt(M - S + Yd / mu, 1.0 / mu, max(rank, 1), rng)
        T = M - L + Yd / mu
        S = np.sign(T) * np.maximum(np.abs(T) - lam / mu, 0.0)
        Z = M - L - S
        Yd += mu * Z
        mu = min(mu * rho, mu_max)
        res = float(np.linalg.norm(Z) / normM)
        if res < tol:
            return PCPResult(L, S, rank, it, True, res)
    return PCPResult(L, S, rank, max_iter, False, res)
