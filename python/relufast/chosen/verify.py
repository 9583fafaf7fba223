"""Verification of a deeper unit's hyperplane proposed from kinks (:mod:`.deep`): its
predicted boundary must be a boundary of the model at random places.

A row of Theta (on ``[phi, 1]`` of the tentative layer, :func:`.walk.zeta`) predicts where
its unit switches on any line (computed, no query); a window around such a crossing on a
few random lines must show a kink of the model (:func:`.lines.window_kinks`), the window
along the predicted normal at low precision, where a row that some windows confirm and
others miss is refitted through precise kinks (:func:`.refit.refit_layer`) and tested again.
"""

from __future__ import annotations

import numpy as np

from .lines import window_kinks
from .net import pre_activations, pull_back
from .refit import refit_layer

__all__ = ["degenerate", "verified"]


def _line_zeta(known, tent, Theta, A, D, t):
    """Zeta of row i of Theta at ``A_i + t_i D_i`` (rows of Theta, A, D broadcast against t):
    the first layer of ``[*known, tent]`` is affine on a line, so it costs two products a line
    and O(k) a point instead of O(k d)."""
    W1, b1 = (known or [tent])[0]
    z = (A @ W1.T + b1) + t[:, None] * (D @ W1.T)
    kt = tent[0].shape[0]
    if known:
        H = np.maximum(z, 0.0)
        for W, b in known[1:]:
            H = np.maximum(H @ W.T + b, 0.0)
        z = H @ tent[0].T + tent[1]
        lin = np.einsum("ij,ij->i", H, np.broadcast_to(Theta[:, kt:-1], H.shape))
    else:  # phi = [relu(W~ x + b~), x]: its linear part is affine on the line too
        lin = np.einsum("ij,ij->i", A, Theta[:, kt:-1]) + t * np.einsum("ij,ij->i", D, Theta[:, kt:-1])
    return np.einsum("ij,ij->i", np.maximum(z, 0.0), np.broadcast_to(Theta[:, :kt], z.shape)) + lin + Theta[:, -1]


def _crossings(known, tent, Theta, rng, d):
    """For each row of Theta, a point where its zeta changes sign on a random line, and the
    line's unit direction (computed, no query): bisection on the piecewise-linear zeta, all
    rows' intervals halved together (one forward pass a step, not one a row)."""
    P, U = np.full((len(Theta), d), np.nan), np.zeros((len(Theta), d))
    t = np.linspace(-3.0, 3.0, 1024)
    found: list[tuple] = []  # (row, a, u, lo, hi, sign of zeta at lo)
    for i, theta in enumerate(Theta):
        for _ in range(CROSSING_TRIES):
            a, u = 0.5 * rng.standard_normal(d), rng.standard_normal(d)
            z = _line_zeta(known, tent, theta[None], a[None], u[None], t)
            ch = np.nonzero(np.sign(z[:-1]) * np.sign(z[1:]) < 0)[0]
            if len(ch):
                j = ch[rng.integers(len(ch))]
                found.append((i, a, u, t[j], t[j + 1], np.sign(z[j])))
                break
    if not found:
        return P, U
    rows, A, D = np.array([f[0] for f in found]), np.array([f[1] for f in found]), np.array([f[2] for f in found])
    lo, hi, s0 = (np.array([f[k] for f in found]) for k in (3, 4, 5))
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        same = np.sign(_line_zeta(known, tent, Theta[rows], A, D, mid)) == s0
        lo, hi = np.where(same, mid, lo), np.where(same, hi, mid)
    P[rows] = A + (0.5 * (lo + hi))[:, None] * D
    U[rows] = D / np.linalg.norm(D, axis=1, keepdims=True)
    return P, U


def _normals(known, tent, P, Theta):
    """Unit gradients in x of each row's zeta (on ``[phi, 1]``) at its point (rows of P and
    Theta): the row pushed back through the units active there (no Jacobian matrices)."""
    kt = tent[0].shape[0]
    Z, _ = pre_activations([*known, tent], P)
    g = pull_back(known, (Theta[:, :kt] * (Z[-1] > 0)) @ tent[0] + Theta[:, kt:-1], Z)  # d zeta / d h_l, to x
    return g / np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-300)


#: Random lines (computed, no query) tried for a crossing of a predicted boundary: a unit
#: that switches in a small part of the region needs many.
CROSSING_TRIES = 64


