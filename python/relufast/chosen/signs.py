"""The sign of each unit on its own, from one wiggle across its boundary (after the sign
recovery of [CCHRSS24], relufast's exact form).

A refitted layer (:mod:`.refit`) is known as hyperplanes: which side of each is the active
one is open. At a point x on the boundary of unit j, take a direction Delta along which,
among the units of the layer, only z_j changes (the change of ``h_{l-1}`` it causes is
orthogonal to the rows of the other active units of the layer; the inactive ones stay
inactive for a short step). On the side where unit j is inactive nothing after the layer
changes, so the model's outputs are exactly those at x (up to rounding); on the other side
they move with the unit's downstream weight. Three queries a point (x, x + t Delta,
x - t Delta), all units of a layer in one model call: the side that moves is the active
side. A point where both or neither side moves (no active path after the unit, or no such
Delta: more active units than directions) decides nothing; a unit no point decides keeps
its sign open, and the next layer's linear term settles it (:func:`.fit.resolve_signs`).

References
----------
.. [CCHRSS24] I. A. Canales-Martinez, J. Chavez-Saab, A. Hambitzer, F. Rodriguez-Henriquez,
   N. Satpute, A. Shamir, "Polynomial Time Cryptanalytic Extraction of Neural Network
   Models", EUROCRYPT 2024.
"""

from __future__ import annotations

import numpy as np

from .net import pre_activations, preact_jacobians
from .refit import _boundary_points

__all__ = ["wiggle_signs"]

#: Boundary points tried per unit, and the fraction of the distance to the nearest other
#: boundary (along Delta) that the step takes.
WIGGLE_POINTS, WIGGLE_STEP = 6, 0.25
#: A side moves when its change is above MOVE times the rounding of the outputs, and is
#: still when below STILL times it. At low precision (where the rounding bound, 256 eps of
#: the largest output, is ~100x what a float32 forward pass rounds by) a side moves above
#: MOVE_LOW times the bound and RATIO_LOW times the other side's change: a float32
#: 64-32-32-10 (a diagnostic run) left a first-layer unit open whose moving side changed by 58-529 times the
#: bound and whose still side by 0.005-0.016 times it (its kinks were then grouped with
#: the signs open: 400,000 of the 1.3 million queries of the run).
MOVE, STILL = 1e3, 1.0
MOVE_LOW, RATIO_LOW = 16.0, 1e3


def _wiggle(known, layer, j, x, settled):
    """Direction Delta (unit) changing only z_j among the units of the layer that may be
    active at x (all of them but the ``settled`` ones, whose orientation is known and which
    are inactive there), the step t and the sign of z_j at x + t Delta (the current
    orientation); None where there is no such direction."""
    Z, _ = pre_activations([*known, layer], x[None])
    z = Z[-1][0]
    others = np.nonzero(~(settled & (z < 0)) & (np.arange(len(z)) != j))[0]
    rank = x.shape[0] if not known else int((Z[-2][0] > 0).sum())  # >= rank of d h_l / d x
    if len(others) >= rank:
        return None
    Jz = [J[0] for J in preact_jacobians([*known, layer], x[None])]  # d z / d x, every layer
    G = Jz[-1]
    g = G[j]
    if len(others):
        M = G[others]
        coef, *_ = np.linalg.lstsq(M.T, g, rcond=None)
        delta = g - M.T @ coef
    else:
        delta = g.copy()
    if np.linalg.norm(delta) <= 1e-6 * np.linalg.norm(g):
        return None
    delta /= np.linalg.norm(delta)
    # Distance along Delta to the nearest other boundary: every unit of the known layers
    # and the layer's other units (computed, first order within the region).
    mask = np.arange(len(z)) != j
    r = np.concatenate([np.abs(J @ delta) for J in Jz[:-1]] + [np.abs(G[mask] @ delta)])
    v = np.concatenate([np.abs(zk[0]) for zk in Z[:-1]] + [np.abs(z[mask])])
    with np.errstate(divide="ignore"):
        room = np.min(np.where(r > 0, v / r, np.inf)) if len(r) else np.inf
    t = float(min(WIGGLE_STEP * room, 0.1))
    if not np.isfinite(t) or t <= 0:
        return None
    return delta, t, float(np.sign(g @ delta))


