"""Lines towards the units of the last hidden layer that the searches have not found, from
the residual of the output fit on the units found (low precision).

The outputs are an affine function of the last hidden layer's units. With most of them
found (rows ``theta`` in phi-space, signs open), the least-squares fit of the outputs on
``relu(z)`` and ``relu(-z)`` of the units found (either sign) misses the model exactly
where a unit not found is active: a rarely active unit (3% of Gaussian inputs, the 64th
second-layer unit of a trained float32 784-64-64-10) switches on few random lines, and
searches of several hundred thousand queries each came back without it. Gaussian points
whose residual stands out are on its active side, points that fit on the other. A unit
active on most inputs is affine in the layer below's units where it is active: with those
as features too, the fit misses it only on its inactive side (:func:`_best_fit`). Between
such a pair its boundary is located by bisection on the residual, its normal measured from
the jump of the model's Jacobian across the last bracket, and an entry line along that
normal (half-width ENTRY_WIDTH) gives its kink nearest the bracket for the pool
(:func:`.deep._search`), with its normal measured again there behind the known layers.
"""

from __future__ import annotations

import numpy as np

from .._validation import NonFiniteOutputs
from .deep import ENTRY_WIDTH, _search
from .hyperplanes import jump_normals
from .lines import Kinks
from .net import features
from .walk import downstream_basis

__all__ = ["residual_lines"]

#: Gaussian points of the fit (half at scale 1, half at scale 3); lines at most per unit
#: not found (for RESIDUAL_UNITS of them at most); bisection steps along each pair (the
#: bracket shrinks 2^-steps of the pair's distance).
RESIDUAL_POINTS, RESIDUAL_LINES, RESIDUAL_STEPS = 2048, 32, 12
#: A kink on a unit's boundary gives its row on the units of the layer below active there:
#: the row is complete once its kinks cover them all. Four units of the trained float32
#: 784-128-128-10's second layer missing (ad-hoc replay), 32 lines gave 20 kinks on three of them, covering
#: 119-127 of the 128 first-layer units; 128 lines gave 57, covering all 128 for two.
RESIDUAL_UNITS = 4
#: Farthest the bracket's inner end is moved back past the extrapolated crossing (bracket lengths).
RESIDUAL_BACK = 16.0
#: A point stands out when its residual exceeds RESIDUAL_OUT times the median one of the
#: half it fits best and RESIDUAL_FLOOR times eps * max |output| (the rounding of the
#: outputs); fits on the best half at most.
RESIDUAL_OUT, RESIDUAL_FLOOR, RESIDUAL_FITS = 20.0, 1e3, 16


def _lstsq(F, Y):
    return np.linalg.lstsq(F, Y, rcond=None)[0]


def _fit_residual(F, Y, floor, solve=_lstsq):
    """Row norms of the residual of the least-squares fit of Y on the design F, and
    the bar above which a point stands out: the fit is made again on the half of the points
    it fits best until that half settles (at most RESIDUAL_FITS times: a unit not found
    biases a fit on its points, and its points near its boundary, with small residuals,
    leave the half only gradually), then once more on every point within the bar. Returns
    (residuals, coefficients, bar). ``solve(F, Y)``: the coefficients of the fits that choose
    the half (:func:`.outfit._normal`, from the normal equations, where only the bar is wanted)."""
    use = np.ones(len(F), dtype=bool)
    for _ in range(RESIDUAL_FITS):
        coef = solve(F[use], Y[use])
        r = np.linalg.norm(Y - F @ coef, axis=1)
        best = r <= np.median(r)
        if np.array_equal(best, use):
            break
        use = best
    bar = max(RESIDUAL_OUT * float(np.median(r[use])), floor)
    coef = np.linalg.lstsq(F[r <= bar], Y[r <= bar], rcond=None)[0]
    return np.linalg.norm(Y - F @ coef, axis=1), coef, bar


def _design(Phi, Theta, cols=0):
    """relu(+-z) of the units found, the first ``cols`` features phi (in which the layer is
    affine) and a constant, from the features ``Phi`` (:func:`.net.features`)."""
    z = Phi @ Theta[:, :-1].T + Theta[:, -1]
    return np.hstack([np.maximum(z, 0.0), np.maximum(-z, 0.0), Phi[:, :cols], np.ones((len(Phi), 1))])


