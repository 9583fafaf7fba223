"""Following a deeper unit's boundary, one known boundary at a time (the steps of the chains
of :mod:`.deep`), and the computed geometry they and the line searches share.

A unit of layer l+2 switches on a surface that is flat inside each linear region of the
layers before it and bends where one of their units switches. From a kink x of it with
normal n, a direction tangent to the surface is followed (computed, no query) to the first
known boundary; just past it the surface crosses a line parallel to that boundary near the
crossing, and the kink found there is the next point of the chain. The new piece's normal
lies in the plane of n and the crossed boundary's normal g (the surface contains the
intersection of its old piece with the known boundary): measured by finite differences at
low precision (:func:`_walk_measured`), computed from the kink's position and checked on a
second line in float64 (:func:`_walk_screened`).
"""

from __future__ import annotations

import numpy as np

from . import nullspace
from .hyperplanes import Spans, jump_normals
from .lines import find_kinks, line_points, screened_kinks
from .net import activation_pattern, active_jacobian, features, pre_activations, preact_jacobians

#: Unit roundoff under which lines are screened (:func:`.lines.screened_kinks`) and a step's
#: normal computed; grids and measured normals otherwise.
SCREEN_EPS = 1e-12

__all__ = ["SCREEN_EPS", "downstream_basis", "known_breaks", "walk_step", "zeta"]

#: Points of the walk along a step (the first known boundaries are located on them).
WALK_GRID = 256
#: Longest step of a walk along a boundary.
WALK_LENGTH = 3.0
#: Points of the window searched past a known boundary.
WINDOW_POINTS = 48
#: Half-width of that window, in units of the step past the boundary.
WINDOW_WIDTH = 12.0


def downstream_basis(layers):
    """Per-kink orthonormal bases of the span of the gradients of the last layer's units
    active at the kink (:class:`.hyperplanes.Spans` for :func:`.hyperplanes.jump_normals`),
    or None when that layer is not narrower than the input. Every unit after that layer,
    and the model's outputs, are functions of its active units near the kink (both sides of
    a deeper kink share their pattern): their gradients lie in that span, so a kink of a
    deeper unit needs derivatives along the active units' directions only, not d (at
    d = 784 and k = 64, 2 (r + 1) queries a kink with r the active units, at most 130,
    instead of 1,570; ``tests/test_chosen_size.py`` checks fewer than 0.8 of 2 (k + 1))."""
    k, d = layers[-1][0].shape[0], layers[0][0].shape[1]
    if k >= d:
        return None

    if len(layers) == 1:  # the first layer: the rows of its active units
        W, b = layers[0]

        def order(x):  # active units first
            return np.argsort(~(x @ W.T + b > 0), axis=1, kind="stable")

        def basis(x, r):
            return np.linalg.qr(np.swapaxes(W[order(x)[:, :r]], 1, 2))[0]  # (c, d, r)

        return Spans(lambda x: (x @ W.T + b > 0).sum(axis=1), basis, layers)

    def svd(x):  # right singular vectors of the active Jacobian, and its rank
        _, s, Vt = nullspace.svd(active_jacobian(layers, x), full_matrices=False)
        return Vt, (s > SPAN_RANK * np.maximum(s[:, :1], 1e-300)).sum(axis=1)

    return Spans(lambda x: svd(x)[1], lambda x, r: np.swapaxes(svd(x)[0][:, :r], 1, 2), layers)


#: Relative singular value of the active Jacobian under which a direction is not in its span.
SPAN_RANK = 1e-10


def zeta(known, tent, X, Theta):
    Phi, _ = features(known, tent, X)
    return Phi @ Theta[:, :-1].T + Theta[:, -1]