def wiggle_signs(oracle, known, layer, rng):
    """Orientation of each unit of ``layer`` (after the final layers ``known``).

    Returns ``(flip, resolved)``: boolean arrays over the units, ``flip`` where the active
    side is the negative side of the current row, ``resolved`` where some point decided
    (and no two points disagreed)."""
    W, b = layer
    k = W.shape[0]
    flip = np.zeros(k, dtype=bool)
    resolved = np.zeros(k, dtype=bool)
    # Rounds at the usual points while they settle new units, then the retries for the
    # units left undecided (more points, farther out).
    schedule = [(WIGGLE_POINTS, None)] * WIGGLE_ROUNDS + [(WIGGLE_POINTS * RETRY_FACTOR, sc) for sc in RETRY_SCALES]
    i = 0
    while i < len(schedule):
        todo = np.nonzero(~resolved)[0]
        if len(todo) == 0:
            break
        n_points, scales = schedule[i]
        s = np.where(flip, -1.0, 1.0)
        layer_now = (W * s[:, None], b * s)
        f2, r2 = _round(oracle, known, layer_now, todo, resolved, rng, n_points=n_points, scales=scales)
        flip[r2] = f2[r2] ^ flip[r2]
        resolved |= r2
        i = WIGGLE_ROUNDS if (i < WIGGLE_ROUNDS and not r2.any()) else i + 1
    return flip, resolved


#: Rounds of wiggles: units settled in a round are known to be inactive at the next round's
#: points, which frees directions for the others.
WIGGLE_ROUNDS = 3


#: Rounds for the units left undecided (where no path after the unit is active at the
#: points tried, as happens in trained networks): RETRY_FACTOR times the points, at the
#: scales of each round.
RETRY_FACTOR, RETRY_SCALES = 8, ((1.0, 2.0, 4.0), (4.0, 8.0, 16.0))


def _round(oracle, known, layer, todo, settled, rng, n_points=WIGGLE_POINTS, scales=None):
    W, b = layer
    k = W.shape[0]
    d = oracle.d
    pts, owners, orient = [], [], []
    for j in todo:
        X0, _ = _boundary_points(known, layer, j, n_points, d, rng, scales)
        for x in X0:
            w = _wiggle(known, layer, j, x, settled)
            if w is None:
                continue
            delta, t, s = w
            pts.append(np.stack([x, x + t * delta, x - t * delta]))
            owners.append(j)
            orient.append(s)
    flip = np.zeros(k, dtype=bool)
    resolved = np.zeros(k, dtype=bool)
    if not pts:
        return flip, resolved
    P = np.array(pts)
    Y = oracle(P.reshape(-1, d)).reshape(len(P), 3, -1)
    noise = oracle.zero_factor() * np.abs(Y).max(axis=(1, 2)) + 1e-300
    up = np.abs(Y[:, 1] - Y[:, 0]).max(axis=1) / noise
    down = np.abs(Y[:, 2] - Y[:, 0]).max(axis=1) / noise
    if oracle.low_precision:
        move_up = (up > MOVE_LOW) & (up > RATIO_LOW * down)
        move_down = (down > MOVE_LOW) & (down > RATIO_LOW * up)
    else:
        move_up, move_down = up > MOVE, down > MOVE
    votes = np.zeros((k, 2), dtype=int)  # [keep, flip]
    for i, j in enumerate(owners):
        if move_up[i] and down[i] <= STILL:
            active_positive = orient[i] > 0  # z_j > 0 on the + side in the current orientation
        elif move_down[i] and up[i] <= STILL:
            active_positive = orient[i] < 0
        else:
            continue
        votes[j, 0 if active_positive else 1] += 1
    resolved = (votes.sum(axis=1) > 0) & ((votes[:, 0] == 0) | (votes[:, 1] == 0))
    flip = resolved & (votes[:, 1] > 0)
    return flip, resolved