def _best_fit(k, Phi, Theta, Y, floor, oriented):
    """The fit of :func:`_fit_residual` without features phi, or with them (the tentative
    layer's units when its signs are settled, else the whole phi while it has at most a
    quarter of RESIDUAL_POINTS columns) where that lowers the bar RESIDUAL_TIGHTER times or
    more; and its ``cols``. ``k``: the tentative layer's units (the first columns of Phi).
    Without them a unit not found fits where it is inactive and stands out where it is
    active, only when that is rarely; with them it fits where it is active, and a unit
    active on 96% of the inputs (six of the eight second-layer units the searches of a
    trained float32 784-128-128-10 missed were active on 93-97%) stands out on its
    inactive side (a planted float32 20-12-8-3, ad-hoc: 377 points of 2,048 there, none
    without)."""
    p = Phi.shape[1]
    choices = [0, k if oriented or p > RESIDUAL_POINTS // 4 else p]
    plain, lin = [(*_fit_residual(_design(Phi, Theta, c), Y, floor), c) for c in choices]
    # Where both fit to the rounding (a rarely active unit not found), the one without:
    # with the features the trained float32 784-64-64-10's rarely active second-layer unit
    # took one search more (5.08 million queries in all instead of 4.31, ad-hoc).
    return lin if lin[2] * RESIDUAL_TIGHTER < plain[2] else plain


#: How much lower the bar of the fit with features phi must be for it to be taken.
RESIDUAL_TIGHTER = 10.0


def residual_lines(oracle, known, tent, Theta, rng, pool, oriented=False, missing=1):
    """Kinks into ``pool`` on lines across the boundaries of last-layer units not found
    (rows of Theta are the units found). Returns the number of lines searched (0 where no
    point stands out, no bracket's jump is of rank one, or the model does not answer at
    these points). ``oriented``: the signs of ``tent`` are settled; ``missing``: the number of
    units not found."""
    d = oracle.d
    n = RESIDUAL_POINTS
    X = np.vstack([rng.standard_normal((n // 2, d)), 3.0 * rng.standard_normal((n - n // 2, d))])
    try:
        Y = oracle(X)
    except NonFiniteOutputs:
        return 0
    floor = RESIDUAL_FLOOR * oracle.eps * float(np.abs(Y).max())
    r, coef, bar, cols = _best_fit(len(tent[0]), features(known, tent, X)[0], Theta, Y, floor, oriented)
    out, fit = np.nonzero(r > bar)[0], np.nonzero(r <= bar)[0]
    if len(out) == 0 or len(fit) == 0:
        return 0
    lines = RESIDUAL_LINES * int(np.clip(missing, 1, RESIDUAL_UNITS))
    a = rng.choice(out, size=min(lines, len(out)), replace=False)  # the side that stands out
    b = rng.choice(fit, size=len(a))
    lo, hi, r_lo, r_hi = X[b], X[a].copy(), r[b], r[a]
    for _ in range(RESIDUAL_STEPS):
        mid = 0.5 * (lo + hi)
        try:
            ym = oracle(mid)
        except NonFiniteOutputs:
            return 0
        rm = np.linalg.norm(ym - _design(features(known, tent, mid)[0], Theta, cols) @ coef, axis=1)
        stands = rm > bar
        hi, r_hi = np.where(stands[:, None], mid, hi), np.where(stands, rm, r_hi)
        lo, r_lo = np.where(stands[:, None], lo, mid), np.where(stands, r_lo, rm)
    # The residual grows linearly from the boundary into the side that stands out, so the bar is
    # crossed inside it (0.009 from the boundary for a weak unit of the trained
    # 784-64-64-10, whose brackets then lay wholly on its active side): the crossing is
    # extrapolated from the two ends' residuals and the bracket's inner end set one bracket
    # length beyond it (at most RESIDUAL_BACK lengths back from where it was).
    t0 = -r_lo / np.maximum(r_hi - r_lo, 1e-300)
    back = np.clip(t0 - 1.0, -RESIDUAL_BACK, -1.0)
    lo = lo + back[:, None] * (hi - lo)
    # The bracket's ends lie on the two sides of the boundary: the jump of the model's
    # Jacobian between them is its normal (in the span of the known layer's units active
    # there). A line along the pair meets the boundary at a grazing angle at large d (a slope
    # jump of 0.016 per unit length on the trained 784-64-64-10's unit above: lost in the
    # rounding); the entry line goes along that normal.
    layers = [*known, tent]
    half = 0.5 * np.linalg.norm(hi - lo, axis=1)
    u = (hi - lo) / np.maximum(2.0 * half, 1e-300)[:, None]
    nrm = jump_normals(oracle, Kinks.off_line(0.5 * (lo + hi), u, float(half.max())), rng, downstream_basis(layers))
    if len(nrm.keep):
        _search(oracle, layers, nrm.x, nrm.n, rng, pool, ENTRY_WIDTH, Theta, nearest=True)
    return len(nrm.keep)
