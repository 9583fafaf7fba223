"""The first hidden layer: kinks on random lines whose local boundary is a global hyperplane.

A unit of the first layer switches on the hyperplane ``w.x + b = 0`` everywhere; a unit of a
deeper layer switches on a surface bent at the boundaries of the layers before it
([RK20] Sec. 3). A kink's local boundary (:mod:`.hyperplanes`) is therefore a first-layer
unit when the model has a kink on the same hyperplane at random points far from the kink
(window test, :func:`.lines.window_kinks`) at six standard normal points projected on it,
four needed (in a deep network a first-layer kink is invisible where every path after the
unit is inactive; a deeper unit's local boundary passes only at points of its own linear
region).
Lines are drawn in batches until the given number of units is verified; kinks already on a
verified unit cost no further queries; kinks that fail the test are kept for the deeper
layers (:mod:`.deep`).

At low precision (float32 outputs) a normal from finite differences is 1e-2 off at d = 784
(0.1-1 for a unit whose slope jump is small): the window test walks from the kink towards
each far point, correcting the plane on the way (:func:`_verify_far`), and a verified row is
refitted at once through kinks on segments around its kink
(:func:`.refit.anchored_rows`), so that later kinks of the unit are recognised and the
deeper layers get rows to ~1e-5.

References
----------
.. [CJM20] N. Carlini, M. Jagielski, I. Mironov, "Cryptanalytic Extraction of Neural Network
   Models", CRYPTO 2020 (Sec. 4: critical points, their hyperplanes, first-layer weights).
.. [RK20] D. Rolnick, K. Kording, "Reverse-Engineering Deep ReLU Networks", ICML 2020
   (Sec. 3-4: first-layer boundaries are hyperplanes, deeper ones bend).
"""

from __future__ import annotations

import hashlib

import numpy as np

from .._validation import NonFiniteOutputs
from .hyperplanes import Normals, jump_normals
from .lines import Kinks, find_kinks, window_kinks
from .refit import COARSE_DIMS, anchored_rows
from .walk import downstream_basis

__all__ = ["KinkPool", "first_layer", "measure_again", "random_lines"]

#: Random far points at which a candidate hyperplane is tested, and hits needed.
VERIFY_POINTS, VERIFY_HITS = 6, 4
#: Hits needed at low precision in a deep network above COARSE_DIMS inputs, where the
#: normals are coarsest (with one hidden layer every kink is one of its units); such rows
#: are refitted through kinks around their own (:func:`.refit.anchored_rows`) and tested
#: again with their refitted planes before they are kept. The first layer of a trained
#: float32 784-64-64-10 (random state 1, ad-hoc): of its candidates, first-layer units
#: scored 3 hits 36 times and 4 or more 63 times, the others 3 hits 4 times in 426; at 4
#: hits one unit was never verified (10 candidates, 0-3 hits each) and the search stalled
#: after 39 rounds with 63 of 64.
VERIFY_HITS_LOW = 3


class KinkPool:
    """Kinks with their local boundaries that no verified unit explains yet."""

    def __init__(self, d):
        self.x = np.zeros((0, d))
        self.n = np.zeros((0, d))
        self.err = np.zeros(0)

    def add(self, x, n, err):
        self.x = np.vstack([self.x, x])
        self.n = np.vstack([self.n, n])
        self.err = np.append(self.err, err)

    def keep(self, mask):
        self.x, self.n, self.err = self.x[mask], self.n[mask], self.err[mask]

    def __len__(self):
        return len(self.x)


def grid_size(widths):
    """Grid points per line: about GRID_PER_UNIT per unit, so that most kinks sit in cells of
    their own, at most GRID_MAX."""
    return int(min(GRID_MAX, 2 ** np.ceil(np.log2(max(256, GRID_PER_UNIT * sum(widths))))))


GRID_PER_UNIT, GRID_MAX = 24, 4096