def _directions(layers, X, N, want, rng):
    """Unit directions tangent to each boundary (v . n = 0): towards the side of a target
    unit not yet visited when ``want`` names one (unit index, desired sign), else random."""
    C, d = X.shape
    V = rng.standard_normal((C, d))
    Jz = np.concatenate(preact_jacobians(layers, X), axis=1)
    Z = np.hstack(pre_activations(layers, X)[0])
    for c, (unit, sign) in enumerate(want):
        if unit >= 0:
            V[c] = Jz[c, unit] * (1.0 if sign > 0 else -1.0)
            if (Z[c, unit] > 0) == (sign > 0):  # already on that side here: go round
                V[c] = rng.standard_normal(d)
    V -= np.einsum("cd,cd->c", V, N)[:, None] * N
    return V / np.linalg.norm(V, axis=1, keepdims=True)


def _room(layers, x, g, pattern):
    """Half the distance from x along g to the next change of the sign pattern (computed),
    at most STEP_PAST; 0 when the pattern at x + tiny g is not ``pattern``."""
    s = np.linspace(0.0, 2 * STEP_PAST, 65)[1:]
    Z = np.hstack(pre_activations(layers, x[None] + s[:, None] * g[None])[0]) > 0
    same = (Z == pattern).all(axis=1)
    if not same[0]:
        return 0.0
    stop = np.argmin(same) if not same.all() else len(s)
    return float(min(0.5 * s[stop - 1] if stop < len(s) else STEP_PAST, STEP_PAST))


def _first_crossings(layers, X, N, V):
    """Where to look for the boundary being followed past the first known boundary met
    along x + s v: the crossing point x_b, a line at distance rho into the new region,
    parallel to the known boundary and in the plane of n and its normal g (the bent
    boundary meets it at ``rho tan psi`` for a bend psi), the window's half-width, g and
    the sign pattern there. NaN rows where no boundary is met."""
    C, d = X.shape
    s = np.linspace(0.0, WALK_LENGTH, WALK_GRID)
    P = line_points(X, s, V)
    Zs = np.hstack(pre_activations(layers, P.reshape(-1, d))[0]).reshape(C, WALK_GRID, -1)
    S = Zs > 0
    changed = (S != S[:, :1]).any(axis=2)
    j1 = np.where(changed.any(axis=1), changed.argmax(axis=1), -1)
    Y, tau, G = np.full((C, d), np.nan), np.full(C, np.nan), np.full((C, d), np.nan)
    XB, D = np.full((C, d), np.nan), np.full((C, d), np.nan)
    pats = np.zeros((C, S.shape[2]), dtype=bool)
    for c in np.nonzero(j1 > 0)[0]:
        j = j1[c]
        # The first of the units that switch in the cell (two in one cell: the pattern past
        # the first is the cell's start with that unit switched, not the pattern at its end).
        sb, unit = np.inf, -1
        for u in np.nonzero(S[c, j] != S[c, 0])[0]:
            lo, hi, z0 = s[j - 1], s[j], Zs[c, j - 1, u]
            for _ in range(BISECT):
                mid = 0.5 * (lo + hi)
                zm = np.hstack(pre_activations(layers, (X[c] + mid * V[c])[None])[0])[0, u]
                lo, hi = (mid, hi) if (zm > 0) == (z0 > 0) else (lo, mid)
            if 0.5 * (lo + hi) < sb:
                sb, unit = 0.5 * (lo + hi), int(u)
        past = S[c, 0].copy()
        past[unit] = ~past[unit]
        XB[c] = X[c] + sb * V[c]
        g = np.concatenate(preact_jacobians(layers, XB[c : c + 1]), axis=1)[0, unit]
        G[c] = g
        gin = g / np.linalg.norm(g) * (1.0 if past[unit] else -1.0)  # into the new region
        rho = _room(layers, XB[c], gin, past)
        if rho <= 0:
            continue
        b = N[c] - (N[c] @ gin) * gin
        if np.linalg.norm(b) < 1e-12:
            continue
        Y[c] = XB[c] + rho * gin
        D[c] = b / np.linalg.norm(b)
        tau[c] = WINDOW_WIDTH * rho
        pats[c] = past
    return Y, D, XB, tau, G, pats


#: Bisection steps locating a known boundary on a step (computed, no query): to 2^-52.
BISECT = 52
#: How far past a known boundary the boundary being followed is searched.
STEP_PAST = 0.02