def _hits(oracle, known, tent, Theta, rng):
    """(hits, tries) per row of Theta: on VERIFY_LINES random lines where its zeta changes
    sign (tries), the lines with a kink of the model there (hits). At low precision the
    window runs along the row's predicted normal at the crossing, with HIT_CELLS_LOW points
    HIT_SPACING_LOW window units apart (its threshold from the line's own second
    differences, :func:`.lines.find_kinks`), the kink must lie within one spacing of the
    crossing, and a row one hit short is tried on VERIFY_LINES more lines."""
    d = oracle.d
    low = oracle.low_precision
    hits, tries = np.zeros(len(Theta), dtype=int), np.zeros(len(Theta), dtype=int)
    rows = np.arange(len(Theta))
    for again in range(2 if low else 1):
        if again:
            rows = np.nonzero(hits == VERIFY_HITS - 1)[0]
            if len(rows) == 0:
                break
        Ps, Us, owner = [], [], []
        for _ in range(VERIFY_LINES):
            P, U = _crossings(known, tent, Theta[rows], rng, d)
            ok = np.isfinite(P[:, 0])
            Ps.append(P[ok]), Us.append(U[ok]), owner.append(rows[ok])
        P, U, owner = np.vstack(Ps), np.vstack(Us), np.concatenate(owner)
        if len(P) == 0:
            continue
        w = oracle.window()
        if low:
            # Along the predicted normal (a random line in d = 784 meets the boundary at a
            # grazing angle, magnifying a row's error), on a finer window (fewer kinks of
            # other units within two points, which hide the one sought).
            U = _normals(known, tent, P, Theta[owner])
            w *= HIT_SPACING_LOW
            _, kinks = window_kinks(oracle, P, U, w, cells=HIT_CELLS_LOW)
            hit = np.zeros(len(P), dtype=bool)
            hit[kinks.line[np.abs(kinks.t) <= w]] = True
        else:
            hit, _ = window_kinks(oracle, P, U, w)
        hits += np.bincount(owner[hit], minlength=len(Theta))
        tries += np.bincount(owner, minlength=len(Theta))
    return hits, tries


def verified(oracle, known, tent, Theta, rng, carry, tol):
    """Rows of Theta whose predicted boundary is a boundary of the model at random places:
    a kink where zeta changes sign on each of VERIFY_LINES random lines (VERIFY_HITS hits),
    and over every test of the same row (kept in ``carry``) kinks at MIN_HIT_RATE of its
    predicted crossings or more.

    A piece of a deeper unit's boundary fits a hyperplane of this layer where the layer's
    pattern does not change; the grouping and the clustering propose such pieces every
    round, and one round's four lines pass one of them now and then (the trained digits
    64-16-8-8-10 got a wrong second-layer unit that way: tests/test_extract_defaults.py).
    A true unit misses where no unit downstream reads it (often on planted 8-8-6-4-1
    draws), so its rate is not near 1 either: the record only stops the pieces whose rate
    stays below it.

    At low precision a row of Theta that some windows confirm and others miss may be
    replaced in place by its refit (:func:`_refit_partial`), and the mask then judges the
    refitted row."""
    rec = carry.setdefault("verify", [np.zeros((0, Theta.shape[1])), np.zeros(0, int), np.zeros(0, int)])
    idx = np.empty(len(Theta), dtype=int)
    for i, theta in enumerate(Theta):
        u = theta / np.linalg.norm(theta)
        j = np.nonzero(np.abs(rec[0] @ u) > 1 - tol)[0]
        if len(j):
            idx[i] = j[0]
        else:
            idx[i] = len(rec[0])
            rec[0], rec[1], rec[2] = np.vstack([rec[0], u]), np.append(rec[1], 0), np.append(rec[2], 0)
    live = ~degenerate(tent, Theta)
    hits, tries = np.zeros(len(Theta), dtype=int), np.zeros(len(Theta), dtype=int)
    hits[live], tries[live] = _hits(oracle, known, tent, Theta[live], rng)
    if oracle.low_precision:
        _refit_partial(oracle, known, tent, Theta, hits, tries, idx, rng, carry)
    np.add.at(rec[1], idx, hits)
    np.add.at(rec[2], idx, tries)
    return live & _enough(hits, tries) & (rec[1][idx] >= MIN_HIT_RATE * rec[2][idx])


