"""Levenberg-Marquardt on every parameter of ``Y = relu(X V^T + b) U^T + c`` over a subsample.

A stage between a moment estimate and the exact refinement (beyond the papers). The exact
refinements need the estimate close: the activation-region refinement
(:func:`relufast.stages.refine.region_refine`) needs nearly every unit's sign right on a
sample, and BJW19 Algorithm 5 on the affine lift needs at least k outputs. With fewer
outputs than hidden units (m < k) the moment estimate is often a tenth of a radian off.
The squared loss of the network is smooth wherever no sample sits on a kink, and on
noiseless samples its global minimum is the network itself (zero residual on any
subsample that determines it), so a damped Gauss-Newton iteration from the estimate
converges to it, quadratically once the samples' activation patterns are right.

The Jacobian with respect to ``theta = (U, c, [V b])`` has, for output j and sample x
(x~ = [x, 1], a_l = 1[v_l.x + b_l > 0]),

    d f_j / d U_jl = relu(v_l.x + b_l),   d f_j / d c_j = 1,
    d f_j / d [v_l b_l] = U_jl a_l x~,

so ``J^T J`` is formed by one GEMM per output over the rows (dense: n_s (k (d + 1) + m (k + 1))^2
flops) and every step is a Cholesky solve of the Marquardt-damped system. Units are
rescaled to unit rows between steps (the model is invariant under positive rescaling of a
unit, which the damping alone would leave to drift).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from .._blas import single_threaded_blas
from .._deadline import check as check_deadline

__all__ = ["LMResult", "levenberg_marquardt", "lm_rows", "fold_linear"]


class LMResult(NamedTuple):
    """Parameters after the iteration, the relative residual on its rows per step, and steps."""

    U: np.ndarray
    V: np.ndarray
    b: np.ndarray
    c: np.ndarray
    history: tuple
    steps: int
    L: Optional[np.ndarray] = None  #: (m, d) linear part, with ``linear=True``


def lm_rows(d, k, m):
    """Rows of the subsample: 6 equations per parameter (at least 4,000), the smallest count
    measured to keep the subsample's loss free of spurious minima near the estimate."""
    n_params = k * (d + 1) + m * (k + 1)
    return max(4000, (6 * n_params) // max(m, 1) + 1)


def _output_layer(H1, Y):
    """(U, c) by least squares on the features [relu, 1]."""
    coef = np.linalg.lstsq(H1, Y, rcond=None)[0]
    return coef[:-1].T.copy(), coef[-1].copy()


def _normal_equations(Xt, Y, U, W, c, L=None):
    """(J^T J, J^T r, loss) at (U, c[, L], W = [V b]); parameters ordered (U, c[, L]) per
    output, then W, row-major."""
    n, m = Y.shape
    k, d1 = W.shape
    Z = Xt @ W.T
    A = Z > 0
    H = np.where(A, Z, 0.0)
    R = Y - H @ U.T - c
    H1 = np.hstack([H, np.ones((n, 1))])
    if L is not None:
        R -= Xt[:, :-1] @ L.T
        H1 = np.hstack([H1, Xt[:, :-1]])
    q = H1.shape[1]
    n_out = m * q
    P = n_out + k * d1
    G = np.zeros((P, P))
    g = np.zeros(P)
    for j in range(m):
        JW = ((A * U[j])[:, :, None] * Xt[:, None, :]).reshape(n, k * d1)
        s = slice(j * q, (j + 1) * q)
        G[s, s] = H1.T @ H1
        G[s, n_out:] = H1.T @ JW
        G[n_out:, n_out:] += JW.T @ JW
        g[s] = H1.T @ R[:, j]
        g[n_out:] += JW.T @ R[:, j]
    G[n_out:, :n_out] = G[:n_out, n_out:].T
    return G, g, float(np.sum(R * R))


def _unpack(theta, m, k, d1, linear):
    q = k + 1 + (d1 - 1 if linear else 0)
    Uc = theta[: m * q].reshape(m, q)
    L = Uc[:, k + 1 :].copy() if linear else None
    return Uc[:, :k], Uc[:, k], L, theta[m * q :].reshape(k, d1)


def _normalise(U, W):
    """Unit rows of V (positive rescaling moves the norm into U)."""
    s = np.linalg.norm(W[:, :-1], axis=1)
    s = np.where(s > 0, s, 1.0)
    return U * s, W / s[:, None]


def levenberg_marquardt(X, Y, V, b, *, max_steps=60, tol=1e-15, lam0=1e-3, linear=False):
    """Levenberg-Marquardt on ``||Y - relu(X V^T + b) U^T - c||_F^2`` from (V, b) (beyond the papers).

    Parameters
    ----------
    X : ndarray of shape (n, d)
        The subsample's inputs (a few thousand rows: :func:`lm_rows`).
    Y : ndarray of shape (n, m) or (n,)
        Its outputs.
    V, b : ndarray of shape (k, d) and (k,)
        Start (a moment estimate); (U, c) start from least squares.
    max_steps : int, default=60
        Accepted and rejected steps together.
    tol : float, default=1e-15
        Stop when the relative residual on the rows falls below it.
    lam0 : float, default=1e-3
        First damping, relative to the largest diagonal entry of J^T J (Marquardt scaling:
        the damping matrix is diag(J^T J)).
    linear : bool, default=False
        Fit ``f(x) + L x`` with a free linear part L (m, d). Since relu(z) = z + relu(-z), a
        unit estimated with the wrong sign, (-v, -b), is then as good as the right one: the
        iteration has no local minimum at a reflected unit. :func:`fold_linear` turns the
        result back into a network without L.

    Returns
    -------
    LMResult
        Unit rows V; ``history`` holds the relative residual after every accepted step.
    """
    with single_threaded_blas():
        return _iterate(X, Y, V, b, max_steps, tol, lam0, linear)


def _iterate(X, Y, V, b, max_steps, tol, lam0, linear):
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    Y = Y[:, None] if Y.ndim == 1 else Y
    n, m = Y.shape
    Xt = np.hstack([X, np.ones((n, 1))])
    W = np.hstack([np.asarray(V, dtype=np.float64), np.asarray(b, dtype=np.float64)[:, None]])
    k, d1 = W.shape
    Z = Xt @ W.T
    F = np.hstack([np.maximum(Z, 0.0), np.ones((n, 1))] + ([X] if linear else []))
    coef = np.linalg.lstsq(F, Y, rcond=None)[0]
    U, c, L = coef[:k].T.copy(), coef[k].copy(), (coef[k + 1 :].T.copy() if linear else None)
    U, W = _normalise(U, W)
    scale = max(float(np.sum(Y * Y)), 1e-300)
    G, g, loss = _normal_equations(Xt, Y, U, W, c, L)
    history = [np.sqrt(loss / scale)]
    dg = np.maximum(np.diag(G), 1e-12 * max(float(np.max(np.diag(G))), 1e-300))
    lam, steps = lam0, 0
    for steps in range(1, max_steps + 1):
        check_deadline("in a Levenberg-Marquardt step")
        if history[-1] <= tol:
            break
        try:
            chol = np.linalg.cholesky(G + lam * np.diag(dg))
        except np.linalg.LinAlgError:
            lam *= 10.0
            continue
        delta = np.linalg.solve(chol.T, np.linalg.solve(chol, g))
        out = np.hstack([U, c[:, None]] + ([L] if linear else []))
        theta = np.concatenate([out.ravel(), W.ravel()]) + delta
        U1, c1, L1, W1 = _unpack(theta, m, k, d1, linear)
        U1, W1 = _normalise(U1, W1)
        G1, g1, loss1 = _normal_equations(Xt, Y, U1, W1, c1, L1)
        if np.isfinite(loss1) and loss1 < loss:
            U, c, L, W, G, g, loss = U1, c1, L1, W1, G1, g1, loss1
            dg = np.maximum(np.diag(G), 1e-12 * max(float(np.max(np.diag(G))), 1e-300))
            history.append(np.sqrt(loss / scale))
            lam = max(lam / 5.0, 1e-12)
        else:
            lam *= 4.0
            if lam > 1e8:
                break
    return LMResult(U, np.ascontiguousarray(W[:, :-1]), W[:, -1].copy(), c, tuple(history), steps, L)


def fold_linear(out):
    """The network without a linear part from a ``linear=True`` fit: the linear part of an
    exact fit is ``-sum_{i in S} U_i v_i^T`` over the units S fitted reflected (since
    U_i relu(z) = U_i z + U_i relu(-z)), found by least squares (coefficients 0 or -1) and
    reflected back, (v_i, b_i) -> (-v_i, -b_i), c += U_i b_i for each. Returns (LMResult
    without L, largest distance of a coefficient from 0 or -1)."""
    if out.L is None:
        return out, 0.0
    m, k = out.U.shape
    # L = sum_i alpha_i U[:, i] v_i^T: one column per unit in the (m d) equations.
    A = np.stack([np.outer(out.U[:, i], out.V[i]).ravel() for i in range(k)], axis=1)
    alpha = np.linalg.lstsq(A, out.L.ravel(), rcond=None)[0]
    flip = alpha < -0.5
    off = float(np.max(np.abs(alpha + flip))) if k else 0.0
    V, b, c = out.V.copy(), out.b.copy(), out.c.copy()
    V[flip], b[flip] = -V[flip], -b[flip]
    c = c + out.U[:, flip] @ out.b[flip]
    return out._replace(V=V, b=b, c=c, L=None), off