def walk_step(oracle, known, tent, X, N, want, rng, put_back=None):
    """One step of every chain; returns (new points, normals, accepted mask): the first known
    boundary along a tangent direction of each chain (computed, :func:`_first_crossings`),
    then the kink past it by :func:`_walk_screened` in float64, else by
    :func:`_walk_measured`. ``put_back``: bool mask of the chains whose point and normal were
    computed from their own equations (:mod:`.reach`), checked with CHECK_BACK."""
    layers = [*known, tent]
    ahead = _first_crossings(layers, X, N, _directions(layers, X, N, want, rng))
    live = np.nonzero(np.isfinite(ahead[3]))[0]
    out = (X.copy(), N.copy(), np.zeros(len(X), dtype=bool))
    if len(live) and oracle.eps < SCREEN_EPS:
        back = np.zeros(len(X), dtype=bool) if put_back is None else np.asarray(put_back, dtype=bool)
        _walk_screened(oracle, layers, N, ahead, live, rng, out, back)
    elif len(live):
        _walk_measured(oracle, layers, N, ahead, live, rng, out)
    return out


def _nearest_fresh(layers, kinks, pats, live, tol, centres):
    """Per line, the index of the kink nearest to the line's centre (``centres[line]``) that
    lies on no known boundary and in the predicted region (pattern ``pats[live[line]]``)."""
    Z, _ = pre_activations(layers, kinks.x)
    fresh = np.min(np.hstack([np.abs(z) for z in Z]), axis=1) > tol
    fresh &= (activation_pattern(layers, kinks.x) == pats[live[kinks.line]]).all(axis=1)
    dist = np.linalg.norm(kinks.x - centres[kinks.line], axis=1)
    best: dict = {}
    for i in np.nonzero(fresh)[0]:
        line = kinks.line[i]
        if line not in best or dist[i] < dist[best[line]]:
            best[line] = i
    return best