def random_lines(oracle, n_lines, widths, rng, scale=1.0):
    """Kinks on ``n_lines`` random lines ``0.5 z + t u``, z, u standard normal, t in
    [-3 scale, 3 scale]: Gaussian-scale inputs at scale 1, one model call. In float64 the
    longer lines start farther out too (``0.5 sqrt(scale) z``): a line crosses a hyperplane
    near its base whatever its length, and a first-layer kink shows only where a unit
    reading it is active (a planted 12-6-5-3 whose second layer's biases are all negative:
    exact at 7 of random states 0-7 with it, 3 without; fuzz case 19 as well).

    A kink is taken from the grid only where the cells beside it are flat; two kinks within
    two cells are both lost there, more often where the grid is capped (fewer than
    GRID_PER_UNIT points a unit) and near the origin, where trained units crowd (a unit of
    the trained digits 64-100-100-10 was lost this way until such stretches were searched:
    ``tests/test_extract_defaults.py``). Such stretches
    are searched again in float64 on CROWD_POINTS points each (one more model call): a list
    of Kinks, one per grid."""
    d = oracle.d
    base = 0.5 * (1.0 if oracle.low_precision else np.sqrt(scale)) * rng.standard_normal((n_lines, d))
    dirs = rng.standard_normal((n_lines, d))
    crowded: list = []
    kinks = find_kinks(oracle, base, dirs, np.linspace(-3.0 * scale, 3.0 * scale, grid_size(widths)), crowded)
    # Only where the grid is capped (fewer than GRID_PER_UNIT points a unit), and in float64
    # (at low precision finer cells bend below the rounding).
    if not crowded or oracle.eps >= CROWD_EPS or GRID_PER_UNIT * sum(widths) <= GRID_MAX:
        return [kinks]
    line, t0, t1 = (np.array(v) for v in zip(*crowded))
    # Each stretch as a line of its own on [0, 1] (one grid for all); its kinks keep the
    # stretch as their direction (their step and slope jumps are in its units).
    span = (t1 - t0)[:, None] * dirs[line]
    sub = find_kinks(oracle, base[line] + t0[:, None] * dirs[line], span, np.linspace(0.0, 1.0, CROWD_POINTS))
    where = line[sub.line]
    return [kinks, sub._replace(line=where, t=t0[sub.line] + sub.t * (t1 - t0)[sub.line])]


#: Points of the grid on which a crowded stretch (three to a few cells) is searched again,
#: and the unit roundoff under which it is.
CROWD_POINTS, CROWD_EPS = 48, 1e-12


#: Lengths of the search lines (times the first round's) and the rounds without a new unit
#: after which the next length is tried: a unit whose hyperplane lies far from the origin
#: (trained networks have them, far beyond the inputs they were trained on) is crossed only by long
#: lines. When every length has gone STALL_ROUNDS rounds without a new unit, the search is
#: saturated: the units left are ones no line shows (functional equivalence, in the driver).
LINE_SCALES, STALL_ROUNDS = (1.0, 8.0, 64.0, 512.0), 3
#: STALL_ROUNDS at low precision, where a line shows a unit's kink only where its slope
#: jump stands above the rounding, so a weak unit is missed by more lines in a row: the
#: trained float32 784-64-64-10 of bench/test_bench_trained.py saturated without 2-3 of its
#: 64 units in 2 of 4 runs at 3 (random states 0-3, ad-hoc), all 64 in 4 of 4 at 6. A first
#: layer short of units leaves every deeper search without rows that verify (one ran over
#: 15 minutes so).
STALL_ROUNDS_LOW = 6


def _stall_rounds(oracle):
    return STALL_ROUNDS_LOW if oracle.low_precision else STALL_ROUNDS


def _normals(oracle, parts, rng):
    """The normals of the kinks of every part (:func:`.hyperplanes.jump_normals`, one call a
    part: their steps differ), as one :class:`.hyperplanes.Normals` (``keep`` numbered anew)."""
    found = [jump_normals(oracle, k, rng) for k in parts]
    x, n, err = (np.concatenate([getattr(f, a) for f in found]) for a in ("x", "n", "error"))
    return Normals(np.arange(len(x)), x, n, err)


def _dedupe(H, tol):
    """Indices of the first of each group of rows of H (unit rows) equal up to sign."""
    keep: list = []
    for i in range(len(H)):
        if not keep or np.max(np.abs(H[keep] @ H[i])) < 1 - tol:
            keep.append(i)
    return np.array(keep, dtype=int)


