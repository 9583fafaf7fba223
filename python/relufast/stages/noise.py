"""Is a residual output noise? The low-order Hermite moments of the residual of a fit,
against the level sampling noise gives them (relufast).

Outputs with additive noise independent of the inputs cannot be fitted to ``tol`` by any
network, so an estimate on them is judged by what is left: when the residual
``r = Y - f(X)`` of a good estimate is noise, its moments ``mean_s r_s x_s`` and
``mean_s r_s (x_s x_s^T - I)`` are only sampling noise, of squared norm about
``var(r) (d + d (d + 1)) / n`` per output. Units the fit misses (a wrong ``n_hidden``, an
estimate outside the basin) leave their own moments ``a_i phi(b_i) v_i v_i^T`` in the
residual, far above that level.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["residual_moment_statistic", "NOISE_Z"]

#: Residual moments more than this many standard deviations above their sampling level
#: are structure the fit missed, not noise.
NOISE_Z = 6.0


def residual_moment_statistic(data, U, V, b=None, c=None):
    """Standardised size of the first two Hermite moments of the residual of ``(U, V, b, c)``.

    Parameters
    ----------
    data : relufast.stages.reduce.Samples
        The samples (inputs taken as x ~ N(0, I): a whitened or standard Gaussian X).
    U : ndarray (m, k), V : ndarray (k, d), b : ndarray (k,) or None, c : ndarray (m,) or None

    Returns
    -------
    dict
        ``z``: (S - E S) / sd(S) for ``S = n sum_j (||M1_j||^2 + ||M2_j||_F^2) / var(r_j)``
        (mean ``m (d^2 + 2 d)`` and variance ``m (4 d^2 + 6 d)`` for noise);
        ``noise_level``: the residual's root-mean-square entry relative to that of Y.
    """
    k, d = V.shape
    m = U.shape[0]
    b = np.zeros(k) if b is None else np.asarray(b, dtype=np.float64)
    c = np.zeros(m) if c is None else np.asarray(c, dtype=np.float64)

    def one_block(Xb, Yb):
        Xb = np.asarray(Xb, dtype=np.float64)
        R = np.asarray(Yb, dtype=np.float64) - (np.maximum(Xb @ V.T + b, 0.0) @ U.T + c)
        return {
            "n": float(len(Xb)),
            "r1": R.sum(axis=0),
            "r2": np.einsum("ij,ij->j", R, R),
            "y2": float(np.einsum("ij,ij->", Yb, Yb)),
            "m1": Xb.T @ R,  # (d, m)
            "m2": np.einsum("si,sj,sl->lij", Xb, Xb, R),  # (m, d, d)
        }

    st = data.map_reduce(one_block)
    n = st["n"]
    var = np.maximum(st["r2"] / n - (st["r1"] / n) ** 2, 1e-300)
    M1 = st["m1"] / n
    M2 = st["m2"] / n - np.eye(d)[None] * (st["r1"] / n)[:, None, None]
    S = float(n * np.sum((np.sum(M1**2, axis=0) + np.sum(M2**2, axis=(1, 2))) / var))
    # Mean: d (first moment) + 2 d (diagonal, variance 2) + d (d - 1) (off-diagonal, each
    # pair counted twice); variance: 2 d + 8 d + 4 d (d - 1) per output.
    dof = m * (d * d + 2 * d)
    z = (S - dof) / math.sqrt(m * (4.0 * d * d + 6.0 * d))
    level = math.sqrt(float(np.sum(st["r2"])) / st["y2"]) if st["y2"] > 0 else float("nan")
    return {"z": float(z), "noise_level": level}