def _walk_screened(oracle, layers, N, ahead, live, rng, out, back):
    """The kinks past the known boundaries (``ahead``, chains ``live``) in float64, into
    ``out`` (points, normals, accepted): fewer queries a chain than the 48-point window
    alone of a measured step, which adds 2 (d + 1) for the normal
    (``tests/test_chosen_walk.py`` checks it on a planted 10-20-10: 19.7 there). The kink
    past the known boundary is searched on screened lines (:func:`.lines.screened_kinks`),
    and its normal is computed, not measured: the boundary's
    new piece contains the (d - 2)-flat where its previous piece meets the known boundary
    (through the crossing point x_b) and the kink x', and its normal lies in span(n, g_b),
    so it is the vector of that plane orthogonal to x' - x_b. A second line, half as far
    past the known boundary, must then show a kink where that piece predicts (a kink of
    another unit does not)."""
    Y, Dw, XB, tau, G, pats = ahead
    Xn, Nn, ok = out
    tol = 0.5 * oracle.window()

    def kinks_on(base, dirs):
        # Only the piece of each line around its base: the predicted region is convex, so
        # that piece is the whole of the line in it, and kinks elsewhere are not taken.
        # (digits 64-100-100-10: 879,799 queries instead of 896,083, the same units.)
        own = []
        for br in known_breaks(layers, None, base, dirs, -1.0, 1.0):
            i = max(int(np.searchsorted(br, 0.0)), 1)
            own.append(br[i - 1 : i + 1])
        return screened_kinks(oracle, base, dirs, own, zoom=True)

    # The window's middle sixth first (the boundary meets the line there unless it bends by
    # more than about 60 degrees), the whole window where it does not.
    first = kinks_on(Y[live], Dw[live] * (tau[live, None] / NARROW_FIRST))
    best = _nearest_fresh(layers, first, pats, live, tol, Y[live])
    rest = np.setdiff1d(np.arange(len(live)), list(best))
    if len(rest):
        wide = kinks_on(Y[live[rest]], Dw[live[rest]] * tau[live[rest], None])
        more = _nearest_fresh(layers, wide, pats, live[rest], tol, Y[live[rest]])
        wide = wide._replace(line=rest[wide.line])
        first = first.join(wide)
        best.update({int(rest[ln]): len(first.t) - len(wide.t) + i for ln, i in more.items()})
    if not best:
        return
    kid = np.array(sorted(best.values()), dtype=int)  # kinks of `first`, one a chain
    ch, xk = live[first.line[kid]], first.x[kid]
    g = G[ch] / np.linalg.norm(G[ch], axis=1, keepdims=True)
    e = xk - XB[ch]
    nn = N[ch] * np.einsum("cd,cd->c", g, e)[:, None] - g * np.einsum("cd,cd->c", N[ch], e)[:, None]
    size = np.linalg.norm(nn, axis=1)
    # The check: half as far past the known boundary, the same direction, a window of an
    # eighth of the first around where the new piece crosses it.
    base2 = XB[ch] + 0.5 * (Y[ch] - XB[ch])
    with np.errstate(divide="ignore", invalid="ignore"):
        nn = nn / size[:, None]
        s2 = np.einsum("cd,cd->c", nn, xk - base2) / np.einsum("cd,cd->c", nn, Dw[ch])
    fine = np.nonzero((size > 1e-6 * np.linalg.norm(e, axis=1)) & np.isfinite(s2) & (np.abs(s2) <= tau[ch]))[0]
    if len(fine) == 0:
        return
    kid, ch, xk, nn, base2, s2 = kid[fine], ch[fine], xk[fine], nn[fine], base2[fine], s2[fine]
    rho, half = np.linalg.norm(Y[ch] - XB[ch], axis=1), tau[ch] / CHECK_NARROW
    pred = base2 + s2[:, None] * Dw[ch]
    second = kinks_on(pred, Dw[ch] * half[:, None])
    near = _nearest_fresh(layers, second, pats, ch, tol, pred)
    off = np.full(len(ch), np.inf)
    for j, i in near.items():
        off[j] = np.linalg.norm(second.x[i] - pred[j]) / (rho[j] + half[j])
    put = back[ch]
    take = np.nonzero(off <= np.where(put, CHECK_BACK, CHECK_TOL))[0]
    # A chain put back (its crossing point known to about 1e-6 only): the new piece's
    # normal from the two kinks found on it, not from the crossing point.
    for j in take[put[take]]:
        e2 = xk[j] - second.x[near[j]]
        n2 = N[ch[j]] * (g[j] @ e2) - g[j] * (N[ch[j]] @ e2)
        nn[j] = n2 / np.linalg.norm(n2)
    # A computed normal carries the error of the one before it: where the check shows it
    # grown past REANCHOR, the normal is measured instead (a chain of a hundred steps
    # otherwise drifts past CHECK_TOL).
    again = take[(off[take] > REANCHOR) & ~put[take]]
    if len(again):
        nrm = jump_normals(oracle, first.subset(kid[again]), rng, downstream_basis(layers))
        measured = again[nrm.keep]
        nn[measured] = nrm.n
        take = np.setdiff1d(take, np.setdiff1d(again, measured))
    ok[ch[take]] = True
    Xn[ch[take]], Nn[ch[take]] = xk[take], nn[take]


#: The check line's window is this many times narrower than the first; the kink on it must
#: lie within CHECK_TOL (relative to the distances involved) of the predicted crossing.
CHECK_NARROW, CHECK_TOL = 8.0, 1e-6
#: The check's tolerance for a chain put back before a boundary it had not crossed: its
#: crossing point comes from its equations, 5e-8 to 7e-7 off the true boundary on the
#: trained diabetes 10-100-100-1 (a diagnostic run), and failed the 1e-6 check.
CHECK_BACK = 1e-3
#: The first window searched is this many times narrower than the whole.
NARROW_FIRST = 6.0
#: Check error (relative) past which the step's normal is measured rather than computed: a
#: measured normal is no better than 1e-8 to 1e-7 where regions are small (the trained
#: diabetes 10-100-100-1, see :mod:`.nullspace`); at 1e-9 nearly every step of its chains
#: was measured again, 2 (d + 1) queries each, 46% of the chains' queries.
REANCHOR = 1e-7