def _verify(oracle, n, c, x, rng):
    """Hits of the window test at VERIFY_POINTS random points on each hyperplane n.x + c = 0:
    standard normal points projected on it, and for a hyperplane short of VERIFY_HITS there,
    as many points again at each larger scale of VERIFY_SCALES (the largest count).

    A first-layer unit's kink shows only where a unit reading it is active: in a planted
    12-6-5-3 whose second layer's biases are all negative, its units are rarely active
    near the origin, and the kinks of the six first-layer units showed at 9-29% of the
    points at scale 1 (44-78% at scale 3): one of the six passed, and the extraction
    ended `failed`.

    The window grows with the distance from the kink the hyperplane was measured at, by the
    angle error of a measured normal at this precision (float32: ~1e-4)."""
    K, d = n.shape

    def hits(idx, scale, gen):
        Z = scale * gen.standard_normal((len(idx), VERIFY_POINTS, d))
        Z -= (np.einsum("kpd,kd->kp", Z, n[idx]) + c[idx, None])[:, :, None] * n[idx, None, :]
        dist = np.linalg.norm(Z - x[idx, None, :], axis=2).ravel()
        half = oracle.window() + 3.0 * (oracle.normal_tol() / 300) * dist
        hit, _ = window_kinks(oracle, Z.reshape(-1, d), np.repeat(n[idx], VERIFY_POINTS, axis=0) * half[:, None], 1.0)
        return hit.reshape(len(idx), VERIFY_POINTS).sum(axis=1)

    out = hits(np.arange(K), VERIFY_SCALES[0], rng)
    # The larger scales draw from a generator of their own, seeded by the hyperplanes
    # tested: the run's stream stays where the test at scale 1 alone left it.
    far = np.random.default_rng(np.frombuffer(hashlib.sha256(n.tobytes()).digest(), dtype=np.uint32))
    for scale in VERIFY_SCALES[1:]:
        short = np.nonzero(out < VERIFY_HITS)[0]
        if len(short) == 0:
            break
        try:
            out[short] = np.maximum(out[short], hits(short, scale, far))
        except NonFiniteOutputs:  # far out a classifier's logits are lost: the scales so far
            break
    return out


#: Scales of the sets of points of :func:`_verify` (standard normal points times each), the
#: next one tried only for the hyperplanes still short of VERIFY_HITS.
VERIFY_SCALES = (1.0, 4.0, 16.0)


def _verify_far(oracle, n, c, x, rng):
    """Low precision: hits of window tests at VERIFY_POINTS standard normal points projected
    on each measured plane (those of :func:`_verify`), the plane first corrected towards each.

    A normal measured by finite differences is ~1e-2 off at d = 784 in float32 (the rounding
    of d + 1 differences; 0.1 for a unit whose slope jump is small), so the projected point
    misses the model's boundary by far more than a window. On the line from the kink x
    towards the point, the kink is found at each radius of VERIFY_NEAR (each window within
    the error left by the last), the line turned through it, and the far point taken on
    that line: a plane through x and the near kinks, exact for a first-layer unit and missed
    by a deeper unit, whose boundary bends at the first layer's. A point counts when every
    near window holds a kink and the far one holds one within VERIFY_FAR_TOL of its centre."""
    K, d = n.shape
    Z = rng.standard_normal((K, VERIFY_POINTS, d))
    Z -= (np.einsum("kpd,kd->kp", Z, n) + c[:, None])[:, :, None] * n[:, None, :]
    V = (Z - x[:, None, :]).reshape(-1, d)
    far = np.linalg.norm(V, axis=1)
    step = V / far[:, None]  # the plane's direction so far, per unit of radius
    origin = np.repeat(x, VERIFY_POINTS, axis=0)
    N = np.repeat(n, VERIFY_POINTS, axis=0)
    alive = np.arange(len(origin))
    for r, wide in [*zip(VERIFY_NEAR, VERIFY_NEAR_HALF), (None, VERIFY_FAR_HALF)]:
        rr = far[alive] if r is None else np.full(len(alive), r)
        pts = origin[alive] + rr[:, None] * step[alive]
        got = np.zeros(len(pts), dtype=bool)
        # A fine window first (boundaries of the next layers are dense in trained
        # networks: a kink beside the unit's in a wider window is not isolated), wider ones
        # where it holds no kink (a unit with a small slope jump bends a wider cell more).
        for half in (VERIFY_FINE * oracle.window(), oracle.window(), wide * oracle.window()):
            todo = np.nonzero(~got)[0]
            hit, kinks = window_kinks(oracle, pts[todo], N[alive[todo]] * half, 1.0, VERIFY_CELLS)
            # The kink of each window nearest its centre (its offset along the normal).
            off = np.full(len(todo), np.inf)
            np.minimum.at(off, kinks.line, np.abs(kinks.t))
            best = np.abs(kinks.t) == off[kinks.line]
            at = np.zeros(len(todo))
            at[kinks.line[best]] = kinks.t[best]
            if r is None:  # the far kink where the plane through x and the near kinks puts it
                hit &= np.abs(at) <= VERIFY_FAR_TOL * wide
            step[alive[todo[hit]]] += (at[hit] * half / rr[todo[hit]])[:, None] * N[alive[todo[hit]]]
            got[todo[hit]] = True
        alive = alive[got]
    hit = np.zeros(len(origin), dtype=bool)
    hit[alive] = True
    return hit.reshape(K, VERIFY_POINTS).sum(axis=1)


