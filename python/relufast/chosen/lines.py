"""Critical points on lines, found in batches (after [CJM20] Sec. 4.2, relufast's own search).

Along a line ``x(t) = a + t u`` a ReLU network is piecewise linear in t; a critical point
(a unit switching) is a kink. All lines of a batch are evaluated on one grid in one model
call; a grid cell holds exactly one kink when the second differences on both of its ends
are non-zero and those one step further out are zero (the two outer pieces are linear).
The kink is then the intersection of the two outer pieces, exact up to the rounding of the
outputs (no bisection, no per-point search as in [CJM20]); one more query at the kink checks
that the model meets the two pieces there (two kinks in one cell do not). Every output is
searched, and the slopes of every output on both sides are kept.

References
----------
.. [CJM20] N. Carlini, M. Jagielski, I. Mironov, "Cryptanalytic Extraction of Neural Network
   Models", CRYPTO 2020.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Kinks", "find_kinks", "line_points"]


def line_points(base, t, dirs):
    """The points ``base[:, None] + t[..., None] * dirs[:, None]`` (L, G, d) of the lines
    ``base + t dirs`` (base, dirs (L, d); t (G,) shared or (L, G) a line): the product
    written into the result and the base added in place, the same numbers as the
    expression without its (L, G, d) temporary (fresh pages of every such array cost a
    page fault each: 44 s of system time of the 245 s of a trained float32
    784-128-128-10, ad-hoc)."""
    t = np.asarray(t)
    tt = t[None, :, None] if t.ndim == 1 else t[:, :, None]
    X = np.empty((dirs.shape[0], tt.shape[1], dirs.shape[1]), dtype=np.result_type(base, t, dirs))
    np.multiply(tt, dirs[:, None, :], out=X)
    X += base[:, None, :]
    return X


class Kinks(NamedTuple):
    """Kinks found on a batch of lines.

    Attributes
    ----------
    line : ndarray of int, shape (K,)
        Index of the line each kink lies on.
    t : ndarray of shape (K,)
        Parameter of the kink on its line.
    x : ndarray of shape (K, d)
        The kinks ``a + t u``.
    u : ndarray of shape (K, d)
        Direction of the line.
    step : float
        Grid step in t: the line is linear for at least one step on both sides of the kink.
    slope_jump : ndarray of shape (K, m)
        Change of the derivative along u of every output across the kink.
    """

    line: np.ndarray
    t: np.ndarray
    x: np.ndarray
    u: np.ndarray
    step: float
    slope_jump: np.ndarray

    @classmethod
    def off_line(cls, x, u, step):
        """Points x taken as kinks of lines along u with grid step ``step``, measured off any
        search line: a NaN slope jump, which :func:`.hyperplanes.jump_normals` does not check
        the normal against."""
        K = len(x)
        return cls(np.arange(K), np.zeros(K), x, u, step, np.full((K, 1), np.nan))

    def join(self, other):
        """These kinks and ``other``'s (same lines), with the larger step (an empty search
        reports step 0)."""
        cat = {f: np.concatenate([getattr(self, f), getattr(other, f)]) for f in self._fields if f != "step"}
        return self._replace(step=max(self.step, other.step), **cat)

    def subset(self, idx):
        """The kinks ``idx`` (indices or a boolean mask), same step."""
        return self._replace(
            line=self.line[idx], t=self.t[idx], x=self.x[idx], u=self.u[idx], slope_jump=self.slope_jump[idx]
        )


#: Second differences beside a kink's cell below this fraction of the kink's count as flat.
ISOLATION = 1e-6


def find_kinks(oracle, base, dirs, t_grid, crowded=None, near_points=False):
    """Isolated kinks of the model on the lines ``base[i] + t dirs[i]``, t in ``t_grid``.

    Every output is searched (a unit whose output weights nearly cancel in one combination
    of the outputs still shows in the others); the kink is located on the output where its
    second difference stands highest above the rounding noise (at the scale of the line's
    largest output).

    Parameters
    ----------
    oracle : Oracle
    base, dirs : ndarray of shape (n_lines, d)
    t_grid : ndarray of shape (G,)
        Uniform grid (G >= 6); the kinks are searched in cells 2..G-4.

    crowded : list or None
        When a list, the stretches ``(line, t0, t1)`` of cells that bend without a kink
        taken there (two kinks within two cells of each other) are appended to it, merged
        where they overlap.
    near_points : bool
        At low precision, also the kinks near a grid point, whose slope jump bends only one
        of the two second differences beside it above the threshold (the deeper layers'
        searches, :mod:`.deep`).

    Returns
    -------
    Kinks
    """
    base = np.asarray(base, dtype=np.float64)
    dirs = np.asarray(dirs, dtype=np.float64)
    n_lines, d = base.shape
    G = len(t_grid)
    X = line_points(base, t_grid, dirs)
    Y = oracle(X.reshape(-1, d))
    Y = Y.reshape(n_lines, G, Y.shape[1])
    # Rounding noise at the scale of the line's largest output, for every output: an output
    # near zero is computed from terms as large as the others (a threshold from its own
    # size flags its rounding as kinks and rejects true kinks located on it).
    thr = oracle.zero_factor() * np.abs(Y).max(axis=(1, 2))[:, None, None] + 1e-300  # (L, 1, 1)
    D2 = np.abs(Y[:, :-2] - 2 * Y[:, 1:-1] + Y[:, 2:])
    if oracle.low_precision and G >= LOW_GRID:
        # Low precision: NOISE_FACTOR eps is a bound for deep, wide forward passes; the
        # typical second difference of the line (most cells hold no kink) measures its own
        # rounding, a few eps of its largest output in a one-layer float32 network, where
        # units with small output weights bend the line by 10-500 eps (a float32 100-32-1
        # lost 5 of its 32 units under the bound).
        typical = LOW_MEDIAN * np.median(D2.max(axis=2), axis=1)[:, None, None]
        thr = np.minimum(thr, np.maximum(typical, LOW_FLOOR * oracle.eps * np.abs(Y).max(axis=(1, 2))[:, None, None]))
    raw = D2.max(axis=2)  # (L, G - 2), for the stretches' rounding (:func:`_hinge_kinks`)
    D2 = D2 / thr  # (L, G - 2, m), > 1: not collinear
    level = D2.max(axis=2)
    i = np.arange(2, G - 3)
    # A kink in cell i bends the two second differences beside it, and not the next ones out.
    # Those are "flat" up to ISOLATION times the kink's own: far from the origin a model's
    # internal terms (pre-activations of size |W| |x|) round above the threshold set by its
    # outputs, while a kink's own stand orders of magnitude above it (a unit switching at
    # |x| = 800: tests/test_chosen_undetermined.py::test_unit_switching_at_800_is_found).
    low = oracle.low_precision and near_points
    if low:
        # A kink at fraction tau of its cell bends the second differences beside it by
        # (1 - tau) and tau of its slope jump times the step: at low precision, where the
        # jump is a few times the rounding, a test of both against the threshold lost the
        # kinks near a grid point (58% of the isolated crossings of a trained float32
        # 784-128-128-10's second-layer units, most above the threshold in one of the two).
        # Their sum is the jump times the step wherever the kink lies; a kink near a grid
        # point then passes in both cells beside it, and the cell whose two differences
        # are the more even is kept. Not in the first layer's search: there the kinks of
        # later layers it would add cost a normal each before they are of use (the trained
        # float32 784-64-64-10's first layer asked 3.9 million queries instead of 3.0 at
        # random state 0).
        kink = level[:, i - 1] + level[:, i]
    else:
        kink = np.minimum(level[:, i - 1], level[:, i])
    flat = np.maximum(1.0, ISOLATION * kink)
    ok = (kink > 1) & (level[:, i - 2] <= flat) & (level[:, i + 1] <= flat)
    if low:
        even = np.minimum(level[:, i - 1], level[:, i])
        both = ok[:, :-1] & ok[:, 1:]
        left = both & (even[:, :-1] < even[:, 1:])
        ok[:, :-1] &= ~(both & ~left)
        ok[:, 1:] &= ~left
    if crowded is not None:
        crowded.extend(_stretches(t_grid, i, (kink > 1) & ~ok))
    li, ci = np.nonzero(ok)
    cell = i[ci]
    o = np.argmax(D2[li, cell - 1] + D2[li, cell], axis=1)
    gm, g0, g1, g2 = (Y[li, cell + s, o] for s in (-1, 0, 1, 2))
    sL, sR = g0 - gm, g2 - g1
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = (g1 - g0 - sR) / (sL - sR)
    # At low precision a kink near a grid point may be located just outside its cell (the
    # line is straight there: its neighbours are flat).
    slack = TAU_SLACK if low else 0.0
    good = np.isfinite(tau) & (tau > -slack) & (tau < 1 + slack)
    li, cell, tau, o = li[good], cell[good], tau[good], o[good]
    step = float(t_grid[1] - t_grid[0])
    pred = Y[li, cell, o] + sL[good] * tau
    jump = ((Y[li, cell + 2] - Y[li, cell + 1]) - (Y[li, cell] - Y[li, cell - 1])) / step
    if oracle.low_precision and G >= HINGE_GRID:
        hl, hc, htau, ho, hpred, hjump = _hinge_kinks(Y, level, raw)
        li, cell, tau, o = (np.concatenate([a, b]) for a, b in ((li, hl), (cell, hc), (tau, htau), (o, ho)))
        pred, jump = np.concatenate([pred, hpred]), np.vstack([jump, hjump / step])
    t = t_grid[cell] + tau * step
    x = base[li] + t[:, None] * dirs[li]
    if len(t):
        # Two kinks in one cell look like one whose two outer pieces meet where the model
        # is not: one query at each kink (one call for all) tells them apart.
        at = oracle(x)[np.arange(len(t)), o]
        single = np.abs(at - pred) <= thr[li, 0, 0]
        li, t, x, jump = li[single], t[single], x[single], jump[single]
    return Kinks(li, t, x, dirs[li], step, jump)


#: Low precision: how far outside its cell (in cells) a kink may be located.
TAU_SLACK = 0.5


#: Low precision (:attr:`.oracle.Oracle.low_precision`), lines of LOW_GRID points or more: the
#: threshold of a kink is LOW_MEDIAN times the line's median second difference, at least
#: LOW_FLOOR eps times its largest output (and at most the bound of :meth:`Oracle.zero_factor`).
LOW_GRID, LOW_MEDIAN, LOW_FLOOR = 16, 16.0, 16.0


#: Low precision, lines of HINGE_GRID points or more: stretches of HINGE_MIN points or more
#: whose second differences are all below the threshold are fitted by a line, and by two
#: lines meeting at a kink where the line leaves a residual above HINGE_NOISE times the
#: rounding (estimated from the line's typical second difference) and the two lines bring it
#: down to HINGE_FIT times the rounding (:func:`_hinge_kinks`); the kink keeps HINGE_SIDE
#: points on each side.
HINGE_GRID, HINGE_MIN, HINGE_NOISE, HINGE_FIT, HINGE_SIDE = 256, 12, 6.0, 2.0, 4


def _hinge_kinks(Y, level, D2):
    """Kinks too weak for the second differences of one cell: a unit with a small output
    weight bends a line by less than the rounding of a cell (float32 784-128-1 on a
    4,096-point grid: 113 of its 128 units found without this, 122 with it) but the stretch
    between the kinks beside it, tens of cells long, by far more than the rounding of a line
    fitted to all of its points.

    ``Y`` (L, G, m) outputs on the grid, ``level`` (L, G - 2) second differences over the
    kink threshold, ``D2`` (L, G - 2) the second differences (largest over the outputs).
    Returns (line, cell, tau, output, value at the kink, slope jump
    per grid step (K, m)) of the kinks found, as :func:`find_kinks` locates its own."""
    L, G, m = Y.shape
    out: list = [[] for _ in range(6)]
    for line in range(L):
        flat = level[line] <= 1.0  # centred at points 1..G-2
        sigma = float(np.median(D2[line][flat])) / 0.6745 / np.sqrt(6.0) if flat.any() else 0.0
        if sigma <= 0:
            continue
        edges = np.flatnonzero(np.diff(np.concatenate([[0], flat.astype(np.int8), [0]])))
        for a, b in zip(edges[::2], edges[1::2]):  # flat centred points a+1 .. b: linear on a .. b+1
            lo, hi = a, b + 2  # points lo .. hi - 1
            n = hi - lo
            if n < HINGE_MIN:
                continue
            y = Y[line, lo:hi]  # (n, m)
            tt = np.arange(n, dtype=np.float64)
            whole, sse_whole = _line_fit(tt, y)
            if sse_whole <= (HINGE_NOISE * sigma) ** 2 * n * m:
                continue
            sse = _split_sse(y - whole[0] - tt[:, None] * whole[1])  # left points :k, right k:
            at = HINGE_SIDE + int(np.argmin(sse))
            best = float(sse[at - HINGE_SIDE])
            if best > (HINGE_FIT * sigma) ** 2 * n * m:
                continue
            cl, cr = _line_fit(tt[:at], y[:at])[0], _line_fit(tt[at:], y[at:])[0]  # (2, m): intercept, slope
            ds = cr[1] - cl[1]
            o = int(np.argmax(np.abs(ds)))
            t0 = (cl[0, o] - cr[0, o]) / ds[o]  # in points from lo
            cell = int(np.floor(t0))
            if not (at - 1 - HINGE_SIDE // 2 <= t0 <= at + HINGE_SIDE // 2) or not 2 <= lo + cell <= G - 4:
                continue
            for lst, v in zip(out, (line, lo + cell, t0 - cell, o, cl[0, o] + cl[1, o] * t0, ds)):
                lst.append(v)
    if not out[0]:
        return np.zeros(0, int), np.zeros(0, int), np.zeros(0), np.zeros(0, int), np.zeros(0), np.zeros((0, m))
    return tuple(np.array(v) for v in out)


def _prefix_sse(r):
    """Sums of squared residuals of the least-squares lines through the first k points of
    r (at t = 0, 1, ...), summed over its columns, for k = 1 .. n (from running sums)."""
    n = len(r)
    k = np.arange(1.0, n + 1)
    t = np.arange(float(n))
    mt = np.cumsum(t) / k
    stt = np.cumsum(t * t) - k * mt * mt
    mr = np.cumsum(r, axis=0) / k[:, None]
    str_ = np.cumsum(t[:, None] * r, axis=0) - k[:, None] * mt[:, None] * mr
    srr = np.cumsum(r * r, axis=0) - k[:, None] * mr * mr
    with np.errstate(invalid="ignore", divide="ignore"):
        sse = srr - np.where(stt[:, None] > 0, str_ * str_ / stt[:, None], 0.0)
    return np.maximum(sse, 0.0).sum(axis=1)


def _split_sse(r):
    """Sum of squared residuals of two least-squares lines, one through points :k and one
    through k: (t = 0, 1, ...; summed over the columns of r), for k = HINGE_SIDE .. n -
    HINGE_SIDE: one pass of running sums instead of two fits a split. ``r`` should be the
    residual of the line through all points (the same splits' sums, no cancellation in the
    running sums of squares)."""
    n = len(r)
    left = _prefix_sse(r)  # [k - 1]: points :k
    right = _prefix_sse(r[::-1])  # [n - k - 1]: points k: (a line fit does not care for t's direction)
    k = np.arange(HINGE_SIDE, n - HINGE_SIDE + 1)
    return left[k - 1] + right[n - k - 1]


def _line_fit(t, y):
    """Least-squares lines through (t, y), one per column of y: ((2, m) intercepts and
    slopes, sum of squared residuals)."""
    A = np.stack([np.ones_like(t), t], axis=1)
    coef = np.linalg.lstsq(A, y, rcond=None)[0]
    r = y - A @ coef
    return coef, float(np.sum(r * r))


def _stretches(t_grid, cells, mask):
    """Merged stretches ``(line, t0, t1)`` one cell either side of the cells of ``mask``
    (lines, cells)."""
    out = []
    for line in np.nonzero(mask.any(axis=1))[0]:
        c = cells[mask[line]]
        lo, hi = c - 1, c + 2
        start, end = lo[0], hi[0]
        for a, b in zip(lo[1:], hi[1:]):
            if a > end:
                out.append((int(line), float(t_grid[start]), float(t_grid[end])))
                start = a
            end = max(end, b)
        out.append((int(line), float(t_grid[start]), float(t_grid[min(end, len(t_grid) - 1)])))
    return out


def window_kinks(oracle, points, normals, half_width, cells=6):
    """For each point, whether the model has a kink within ``half_width`` of it along its
    normal (a six-point window, one model call for all points): the test that a predicted
    hyperplane is a hyperplane of the model there. ``cells``: points of the window, spaced
    by ``half_width`` (more: a wider window whose typical second difference sets the kink
    threshold at low precision, :data:`LOW_GRID`). Returns (bool array, Kinks)."""
    t_grid = half_width * (np.arange(cells) - (cells - 1) / 2)
    kinks = find_kinks(oracle, points, normals, t_grid)
    hit = np.zeros(len(points), dtype=bool)
    hit[kinks.line] = True
    return hit, kinks


__all__ += ["window_kinks"]


def screened_kinks(oracle, base, dirs, breaks, sub=32, margin=1e-3, zoom=False):
    """Kinks of the model on lines whose known kinks are computed: only the pieces between
    known kinks that are not linear are searched (:func:`find_kinks` on ``sub`` points).

    ``breaks[i]`` are the sorted parameters t of the known kinks on line i, with the ends of
    the line first and last. Each piece ``[a, b]`` is queried at ``a + delta``, its middle
    and ``b - delta`` (``delta = margin (b - a)``): three collinear outputs mean no unknown
    kink there (but within delta of a known one). Three queries a piece instead of a dense
    grid (that of :func:`find_kinks` has 4,096 points a line at 100-64-64-10).
    ``zoom``: the stretches of the grid where two kinks lie within two cells of each other
    are searched again on ``sub`` points (two kinks 2.4 cells apart on the walk's line past
    a known boundary of a planted 10-20-10-1: neither was found without).
    Returns Kinks (``line`` indexes the lines given; t and u are those of the piece, or of
    the stretch, searched)."""
    base = np.asarray(base, dtype=np.float64)
    dirs = np.asarray(dirs, dtype=np.float64)
    d = base.shape[1]
    owner = np.concatenate([np.full(len(b) - 1, i) for i, b in enumerate(breaks)]).astype(int)
    a = np.concatenate([b[:-1] for b in breaks])
    b = np.concatenate([b[1:] for b in breaks])
    long = (b - a) > 1e-9
    owner, a, b = owner[long], a[long], b[long]
    delta = margin * (b - a)
    T = np.stack([a + delta, 0.5 * (a + b), b - delta], axis=1)  # (S, 3)
    X = line_points(base[owner], T, dirs[owner])
    Y = oracle(X.reshape(-1, d)).reshape(len(a), 3, -1)
    scale = np.zeros(len(base))
    np.maximum.at(scale, owner, np.abs(Y).max(axis=(1, 2)))
    thr = oracle.zero_factor() * scale[owner] + 1e-300
    w = (T[:, 1] - T[:, 0]) / (T[:, 2] - T[:, 0])
    off = np.abs(Y[:, 1] - ((1 - w)[:, None] * Y[:, 0] + w[:, None] * Y[:, 2])).max(axis=1)
    bent = np.nonzero(off > thr)[0]
    if len(bent) == 0:
        empty = np.zeros((0, d))
        return Kinks(np.zeros(0, dtype=int), np.zeros(0), empty, empty, 0.0, np.zeros((0, Y.shape[2])))
    lo, hi = T[bent, 0], T[bent, 2]
    sub_base = base[owner[bent]] + lo[:, None] * dirs[owner[bent]]
    sub_dirs = (hi - lo)[:, None] * dirs[owner[bent]]
    one, found = _single_kinks(oracle, sub_base, sub_dirs, Y[bent], thr[bent])
    rest = np.nonzero(~found)[0]
    crowded: list | None = [] if zoom else None
    grid = find_kinks(oracle, sub_base[rest], sub_dirs[rest], np.linspace(0.0, 1.0, sub), crowded)
    grid = grid._replace(line=rest[grid.line])
    # One step for both (linear for that fraction of the piece on both sides of each kink).
    step = min(SINGLE_STEP, grid.step)
    if crowded:
        ln = rest[np.array([c[0] for c in crowded])]
        t0, t1 = np.array([c[1] for c in crowded]), np.array([c[2] for c in crowded])
        zd = (t1 - t0)[:, None] * sub_dirs[ln]
        fine = find_kinks(oracle, sub_base[ln] + t0[:, None] * sub_dirs[ln], zd, np.linspace(0.0, 1.0, sub))
        if len(fine.t):
            cat = [np.concatenate([a, b]) for a, b in zip(grid[:4], (ln[fine.line], fine.t, fine.x, fine.u))]
            step = min(step, fine.step)
            grid = Kinks(cat[0], cat[1], cat[2], cat[3], step, np.vstack([grid.slope_jump, fine.slope_jump]))
    both = [np.concatenate([a, b]) for a, b in zip(one[:4], grid[:4])]
    return Kinks(owner[bent][both[0]], both[1], both[2], both[3], step, np.vstack([one.slope_jump, grid.slope_jump]))


#: Inner points of a bent piece (fractions of it from each end) through which its two outer
#: pieces are drawn, and the step (fraction of the piece) that stays linear beside a kink
#: located by them.
SINGLE_INNER = 1 / 16
SINGLE_STEP = SINGLE_INNER / 2
#: Offset (fraction of the piece) of the two checks beside a located kink; also its least
#: distance from an inner point.
SINGLE_CHECK = SINGLE_INNER / 8


def _single_kinks(oracle, base, dirs, Y3, thr):
    """Kinks of pieces ``base + s dirs`` (s in [0, 1]) that hold a single one, located with
    four queries a piece: the outer pieces are drawn through the ends and points
    SINGLE_INNER inside them; their intersection s* is the kink when it lies between the
    inner points, the model follows the left piece just before s* and the right one just
    after (two queries), and the middle output ``Y3[:, 1]`` lies on the piece it should (a
    second kink in the piece fails one of these). Returns (Kinks with ``line`` indexing the
    pieces, found mask); the pieces not found are left to a grid."""
    n, d = base.shape
    m = Y3.shape[2]
    ends = np.array([0.0, 1.0])
    inner = np.array([SINGLE_INNER, 1.0 - SINGLE_INNER])
    Yi = oracle(line_points(base, inner, dirs).reshape(-1, d)).reshape(n, 2, m)
    sL = (Yi[:, 0] - Y3[:, 0]) / SINGLE_INNER  # slopes per unit s
    sR = (Y3[:, 2] - Yi[:, 1]) / SINGLE_INNER
    ds = sR - sL
    o = np.argmax(np.abs(ds), axis=1)
    r = np.arange(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        # Y0 + sL s = Y1 + sR (s - 1)  =>  s = (Y1 - sR - Y0) / (sL - sR)
        s = (Y3[r, 2, o] - sR[r, o] - Y3[r, 0, o]) / (sL[r, o] - sR[r, o])
    # A kink between an end and its inner point makes that side a chord through the inner
    # point, which the other piece meets there: s* at an inner point is no kink.
    ok = np.isfinite(s) & (s > inner[0] + SINGLE_CHECK) & (s < inner[1] - SINGLE_CHECK)
    s = np.where(ok, s, 0.5)
    # The model on the left piece just before s* and on the right one just after (two kinks
    # in the piece, one of them making a side a chord, fail one of the two).
    at = oracle(np.concatenate([base + (s - SINGLE_CHECK)[:, None] * dirs, base + (s + SINGLE_CHECK)[:, None] * dirs]))
    left = Y3[:, 0] + sL * (s - SINGLE_CHECK)[:, None]
    right = Y3[:, 2] + sR * (s + SINGLE_CHECK - ends[1])[:, None]
    tol = 4.0 * thr[:, None]
    pred_mid = np.where((0.5 <= s)[:, None], Y3[:, 0] + sL * 0.5, Y3[:, 2] + sR * (0.5 - 1.0))
    ok &= (np.abs(at[:n] - left) <= tol).all(axis=1) & (np.abs(at[n:] - right) <= tol).all(axis=1)
    ok &= (np.abs(Y3[:, 1] - pred_mid) <= tol).all(axis=1)
    idx = np.nonzero(ok)[0]
    kinks = Kinks(idx, s[idx], base[idx] + s[idx, None] * dirs[idx], dirs[idx], SINGLE_STEP, ds[idx])
    return kinks, ok


__all__ += ["screened_kinks"]