def degenerate(tent, Theta, rel=None):
    """Rows of Theta that are no unit's boundary: zeta vanishes on a half-space, a whole side
    of one unit of the tentative layer (``v relu(z~_j)`` or ``v relu(-z~_j) = v (relu(z~_j) -
    z~_j)``, its weights on every other unit of the layer below DEGENERATE of the row or
    less), or the row reads no unit of that layer at all. Their "crossings" on a line are
    the unit's own kinks, so the windows confirm them; the trained diabetes 10-100-100-1
    (sklearn's default widths, a diagnostic run) had 29 such rows among the 47 it took for
    second-layer units, and the pool lost every kink on the zero side of each (|zeta| under
    the tolerance there: :func:`.deep._prune`)."""
    rel = DEGENERATE if rel is None else rel
    kt = tent[0].shape[0]
    scale = np.linalg.norm(Theta, axis=1)
    C, rest = Theta[:, :kt], Theta[:, kt:]
    big = np.abs(C) > rel * scale[:, None]
    out = big.sum(axis=1) == 0
    for i in np.nonzero(big.sum(axis=1) == 1)[0]:
        j = int(np.argmax(np.abs(C[i])))
        side = C[i, j] * np.append(tent[0][j], tent[1][j])  # v (w~_j, b~_j): z~_j's part of the row
        out[i] = min(np.linalg.norm(rest[i]), np.linalg.norm(rest[i] + side)) <= rel * scale[i]
    return out


#: Relative weight (of a row of Theta) under which :func:`degenerate` takes a weight for zero.
DEGENERATE = 1e-3


def _enough(hits, tries):
    """All VERIFY_HITS hits, or (low precision: a row one short tried again) all but one of
    twice as many."""
    return (hits >= VERIFY_HITS) & (tries <= VERIFY_LINES) | (hits >= 2 * VERIFY_HITS - 1)


def _refit_partial(oracle, known, tent, Theta, hits, tries, idx, rng, carry):
    """Low precision: rows whose predicted boundary some windows confirm and others miss,
    refitted through precise kinks (:func:`.refit.refit_layer`, the units found so far
    dropping the segments their boundaries cross) and tested again; a refit that passes
    replaces its row of Theta in place, with its hits and tries. At most PARTIAL_REFITS
    refits a row (its record, :func:`verified`); only rows on ``relu`` of the oriented
    tentative layer (no linear term: the signs are known).

    A rarely active unit's row from its few clustered kinks is ~5e-4 rad off (the last
    second-layer unit of a trained float32 784-64-64-10, active on 3% of Gaussian inputs)
    and its crossings are then missed by more than the window's spacing on half of the
    lines; its refit is ~5e-5 rad off and hits 4 of 4 (a diagnostic run)."""
    kt = tent[0].shape[0]
    count = carry.setdefault("refits", {})
    cand = np.array([i for i in range(len(Theta)) if hits[i] > 0 and count.get(idx[i], 0) < PARTIAL_REFITS], dtype=int)
    cand = cand[~_enough(hits[cand], tries[cand])]
    have = carry.get("Theta", np.zeros((0, Theta.shape[1])))
    if len(cand) == 0 or np.any(np.vstack([have, Theta[cand]])[:, kt:-1] != 0):
        return
    for i in cand:
        count[idx[i]] = count.get(idx[i], 0) + 1
    new = refit_rows(oracle, known, tent, have, Theta[cand], rng)
    moved = np.any(new != Theta[cand], axis=1)
    if not moved.any():
        return
    h2, t2 = _hits(oracle, known, tent, new[moved], rng)
    keep = _enough(h2, t2)
    rows = cand[moved][keep]
    Theta[rows], hits[rows], tries[rows] = new[moved][keep], h2[keep], t2[keep]


def refit_rows(oracle, known, tent, have, rows, rng, last=False):
    """``rows`` of Theta (on ``relu`` of the oriented tentative layer: no linear term)
    refitted through precise kinks (:func:`.refit.refit_layer`), the rows ``have`` dropping
    the segments their boundaries cross; ``last``: no hidden layer follows."""
    kt, n = tent[0].shape[0], len(have)
    both = np.vstack([have, rows])
    W, b, _, _ = refit_layer(
        oracle, [*known, tent], (both[:, :kt], both[:, -1]), rng, rows=range(n, len(both)), last=last
    )
    new = rows.copy()
    new[:, :kt], new[:, -1] = W[n:], b[n:]
    return new


#: Random lines on which a deeper unit's predicted boundary is tested, and hits needed.
VERIFY_LINES, VERIFY_HITS = 4, 4
#: Points of a test window at low precision (spaced by the window unit). On a float32
#: 64-32-32-10 (a diagnostic run) the six-point windows showed the kinks of true
#: second-layer units at 92% of their predicted crossings, these at 96%; with all four
#: needed, half of the true rows the clustering proposed were rejected, round after round.
HIT_CELLS_LOW = 16
#: Spacing of those points at low precision, in window units (:meth:`.oracle.Oracle.window`).
HIT_SPACING_LOW = 0.25
#: Refits a partly confirmed row gets at low precision (:func:`_refit_partial`).
PARTIAL_REFITS = 2
#: Share of a row's predicted crossings over all its tests that must show a kink
#: (:func:`verified`).
MIN_HIT_RATE = 0.35