#: Cells of the first window of :func:`_verify_far`, in units of :meth:`Oracle.window`.
#: On the trained float32 784-64-64-10 of bench/test_bench_trained.py, windows of one unit
#: held other first- and second-layer kinks within two cells of a unit's at a quarter of its
#: boundary points (ad-hoc): its true rows scored 1.55 hits of 6 on average (20% of tests
#: at 4 or more, and a unit refitted to 8e-6 was dropped at random state 2, which then took
#: over 10 minutes); with this window first, 5.74 (98%), while planes of second-layer
#: boundaries through their kinks scored 0.48 (0.16 before; none at 3 or more of 96).
VERIFY_FINE = 1 / 16

#: Radii (input units) of the near windows of :func:`_verify_far` (each eight times the last:
#: the position error of a kink found is carried to the next radius times that), and the
#: half-widths of their wide windows in units of :meth:`Oracle.window` (the narrow ones have
#: one), and the far window's.
VERIFY_NEAR, VERIFY_NEAR_HALF, VERIFY_FAR_HALF = (1 / 128, 1 / 16, 1 / 2), (4.0, 4.0, 2.0), 2.0
#: Largest offset (units of the wide far window's half-width) of the far kink from where
#: the plane through x and the near kinks puts it (a first-layer unit's: ~0.01-0.06 at
#: d = 784 in float32; other kinks in the window, up to 7.5: an ad-hoc run on the trained
#: 784-64-64-10 of bench/test_bench_trained.py).
VERIFY_FAR_TOL = 0.25
#: Points of each window (the typical second difference of 16 sets the kink threshold at
#: low precision, :data:`.lines.LOW_GRID`: a unit with a small output weight bends the line
#: below the fixed bound far from the origin).
VERIFY_CELLS = 16