def _walk_measured(oracle, layers, N, ahead, live, rng, out):
    """The kinks past the known boundaries (``ahead``, chains ``live``) at low precision, into
    ``out`` (points, normals, accepted): the kink nearest to the prediction past the known
    boundary, in the predicted region, is taken and its normal measured
    (:func:`.hyperplanes.jump_normals`); it is kept when the normal lies in span(n, g_b):
    the bent boundary contains the intersection of its previous piece with the known
    boundary crossed (a kink of another unit does not)."""
    Y, Dw, XB, tau, G, pats = ahead
    Xn, Nn, ok = out
    kinks = find_kinks(oracle, Y[live], Dw[live] * tau[live, None], np.linspace(-1.0, 1.0, WINDOW_POINTS))
    best = _nearest_fresh(layers, kinks, pats, live, 0.5 * oracle.window(), Y[live])
    if not best:
        return
    idx = np.array(sorted(best.values()), dtype=int)
    nrm = jump_normals(oracle, kinks.subset(idx), rng, downstream_basis(layers))
    ch = live[kinks.line[idx[nrm.keep]]]
    for j, c in enumerate(ch):
        B = np.linalg.qr(np.stack([N[c], G[c]], axis=1))[0]
        off = np.linalg.norm(nrm.n[j] - B @ (B.T @ nrm.n[j]))
        if off <= oracle.normal_tol() and 1 - abs(nrm.n[j] @ G[c]) / np.linalg.norm(G[c]) > oracle.normal_tol():
            ok[c] = True
            Xn[c], Nn[c] = nrm.x[j], nrm.n[j]


def known_breaks(layers, Theta, base, dirs, t0, t1):
    """Sorted parameters t in [t0, t1] where a unit of the known layers or of the rows of
    Theta (None: none yet) switches on each line ``base + t dirs`` (computed, no query): sign changes on a
    grid of about BREAK_STEP in x (64 to BREAK_GRID points), located by FALSI_STEPS steps of
    regula falsi (exact at once where the unit is affine on the cell, which a first-layer
    unit always is); lines in blocks of BREAK_BYTES."""
    known, tent = layers[:-1], layers[-1]
    L, d = base.shape

    def values(P):
        V = np.hstack(pre_activations(layers, P)[0])
        return np.hstack([V, zeta(known, tent, P, Theta)]) if Theta is not None and len(Theta) else V

    length = (t1 - t0) * float(np.max(np.linalg.norm(dirs, axis=1))) if L else 0.0
    G = int(np.clip(np.ceil(length / BREAK_STEP), 64, BREAK_GRID))
    t = np.linspace(t0, t1, G)
    out: list = []
    block = max(1, int(BREAK_BYTES // (8 * G * d)))
    for lo in range(0, L, block):
        B, U = base[lo : lo + block], dirs[lo : lo + block]
        V = values(line_points(B, t, U).reshape(-1, d)).reshape(len(B), G, -1)
        line, cell, col = np.nonzero(np.signbit(V[:, :-1]) != np.signbit(V[:, 1:]))
        a, b = t[cell], t[cell + 1]
        va, vb = V[line, cell, col], V[line, cell + 1, col]
        s0 = np.signbit(va)
        mid = 0.5 * (a + b)
        for _ in range(FALSI_STEPS):  # exact in one step where the unit is affine on the cell
            mid = np.clip(a - va * (b - a) / np.where(vb != va, vb - va, 1.0), a, b)
            vm = values(B[line] + mid[:, None] * U[line])[np.arange(len(mid)), col]
            same = np.signbit(vm) == s0
            a, va = np.where(same, mid, a), np.where(same, vm, va)
            b, vb = np.where(same, b, mid), np.where(same, vb, vm)
        out.extend(np.concatenate([[t0], np.sort(mid[line == i]), [t1]]) for i in range(len(B)))
    return out


#: Step (in x) of the computed grid on which the known kinks of a line are bracketed, its
#: largest number of points, regula falsi steps, and the memory of a block of lines.
BREAK_STEP, BREAK_GRID, FALSI_STEPS, BREAK_BYTES = 0.01, 8192, 3, 64 * 2**20
