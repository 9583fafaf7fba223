"""GP19 Step 2: the threshold direction of each unit from the band oracle (Algorithm 2)."""

from __future__ import annotations

import math

import numpy as np

from ..._deadline import check as check_deadline
from .coefficients import _QUANTILE_SPREAD


def _bisect(p, lo, hi, level, steps):
    """s in [lo, hi] with p(s) crossing ``level`` (p(lo) < level <= p(hi))."""
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        v = p(mid)
        if not np.isfinite(v) or v >= level:
            hi = mid
        else:
            lo = mid
    return 0.5 * (lo + hi)


def estimate_tan_alpha(oracle, z, t, rng, *, steps=24):
    """Algorithm 2 (EstimateTanAlpha), reconstructed as in ``docs/gp19.md``.

    With ``p(s) = Pr[f(x) > c0 | z.x in [s - eps, s]]`` and common random numbers, bisection
    finds ``t_1`` with ``p = 0.4`` and ``t_2`` with ``p = 0.6``; by Lemma 4 the estimate is
    ``(t_2 - t_1) / (Phi^{-1}(0.6) - Phi^{-1}(0.4))`` ~ tan(alpha), alpha the angle between z
    and the nearest hidden row. ``steps`` bisection steps on a bracket of width 8 resolve
    s to 5e-7, i.e. tan(alpha) to about 1e-6. Returns ``(tan_alpha, t_1, t_2)``; NaNs when the bracket
    fails (``p(lo) >= 0.4`` or ``p(hi) <= 0.6``: z is near no unit, or t is too low).
    """
    oracle.prepare(z, rng)
    lo = t - 1.0  # below s_0.4 = (t - 0.25 sin(alpha)) / cos(alpha) for every alpha
    hi = t + 6.0 if oracle.s_max is None else min(t + 6.0, oracle.s_max)
    if hi <= lo or not (oracle.p_hat(lo) < 0.4) or not (oracle.p_hat(hi) > 0.6):
        return np.nan, np.nan, np.nan
    t1 = _bisect(oracle.p_hat, lo, hi, 0.4, steps)
    t2 = _bisect(oracle.p_hat, t1, hi, 0.6, steps)
    return (t2 - t1) / _QUANTILE_SPREAD, t1, t2


def refine_estimate(oracle, z, t, rng, *, eps=0.02, max_iter=200, method="paper", stein_width=0.0, callback=None):
    """Step 2 for one row: Algorithm 1 (RefineEstimate) or the Stein update (not in the paper).

    Parameters
    ----------
    oracle : band oracle (samples or queries)
    z : ndarray of shape (n,)
        Unit start (GP19 needs it 1/poly(d)-close to a row; in practice angle <= 0.2).
    t : float
    rng : numpy Generator
    eps : float, default=0.02
        Target angle epsilon_2: stop once the estimated angle is at most eps.
    max_iter : int, default=200
    method : {"paper", "stein"}
        "paper": Algorithm 1 with the typos fixed (erratum 5): perturb by
        ``0.1 sin(alpha) / n`` times a tangent Gaussian, accept when the re-estimated angle
        drops below ``(1 - 0.01 / n) alpha``; alpha is re-estimated for the current z each
        iteration. "stein": NOT in the paper (relufast's extension): in the band at
        ``s = (t_1 + t_2) / 2`` (half width ``max(tan(alpha), stein_width)``),
        ``E[1{f > c0} (I - z z^T) x]`` points along the tangent part of the nearest row
        (Stein's identity); the same mean 1.25 lower, where that row is off, is subtracted
        to cancel the other units; then ``z <- normalize(z + tan(alpha) g / |g|)``.
    callback : callable, optional
        Called as ``callback(iteration, z, tan_alpha)``.

    Notes
    -----
    Besides ``alpha <= eps`` and ``max_iter``, the loop stops when the estimated angle has
    not fallen by 10% for 3 steps (Stein) or 20 n iterations (paper), which happens at the
    resolution floor of the estimates (about 0.4 band widths with samples); the z with the
    smallest estimated angle is returned.

    Returns
    -------
    z, tan_alpha (of the returned z), dict with ``iterations``, ``accepted``, ``history``.
    """
    n = len(z)
    z = z / np.linalg.norm(z)
    hist, accepted = [], 0
    ta, t1, t2 = estimate_tan_alpha(oracle, z, t, rng)
    best = (ta if np.isfinite(ta) else np.inf, z)
    since_best = 0
    patience = 3 if method == "stein" else 20 * n
    for it in range(max_iter):
        check_deadline("in a GP19 Step 2 iteration")
        if callback is not None:
            callback(it, z, ta)
        hist.append(ta)
        if not np.isfinite(ta):
            break
        alpha = math.atan(max(ta, 0.0))
        if alpha <= eps or since_best >= patience:
            break
        if method == "paper":
            delta = rng.standard_normal(n)
            delta -= (delta @ z) * z
            z2 = z + (0.1 * math.sin(alpha) / n) * delta
            z2 /= np.linalg.norm(z2)
            ta2, t1b, t2b = estimate_tan_alpha(oracle, z2, t, rng)
            if np.isfinite(ta2) and math.atan(max(ta2, 0.0)) <= (1.0 - 0.01 / n) * alpha:
                z, accepted = z2, accepted + 1
            ta, t1, t2 = estimate_tan_alpha(oracle, z, t, rng)
        else:
            g = oracle.stein(z, 0.5 * (t1 + t2), rng, max(ta, stein_width))
            ng = np.linalg.norm(g)
            if ng == 0:
                break
            z = z + ta * g / ng
            z /= np.linalg.norm(z)
            accepted += 1
            ta, t1, t2 = estimate_tan_alpha(oracle, z, t, rng)
        if np.isfinite(ta) and ta < 0.9 * best[0]:
            best, since_best = (ta, z), 0
        else:
            since_best += 1
    else:
        hist.append(ta)
    if not (np.isfinite(ta) and ta <= best[0]):
        ta, z = best
    return z, ta, {"iterations": len(hist) - 1, "accepted": accepted, "history": hist, "t1": t1, "t2": t2}


# ---- Step 1 -----------------------------------------------------------------------------------