def first_layer(oracle, k, widths, rng, pool, *, max_rounds=200):
    """Hyperplanes ``(W (k, d) unit rows, b (k,))`` of the first layer, signs open.

    Returns (W, b, rounds, saturated); fewer than k rows when ``max_rounds`` rounds of lines
    ran out or the search saturated (``saturated``: every line length of LINE_SCALES went
    STALL_ROUNDS rounds without a new unit, STALL_ROUNDS_LOW at low precision). The kinks
    that are not first-layer ones go to ``pool``.
    """
    d = oracle.d
    deep = len(widths) > 1  # boundaries of later layers cross the lines and segments
    W, b = np.zeros((0, d)), np.zeros(0)
    rounds = stalled = level = before = 0
    top = len(LINE_SCALES)  # lengths in use (fewer once a longer line met non-finite outputs)
    later = None  # the first round's second line: its kinks of units found on the first need no normals
    while len(W) < k and rounds < max_rounds:
        if rounds and later is None:  # the previous round (the first one has two lines)
            stall = _stall_rounds(oracle)
            stalled = 0 if len(W) > before else stalled + 1
            if stalled >= stall * top:
                break
            if stalled and stalled % stall == 0:
                level = (level + 1) % top
        before = len(W)
        rounds += 1
        if later is not None:
            parts, later = later, None
        else:
            try:
                parts = random_lines(oracle, 2 if rounds == 1 else 1, widths, rng, LINE_SCALES[level])
            except NonFiniteOutputs:
                if level == 0:
                    raise
                # A classifier's logits read from its probabilities overflow far out: the
                # lengths from this one on are not used.
                top, level, stalled = level, 0, _stall_rounds(oracle) * level
                continue
            if rounds == 1:
                later = [k.subset(k.line == 1) for k in parts]
                parts = [k.subset(k.line == 0) for k in parts]
        tol_dup = 8.0 * oracle.eps ** (1.0 / 3.0)  # the precision is known after the first answer
        if len(W):
            parts = [k.subset(np.abs(k.x @ W.T + b).min(axis=1) > 0.5 * oracle.window()) for k in parts]
        parts = [k for k in parts if len(k.t)]
        if not parts:
            continue
        nrm = _normals(oracle, parts, rng)
        if len(nrm.keep) == 0:
            continue
        c = -np.einsum("kd,kd->k", nrm.n, nrm.x)
        H = np.hstack([nrm.n, c[:, None]])
        H /= np.linalg.norm(H, axis=1, keepdims=True)
        first = _dedupe(H, tol_dup)
        coarse = oracle.low_precision
        hits = (_verify_far if coarse else _verify)(oracle, nrm.n[first], c[first], nrm.x[first], rng)
        low_bar = coarse and deep and d > COARSE_DIMS
        good = first[hits >= (VERIFY_HITS_LOW if low_bar else VERIFY_HITS)]
        # Let in below VERIFY_HITS (tested again once refitted, below).
        weak = first[(hits >= VERIFY_HITS_LOW) & (hits < VERIFY_HITS)] if low_bar else first[:0]
        bad = np.setdiff1d(np.arange(len(nrm.keep)), good)
        pool.add(nrm.x[bad], nrm.n[bad], nrm.error[bad])
        added = []
        for i in good:
            if len(W) >= k:
                break
            h = np.append(nrm.n[i], c[i])
            Hk = np.hstack([W, b[:, None]])
            if len(W) and np.max(np.abs(Hk @ h) / np.linalg.norm(Hk, axis=1) / np.linalg.norm(h)) >= 1 - tol_dup:
                continue
            W, b = np.vstack([W, nrm.n[i]]), np.append(b, c[i])
            added.append(i)
        if coarse and added:
            # Low precision: the new rows through kinks around their own (coarse normals
            # would put later kinks of the same unit off its plane, and the refit's far
            # boundary points off the model's boundary); rows no pass confirms are dropped.
            rows = np.arange(len(W) - len(added), len(W))
            W, b, done = anchored_rows(oracle, (W, b), rows, nrm.x[added], rng, deep=deep)
            # A row let in at VERIFY_HITS_LOW is tested again with its refitted plane: a
            # deeper unit's boundary is planar within one region of the first layer and can
            # pass the passes there, but not the far points (a planted float32
            # 128-10-10-1 kept such a row when every candidate was let in).
            again = np.nonzero(done & np.isin(added, weak))[0]
            if len(again):
                r = rows[again]
                norm = np.linalg.norm(W[r], axis=1)
                sure = _verify_far(oracle, W[r] / norm[:, None], b[r] / norm, nrm.x[np.array(added)[again]], rng)
                done[again[sure < VERIFY_HITS]] = False
            drop = rows[~done]
            if len(drop):
                W, b = np.delete(W, drop, axis=0), np.delete(b, drop)
                pool.add(nrm.x[added][~done], nrm.n[added][~done], nrm.error[added][~done])
    if len(W) and len(pool):
        pool.keep(np.abs(pool.x @ W.T + b).min(axis=1) > 0.5 * oracle.window())
    return W, b, rounds, stalled >= _stall_rounds(oracle) * top


#: Distance (input units) of the sides of a pooled kink measured again from it, along its
#: normal (drawn in where a known boundary is closer).
AGAIN_STEP = 0.02


def measure_again(oracle, pool, layers, rng):
    """Low precision: the normals of the pooled kinks measured again behind the known
    ``layers`` (signs settled). Kinks pooled during the first layer's search were measured
    in all d directions while no layer was known: ~1e-2 off at d = 784 in float32, some
    0.03-1.5 rad (the rarely active second-layer unit of a trained float32 784-64-64-10,
    whose search then took many rounds). Behind the first layer the gradients on both sides
    lie in the span of its units active at the kink: r + 1 queries a side (r at most the
    layer's width), then the wider stencil and the affine boxes in that span, clear of the
    layer's boundaries (:func:`.hyperplanes.jump_normals`). The sides are taken along the
    kink's normal (its line is not kept), so the slope jump is not checked; a kink whose
    jump is not of rank one keeps its normal. Returns the number measured again."""
    spans = downstream_basis(layers)
    if spans is None or len(pool) == 0:
        return 0
    nrm = jump_normals(oracle, Kinks.off_line(pool.x, pool.n, AGAIN_STEP), rng, spans)
    pool.n[nrm.keep] = nrm.n
    return len(nrm.keep)
