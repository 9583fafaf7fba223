"""Deeper layers, peeled one at a time with the earlier layers known ([CJM20] Sec. 5,
[RK20] Sec. 4; relufast's own formulation).

With layers 1..l final and layer l+1 known up to the sign of each unit, every unit of
layer l+2 switches where ``zeta(x) = v . phi(x) + c`` vanishes, with
``phi = [relu(z~_{l+1}), h_l]`` (:func:`.net.features`): a hyperplane in phi-space, whatever
the signs of layer l+1 (a wrong sign only adds a term linear in h_l). In input space the
boundary is bent where a unit of layers 1..l+1 switches, and only there.

At a kink x_p of such a unit with local normal n_p (:mod:`.hyperplanes`), the unit's
pre-activation is zero and its gradient ``A_p^T v`` (A_p = d phi / d x, known) is parallel
to n_p: ``(I - n_p n_p^T) A_p^T v = 0`` and ``phi(x_p) . v + c = 0``, d + 1 linear equations
on (v, c). One linear region gives at most d independent ones; the unit is determined once
its kinks in a few regions are stacked (a one-dimensional null space).

Kinks from random lines are first grouped by unit (:func:`_group`: the stacked equations
of one unit keep one null direction more than those of two units); a group whose kinks see
every unit of layer l+1 on both sides determines the unit. Once the units found fix the
signs of layer l+1, each kink alone gives its unit's row restricted to the active units of
layer l+1, and kinks are clustered by these restrictions, with lines computed into the
active side of the units a cluster missed (:mod:`.cluster`). For the units left, kinks in
other regions are found by following the boundary (all chains in lockstep, one model call
per step for all of them): from x_p a random direction v tangent
to the boundary is followed to the first known boundary (computed, no query); just past
it, the boundary of the unit crosses the line ``y + t n_p`` near t = 0; the kink nearest to
0 in a window on that line is taken, and kept only when it lies in the predicted region and
its normal lies in ``span(n_p, g_b)`` (g_b the normal of the known boundary crossed: the
bent boundary contains their intersection).

References
----------
.. [CJM20] N. Carlini, M. Jagielski, I. Mironov, "Cryptanalytic Extraction of Neural Network
   Models", CRYPTO 2020.
.. [RK20] D. Rolnick, K. Kording, "Reverse-Engineering Deep ReLU Networks", ICML 2020.
"""

from __future__ import annotations

import numpy as np

from .._deadline import check as check_deadline
from .._validation import NonFiniteOutputs
from .cluster import CLUSTER_MIN, CLUSTER_MIN_LOW, cluster_units
from .first_layer import KinkPool, grid_size
from .fit import sign_block, signs_from_rows
from .hyperplanes import jump_normals
from .hypotheses import chosen_choice, sign_choices
from .lines import find_kinks, screened_kinks
from .net import activation_pattern, feature_jacobians, features, pre_activations, preact_jacobians
from .nullspace import _chain_loose, _null_count, _null_rows, _right_svd, _solve, merged_rows, svd
from .reach import REACHES, reached
from .refit import COARSE_DIMS
from .verify import verified
from .walk import SCREEN_EPS, downstream_basis, known_breaks, walk_step, zeta

__all__ = ["next_layer", "downstream_basis"]


def _constraints(known, tent, x, n):
    """Rows (K, d + 1, D + 1) of the linear equations on (v, c) at kinks x with normals n."""
    A = feature_jacobians(known, tent, x)  # (K, D, d)
    Phi, _ = features(known, tent, x)
    K, d = x.shape
    # (I - n n^T) A^T without the (d, d) projector (d^2 D flops a kink at d = 784)
    T = np.swapaxes(A, 1, 2) - n[:, :, None] * np.einsum("kj,kDj->kD", n, A)[:, None, :]
    tan = np.concatenate([T, np.zeros((K, d, 1))], axis=2)
    pt = np.concatenate([Phi, np.ones((K, 1))], axis=1)[:, None, :]
    return np.concatenate([tan, pt], axis=1)


def _targets(pats, n_tent, n_last, delta=None, crossed=False):
    """(unit, sign of z~) pairs a chain still has to visit: a unit of the tentative layer seen
    with one sign only (its column of phi is then linear in the others: a null direction),
    or a unit of the last known layer never active (a zero column). Units are indexed in
    the order of ``pre_activations`` over known + tentative layers. With the signs of the
    tentative layer known (``delta``: the units to flip), the linear term is known
    (:func:`_sign_rows`) and only its units never active in their true orientation are left
    (the last known layer's units then need not be seen at all)."""
    P = np.array(pats)
    total = P.shape[1]
    tent_idx = np.arange(total - n_tent, total)
    last_idx = np.arange(total - n_tent - n_last, total - n_tent)
    if delta is None:
        todo = [(u, 1) for u in tent_idx if not P[:, u].any()] + [(u, -1) for u in tent_idx if P[:, u].all()]
        return todo + [(u, 1) for u in last_idx if not P[:, u].any()]
    # The sign rows fix every coefficient of the linear term: the last known layer's units
    # need not be seen active.
    flip = delta[tent_idx - tent_idx[0]]
    todo = [(u, -1 if f else 1) for u, f in zip(tent_idx, flip) if not (P[:, u] ^ f).any()]
    if crossed:
        todo += [(u, 1 if f else -1) for u, f in zip(tent_idx, flip) if (P[:, u] ^ f).all()]
    return todo


def _sign_rows(tent, delta, cols):
    """Rows (1, d_prev, cols) of the equations ``beta = -sum_j delta_j v_j w~_j`` on (v, beta, c):
    the linear term that known signs of the tentative layer fix (:func:`.fit.resolve_signs`);
    an empty block while the signs are open."""
    if delta is None:
        return np.zeros((1, 0, cols))
    Wt = tent[0]
    rows = np.hstack([(delta[:, None] * Wt).T, np.eye(Wt.shape[1]), np.zeros((Wt.shape[1], 1))])
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True))[None]


def _nearest(layers, x, n, todo):
    """The (unit, sign) of ``todo`` whose boundary is nearest along the boundary being
    followed (|z_j| over the tangential part of its gradient); (-1, 0) when todo is empty."""
    if not todo:
        return (-1, 0)
    z = np.hstack(pre_activations(layers, x[None])[0])[0]
    J = np.concatenate(preact_jacobians(layers, x[None]), axis=1)[0]
    units = np.array([u for u, _ in todo])
    g = J[units] - np.outer(J[units] @ n, n)
    dist = np.abs(z[units]) / np.maximum(np.linalg.norm(g, axis=1), 1e-300)
    return todo[int(np.argmin(dist))]


def _chains(oracle, known, tent, X0, N0, rng, max_steps, delta=None, carried=None):
    """Follow the boundaries through the seeds (X0, N0), each towards the nearest boundary
    it has not crossed yet (a random one after a failed step; a chain that fails STALL
    steps in a row is dropped); the hyperplane (v, c) in phi-space of every chain that
    crossed all it had to and determined one (rows of Theta), and the open chains (their
    equations, last kink and normal, boundaries left, patterns). ``carried``: per seed, None
    or the (equations, patterns) of the open chain it continues."""
    layers = [*known, tent]
    C = len(X0)
    n_tent, n_last = tent[0].shape[0], (known[-1][0].shape[0] if known else 0)
    fixed = _sign_rows(tent, delta, tent[0].shape[0] + tent[0].shape[1] + 1)
    carried = carried or [None] * C
    M = [
        np.concatenate([fixed if g is None else g[0], _constraints(known, tent, X0[c : c + 1], N0[c : c + 1])], axis=1)
        for c, g in enumerate(carried)
    ]
    pats = [([] if g is None else list(g[1])) + [p] for g, p in zip(carried, activation_pattern(layers, X0))]
    X, N = X0.copy(), N0.copy()
    done: dict = {}
    stalled: set = set()
    fails = np.zeros(C, dtype=int)
    reach, put_back = np.full(C, REACHES if delta is not None else 0), np.zeros(C, dtype=bool)  # (.reach)
    for _ in range(max_steps):
        act = np.array([c for c in range(C) if c not in done], dtype=int)
        if len(act) == 0:
            break
        want = []
        for c in act:
            todo = _targets(pats[c], n_tent, n_last, delta, crossed=True)
            pick = todo[rng.integers(len(todo))] if todo and fails[c] else _nearest(layers, X[c], N[c], todo)
            want.append(pick)
        Xn, Nn, ok = walk_step(oracle, known, tent, X[act], N[act], want, rng, put_back[act])
        put_back[act[ok]] = False
        for j, c in enumerate(act):
            if not ok[j]:
                fails[c] += 1
                if fails[c] >= STALL:
                    todo = _targets(pats[c], n_tent, n_last, delta) if reach[c] else []
                    back = reached(layers, M[c], todo, X[c], N[c], _null_tol(oracle), _chain_loose(oracle), rng)
                    if back is None:
                        done[c] = None
                        stalled.add(c)
                    else:  # put back just before a boundary it never crossed (computed)
                        X[c], N[c], fails[c], reach[c], put_back[c] = back[0], back[1], 0, reach[c] - 1, True
                continue
            fails[c] = 0
            X[c], N[c] = Xn[j], Nn[j]
            pats[c].append(activation_pattern(layers, Xn[j : j + 1])[0])
            M[c] = np.concatenate([M[c], _constraints(known, tent, Xn[j : j + 1], Nn[j : j + 1])], axis=1)
            if M[c].shape[1] > 2 * M[c].shape[2] or (M[c].nbytes > CHAIN_BYTES and M[c].shape[1] > M[c].shape[2]):
                # Only the null space is used: the triangular factor keeps it (d + 1 rows a
                # step, 5 MB at d = 784: a float32 784-64-64-10 held 8.6 GB in chains; the
                # SVDs of the stacked rows took 36 of 58 s of a float32 64-32-32-10).
                M[c] = np.asarray(np.linalg.qr(M[c][0], mode="r"))[None]
            if _targets(pats[c], n_tent, n_last, delta):
                continue  # phi has null directions until every unit was crossed
            theta = _solve(M[c], _null_tol(oracle), _chain_loose(oracle))
            if theta is not None:
                done[c] = theta
        solved = np.array([t for t in done.values() if t is not None])
        if len(solved):  # chains on a unit just determined stop
            for c in act:
                if c not in done and np.min(np.abs(zeta(known, tent, X[c : c + 1], solved))) <= 0.5 * oracle.window():
                    done[c] = None
    found = [t for t in done.values() if t is not None]
    # Chains that ran out of steps or stalled (the last boundaries are often ones the unit's
    # boundary never reaches): their equations, and the boundaries they never crossed.
    unfinished = [
        (M[c], X[c], N[c], _targets(pats[c], n_tent, n_last, delta), pats[c])
        for c in range(C)
        if c not in done or c in stalled
    ]
    return (np.array(found) if found else None), unfinished


#: Size of a chain's stacked equations above which they are reduced to a triangular factor;
#: memory of one block of a pool's equations in :func:`_complete` (bytes).
CHAIN_BYTES, COMPLETE_BYTES = 32 * 2**20, 256 * 2**20

#: A chain left with this many boundaries or fewer never crossed is completed from the pool.
PARTIAL = 4


def _across(oracle, layers, partial, rng, pool):
    """Kinks for the pool on the far side of the boundaries a chain could not cross: from
    the chain's last point reflected across each such boundary, a line along the chain's
    last normal (its bent boundary crosses it there when it reaches that side at all)."""
    base, dirs = [], []
    for _, x, n, todo, _ in partial:
        z = np.hstack(pre_activations(layers, x[None])[0])[0]
        J = np.concatenate(preact_jacobians(layers, x[None]), axis=1)[0]
        for u, _ in todo:
            g = J[u]
            base.append(x - 1.2 * z[u] * g / max(float(g @ g), 1e-300))
            dirs.append(n)
    if base:
        _search(oracle, layers, np.array(base), np.array(dirs), rng, pool)


def _fresh(layers, x, tol, Theta=None):
    """Indices of the kinks x on no known boundary (of the layers, or of the units of the
    next layer found so far, rows of Theta): only these are worth a normal."""
    Z, _ = pre_activations(layers, x)
    keep = np.min(np.hstack([np.abs(z) for z in Z]), axis=1) > tol
    if Theta is not None and len(Theta) and len(x):
        keep &= np.min(np.abs(zeta(layers[:-1], layers[-1], x, Theta)), axis=1) > tol
    return np.nonzero(keep)[0]


def _search(oracle, layers, base, dirs, rng, pool, width=None, Theta=None, nearest=False):
    """Kinks on the lines ``base + t dirs`` (|t| <= width) on no known boundary, with
    their normals, into the pool (``nearest``: only the kink nearest to the base of each
    line, where an entry line expects the boundary it was computed for)."""
    width = width or ACROSS_WIDTH
    kinks = _line_kinks(oracle, layers, Theta, base, dirs * width, -1.0, 1.0, ENTRY_GRID)
    fresh = _fresh(layers, kinks.x, 0.5 * oracle.window(), Theta)
    if nearest and len(fresh):
        dist = np.linalg.norm(kinks.x[fresh] - base[kinks.line[fresh]], axis=1)
        order = fresh[np.lexsort((dist, kinks.line[fresh]))]
        fresh = order[np.r_[True, kinks.line[order][1:] != kinks.line[order][:-1]]]
    nrm = jump_normals(oracle, kinks.subset(fresh), rng, downstream_basis(layers))
    pool.add(nrm.x, nrm.n, nrm.error)


#: Entry lines a round for each unit still to find (:func:`.cluster.cluster_units`).
ASKS_PER_UNIT = 4
#: Half-width and points of the lines into the active side of a unit a cluster missed.
ENTRY_WIDTH = 0.5
#: Half-width and points of the lines drawn across a boundary a chain could not cross.
ACROSS_WIDTH = 1.0


def _complete(oracle, known, tent, partial, pool):
    """Complete chains that could not cross every boundary with kinks of the pool.

    A chain that never crossed units J keeps one null direction of its equations per unit
    of J (``relu(z~_j)`` or ``relu(-z~_j)``, which vanish on its side), besides the unit's
    own hyperplane. At a kink of the same unit, the equations restricted to that null space
    keep the directions of the units of J still on the chain's side, plus the hyperplane:
    one more than at a kink of another unit. Each such kink shrinks the null space; at one
    dimension the hyperplane is found."""
    if not partial or len(pool) == 0:
        return []
    P = activation_pattern([*known, tent], pool.x)
    tol, loose = _null_tol(oracle), _chain_loose(oracle)
    chains = []  # [null rows K, units todo, done] per chain, each walked through the pool in order
    for Mc, _, _, todo, _ in partial:
        K = _null_rows(Mc.reshape(-1, Mc.shape[-1]), tol, loose)
        if len(K) == len(todo) + 1:
            chains.append([K, todo, False])
    out = []
    # A kink's equations are (d + 1) x (D + 1), 5 MB at d = 784: the pool's in blocks (the
    # whole pool of a trained float32 784-64-64-10 asked for 7.6 GiB at once).
    d = pool.x.shape[1]
    block = max(1, int(COMPLETE_BYTES // (8 * (d + 1) * (tent[0].shape[0] + tent[0].shape[1] + 1))))
    for lo in range(0, len(pool), block):
        if all(c[2] for c in chains):
            break
        Mp = _constraints(known, tent, pool.x[lo : lo + block], pool.n[lo : lo + block])
        scale = np.linalg.norm(Mp, axis=(1, 2))
        for chain in chains:
            for j in range(len(Mp)):
                K, todo, done = chain
                if done:
                    break
                near = [u for u, sign in todo if P[lo + j, u] != (sign > 0)]
                if len(near) == len(todo):
                    continue  # on the chain's side of every missed boundary: tells nothing
                sv, Wt = _right_svd(Mp[j] @ K.T)
                keep = np.arange(len(sv)) >= len(sv) - _null_count(sv, scale[j], tol, loose)
                if keep.sum() != len(near) + 1:
                    continue  # another unit's kink
                K = Wt[keep] @ K
                K /= np.linalg.norm(K, axis=1, keepdims=True)
                chain[0], chain[1] = K, [(u, sign) for u, sign in todo if u in near]
                if len(K) == 1:
                    out.append(K[0] / np.linalg.norm(K[0, :-1]))
                    chain[2] = True
    return out


#: Failed steps in a row after which a chain is dropped.
STALL = 8


def _null_tol(oracle):
    """Relative singular value below which the chain's equations count as satisfied: the
    finite-difference accuracy of the normals at this precision (:meth:`Oracle.normal_tol`
    allows 30x over it)."""
    return oracle.normal_tol() / 30


def _line_kinks(oracle, layers, Theta, base, dirs, t0, t1, points):
    """Kinks on the lines ``base + t dirs``, t in [t0, t1]: in float64 only the pieces
    between computed known kinks that are not linear are searched
    (:func:`.lines.screened_kinks`); at low precision (where three outputs of a long piece
    do not tell a small bend from the rounding) on a grid of ``points`` (near_points above COARSE_DIMS)."""
    if oracle.eps < SCREEN_EPS:
        return screened_kinks(oracle, base, dirs, known_breaks(layers, Theta, base, dirs, t0, t1))
    return find_kinks(oracle, base, dirs, np.linspace(t0, t1, points), near_points=oracle.d > COARSE_DIMS)


#: Half-length (in t, for standard normal directions) of the random lines of the pool:
#: screened lines (float64) cost about one query per known boundary they cross, and the
#: hyperplanes of a first layer are crossed at most once whatever the length, so long lines
#: meet rarely switching units more often for little more (the rarest units of 64-32-32-10
#: and 100-64-64-10 are crossed by twice as many lines at 12 as at 3); grid lines (low
#: precision) keep their cells short.
REFILL_T, REFILL_T_LOW = 12.0, 3.0
#: Shortest half-length the pool's lines are cut to where the model stops answering.
MIN_REACH = 0.75
#: Points of an entry line's grid at low precision (float64 screens it, SCREEN_EPS).
ENTRY_GRID = 128


def _refill(oracle, layers, widths, rng, pool, tol, n_lines=1, Theta=None):
    """More kinks for the pool from random lines (those no known unit explains): with the
    known kinks of each line computed, only its pieces that are not linear are searched
    (:func:`.lines.screened_kinks`)."""
    d = oracle.d
    base = 0.5 * rng.standard_normal((n_lines, d))
    dirs = rng.standard_normal((n_lines, d))
    T = min(REFILL_T if oracle.eps < SCREEN_EPS else REFILL_T_LOW, oracle.line_reach)
    while True:
        try:
            kinks = _line_kinks(oracle, layers, Theta, base, dirs, -T, T, grid_size(widths))
            break
        except NonFiniteOutputs:
            # Far out the model does not answer (a classifier's logits read from saturated
            # probabilities): this and later lines stop at half the length.
            if T <= MIN_REACH:
                raise
            T = oracle.line_reach = T / 2
    fresh = _fresh(layers, kinks.x, tol, Theta)
    nrm = jump_normals(oracle, kinks.subset(fresh), rng, downstream_basis(layers))
    pool.add(nrm.x, nrm.n, nrm.error)


def _degenerate(P, n_tent, n_last):
    """Per kink pattern (rows of P over known + tentative units): flags of the units whose
    phi column leaves a null direction when they keep that sign (tentative units either
    way, as relu(z~) or relu(-z~); units of the last known layer when inactive)."""
    total = P.shape[1]
    tent = P[:, total - n_tent :]
    last = ~P[:, total - n_tent - n_last : total - n_tent]
    return tent, last


def _group(oracle, known, tent, pool, tol, delta=None):
    """Hyperplanes of units from kinks of the pool grouped by unit (no walking).

    Kinks of one unit share its hyperplane, and all satisfy the null direction of every
    unit whose phi column vanishes (or is linear) at all of them: their stacked equations
    have ``agree + 1`` null directions (agree: the tentative units with one sign throughout,
    the last known layer's units inactive throughout), one fewer when a kink of another unit
    is among them. Groups grow greedily from each kink in turn; a group whose kinks see
    every tentative unit with both signs (and every unit of the last known layer active)
    has a one-dimensional null space: the unit's hyperplane.

    With the signs of the tentative layer known (``delta``: 1 for the units to flip, from
    the units found so far), the linear term is known too: ``beta = -sum_j delta_j v_j w~_j``
    (:func:`.fit.resolve_signs`). These equations remove the null direction of a unit that
    is active (in its true orientation) throughout the group, and those of the last known
    layer; only tentative units inactive throughout still count in agree."""
    layers = [*known, tent]
    n_tent, n_last = tent[0].shape[0], (known[-1][0].shape[0] if known else 0)
    n = len(pool)
    if n < 2:
        return np.zeros((0, 0))
    M = _constraints(known, tent, pool.x, pool.n)
    M = M / np.maximum(np.linalg.norm(M, axis=2, keepdims=True), 1e-300)
    if M.shape[1] > M.shape[2]:  # each kink's rows by their triangular factor: same singular values
        M = np.linalg.qr(M, mode="r")
    T, Lz = _degenerate(activation_pattern(layers, pool.x), n_tent, n_last)
    cols = M.shape[2]
    extra_rows = _sign_rows(tent, delta, cols)[0]
    if delta is not None:
        T = T ^ delta[None, :]  # true orientation: inactive throughout is what stays degenerate

    def stack(g):
        return np.vstack([M[g].reshape(-1, cols), extra_rows])

    def first_consistent(g, cand):
        """Index in ``cand`` of the first kink whose rows leave the group's stacked equations
        with ``agree + 1`` null directions, and that agree; (None, None) if none does. The
        null space after adding kink q is that of the group restricted by q's rows: one SVD
        of the group, then one batched SVD of ``M[q] N`` for every candidate (before: one
        SVD of the whole stack per candidate, most of the time of a wide first layer)."""
        sv, Vt = _right_svd(stack(g))
        N = Vt[int((sv > tol * sv[0]).sum()) :].T  # (cols, null of the group)
        if N.shape[1] == 0:
            return None, None
        P = (M[cand].reshape(-1, cols) @ N).reshape(len(cand), -1, N.shape[1])
        rank = (svd(P, compute_uv=False) > tol * sv[0]).sum(axis=1)
        Tq = T[cand]
        if delta is not None:  # the linear term is fixed: only truly inactive units stay
            agree = ((~T[g]).all(axis=0) & ~Tq).sum(axis=1)
        else:
            on, off, lz = T[g].all(axis=0), (~T[g]).all(axis=0), Lz[g].all(axis=0)
            agree = ((on & Tq) | (off & ~Tq)).sum(axis=1) + (lz & Lz[cand]).sum(axis=1)
        hit = np.nonzero(N.shape[1] - rank == agree + 1)[0]
        return (int(hit[0]), int(agree[hit[0]])) if len(hit) else (None, None)

    found, used = [], np.zeros(n, dtype=bool)
    for seed in range(n):
        if used[seed]:
            continue
        check_deadline("while grouping kinks")
        g, agree, extra = [seed], None, 0
        cand = np.array([q for q in range(n) if q != seed and not used[q]], dtype=int)
        while len(cand):
            j, a = first_consistent(g, cand)
            if j is None:
                break
            extra += agree == 0  # kinks added once the group was determined
            g, agree, cand = g + [int(cand[j])], a, cand[j + 1 :]
        if agree == 0 and len(g) >= GROUP_MIN and extra >= GROUP_CONFIRM:
            theta = _solve(stack(g)[None], tol)
            if theta is not None:
                found.append(theta)
                used[g] = True
    return np.array(found).reshape(-1, cols)


#: Growth of the null tolerance per layer already peeled: a hyperplane found from finite
#: differences carries their error (~1e-7 relative in float64) into phi for the next layer.
NULL_GROWTH = 100.0
#: Kinks a group needs (two kinks of different units on opposite sides of every boundary
#: can pass the null-space count; a third one of the same unit is then consistent only
#: when all three are).
GROUP_MIN = 3
#: Kinks a group must gain after its null space became one-dimensional: a kink of another
#: unit can complete a group (flipping the boundaries it missed) but is then rarely
#: followed by kinks consistent with the hyperplane it produced.
GROUP_CONFIRM = 2
#: Random lines drawn per round of grouping, and rounds before the chains take over.
GROUP_LINES, GROUP_ROUNDS = 2, 25
#: Most random lines a round once the pool runs dry (doubling from GROUP_LINES).
DRY_LINES = 64


#: Largest angle between two restrictions of one unit (:func:`.cluster.cluster_units`), in
#: units of the null tolerance; at low precision LINK_LOW radians, where the null tolerance
#: is capped (float32: 1000 of it is 0.17 rad; in a diagnostic run on a float32
#: 64-32-32-10 the kinks of 21 units linked into one component of 502; same-unit angles
#: were 7e-5 in the median and 7e-3 at the 99th percentile, and at 0.01 every component was
#: one unit's).
ANGLE, LINK_LOW = 1000.0, 0.01


#: Kinks of the pool (the newest) that the grouping, quadratic in their number, looks at.
GROUP_CAP = 96


def _recent(pool, cap):
    """The newest ``cap`` kinks of the pool, as a pool."""
    if len(pool) <= cap:
        return pool
    sub = KinkPool(pool.x.shape[1])
    sub.add(pool.x[-cap:], pool.n[-cap:], pool.err[-cap:])
    return sub


def _add(Theta, found, k, tol):
    """Theta with the rows of ``found`` that are new (up to sign and scale), at most k rows."""
    for theta in found:
        if len(Theta) >= k:
            break
        cos = np.abs(Theta @ theta) / np.linalg.norm(Theta, axis=1) / np.linalg.norm(theta) if len(Theta) else [0.0]
        if np.max(cos) <= 1 - tol:
            Theta = np.vstack([Theta, theta])
    return Theta


def _signs(tent, Theta, carry=None):
    """The sign flips of the tentative layer (bool per unit) the units found so far determine
    (:func:`.fit.resolve_signs`), or None while they do not (a unit none of them reads)."""
    if carry is not None and carry.get("delta") is not None:
        return carry["delta"]  # from unfinished chains (.fit.signs_from_rows)
    if len(Theta) == 0:
        return None
    from .fit import resolve_signs

    kt = tent[0].shape[0]
    coef = Theta[:, :kt]
    if np.any(np.abs(coef).max(axis=0) < 1e-3 * np.abs(coef).max()):
        return None
    W, _, _, _, ok = resolve_signs(tent[0], tent[1], coef, Theta[:, kt:-1], Theta[:, -1])
    if not ok:
        return None
    return np.sign(np.sum(W * tent[0], axis=1)) < 0


def _unfinished_sign_rows(known, tent, unfinished, tol, loose=0.0):
    """Equations on the flips delta of the tentative layer from chains that did not cross
    every boundary (:func:`_chains`).

    Such a chain's equations keep a null direction per boundary J it never crossed, besides
    its unit's row theta: ``(e_j, -w~_j, -b~_j)`` for a tentative unit always on its
    positive side, ``e_j`` for one never on it, ``e_u`` on h for an inactive unit u of the
    last known layer. With theta_0 the part of the null space outside these directions, the
    true row is theta_0 plus some of them, and the linear term's identity
    ``beta = -sum_i delta_i v_i w~_i`` (:func:`.fit.resolve_signs`) becomes
    ``beta_0 + sum_i delta_i v_0i w~_i`` in span(w~_j, j in J; e_u): projected off that span,
    d_prev - |J| linear equations on delta per chain. Returns (rows, right-hand sides)
    pairs, one per chain whose null space has the dimension this needs."""
    Wt, bt = tent
    kt, dp = Wt.shape
    offset = sum(W.shape[0] for W, _ in known)  # unit indices count the known layers first
    n_last = known[-1][0].shape[0] if known else 0
    out = []
    for Mc, _, _, todo, _ in unfinished:
        K = _null_rows(Mc.reshape(-1, Mc.shape[-1]), tol, loose)
        if len(K) != len(todo) + 1 or len(todo) >= dp:
            continue
        D, T = [], []  # null directions on (v, beta, c), and their span on beta
        for u, sign in todo:
            j = u - offset
            if j >= 0:  # a tentative unit
                e = np.zeros(kt + dp + 1)
                e[j] = 1.0
                if sign < 0:  # always on its positive side: relu(z~_j) = z~_j there
                    e[kt : kt + dp], e[-1] = -Wt[j], -bt[j]
                D.append(e)
                T.append(Wt[j])
            else:  # an inactive unit of the last known layer: its h coordinate is free
                e = np.zeros(kt + dp + 1)
                e[kt + u - (offset - n_last)] = 1.0
                D.append(e)
                T.append(np.eye(dp)[u - (offset - n_last)])
        if D:
            Q = np.linalg.qr(np.array(D).T)[0]
            K = K - (K @ Q) @ Q.T
        theta = svd(K)[2][0]
        if not np.any(theta[:kt]):
            continue
        B, y = sign_block(theta, Wt)
        if T:
            P = np.linalg.qr(np.array(T).T)[0]
            B, y = B - P @ (P.T @ B), y - P @ (P.T @ y)
        out.append((B, y))
    return out


def _prune(pool, known, tent, Theta, tol):
    """Drop from the pool the kinks on a boundary already known: of the layers so far
    (kept over from the search of an earlier layer) or of a unit already found."""
    if len(pool) == 0:
        return
    Z, _ = pre_activations([*known, tent], pool.x)
    keep = np.min(np.hstack([np.abs(z) for z in Z]), axis=1) > tol
    if len(Theta):
        keep &= np.min(np.abs(zeta(known, tent, pool.x, Theta)), axis=1) > tol
    pool.keep(keep)


def next_layer(
    oracle, known, tent, k, widths, rng, pool, *, max_rounds=40, oriented=False, carry=None, settled=None, nearly=None
):
    """The units of the layer after ``tent`` as hyperplanes in phi-space.

    ``oriented``: every unit of ``tent`` has its true sign already (:mod:`.signs`), so the
    kinks are clustered by their restricted rows from the first round (:mod:`.cluster`),
    without the grouping by null spaces that finds the first units when signs are open.

    ``carry``: a dict kept between searches for the same layer (the units found so far
    are kept there, so a new search does not start from none).

    ``settled``: the units of ``tent`` oriented already (bool per unit); with at most
    ``hypotheses.OPEN_SIGNS`` of them open, the kinks are clustered under each choice of their signs
    (:func:`.hypotheses.sign_choices`) until the units found fix them.

    ``nearly``: with the signs known and at least this many units found from single kinks,
    the chains get NEARLY_CHAIN_ROUNDS rounds, not ``max_rounds`` (the caller draws lines
    where the outputs' fit on the units found misses before its next search: the last units
    switch on few lines, and chains from the pool's kinks rarely meet them).

    Returns (coef (k, k_tent), beta (k, k_prev), const (k,)) or None when fewer than k
    units were determined in ``max_rounds`` rounds (fewer rows where ``carry["affine"]``
    finds the rest affine in the layer below: :mod:`.affine`). Kinks explained by the layers so far
    leave the pool.
    """
    D = tent[0].shape[0] + tent[0].shape[1]
    steps = 8 + 6 * (tent[0].shape[0] + (known[-1][0].shape[0] if known else 0))
    carry = {} if carry is None else carry
    size = CLUSTER_MIN if oracle.eps < SCREEN_EPS else CLUSTER_MIN_LOW
    Theta = carry.get("Theta", np.zeros((0, D + 1)))
    for phase in range(2):
        # Grouping (signs open) or clustering (signs known) of single kinks; then chains, with open
        # signs only until the units they find fix those signs (_signs): then the clustering (once).
        Theta = _gathered(oracle, known, tent, k, widths, rng, pool, Theta, carry, oriented, size, settled)
        if len(Theta) >= k:
            break
        delta = np.zeros(tent[0].shape[0], dtype=bool) if oriented else _signs(tent, Theta, carry)
        rounds = max_rounds
        if nearly is not None and delta is not None and len(Theta) >= nearly:
            rounds = min(max_rounds, NEARLY_CHAIN_ROUNDS)
        if delta is not None and oracle.low_precision and oracle.d > COARSE_DIMS:
            rounds = min(rounds, COARSE_CHAIN_ROUNDS)  # then the next search's single kinks
        Theta = _chained(oracle, known, tent, k, widths, rng, pool, Theta, carry, steps, rounds, delta)
        if len(Theta) >= k or delta is not None or _signs(tent, Theta, carry) is None:
            break
    if len(Theta) < k and not carry.get("affine_rest"):
        return None
    kt = tent[0].shape[0]
    return Theta[:, :kt], Theta[:, kt:D], Theta[:, D]


#: Rounds of chains a search gets when it lacks only the last units and lines where the
#: outputs' fit misses come next (a trained float32 784-64-64-10 at random state 1 found
#: 63 of its 64 second-layer units from single kinks, then spent 149 s of a 236 s run on
#: 40 rounds of chains that found nothing; the next search found the last unit among the
#: kinks of those lines in 0.6 s: a diagnostic run).
NEARLY_CHAIN_ROUNDS = 2

#: Rounds of chains at low precision above COARSE_DIMS inputs once the signs of the layer
#: below are known, however many units are missing: the chains' equations, d + 1 rows a kink
#: from normals about 1e-3 off, gave no unit in any run measured (hooks on the trained float32
#: 784-128-128-10 and 784-64-64-10 of ``bench/test_bench_trained.py`` and the planted float32
#: 784-64-64-10: none in 6 to 40 rounds, 21-59 s a round of 14-32 chains at d = 784, 0.4
#: million queries a round of 32), where the next search's single kinks found the units
#: left. The planted 784-64-64-10 at seed 1 under OpenBLAS's Haswell kernels, whose first
#: layer lacked a unit, ran 40 rounds of them (over 12 minutes). As many as
#: NEARLY_CHAIN_ROUNDS, not none: a search with fewer rounds draws other lines after, and
#: the trained float32 784-128-128-10 at random state 0 then took 16.7 million queries
#: instead of 14.3 (both exact).
COARSE_CHAIN_ROUNDS = NEARLY_CHAIN_ROUNDS


def _gathered(oracle, known, tent, k, widths, rng, pool, Theta, carry, oriented, size, settled=None):
    """Units (rows of Theta) from single kinks of random lines: grouped by null spaces while
    the signs of ``tent`` are open, clustered by restricted rows once they are known (or
    under each choice for the few the wiggles left open, :func:`.hypotheses.sign_choices`)."""
    layers = [*known, tent]
    tol = 0.5 * oracle.window()
    lines = GROUP_LINES
    # A group needs several kinks of one unit among the GROUP_CAP newest of the pool: with
    # more units than GROUP_CAP / GROUP_SHARE the grouping finds none (the trained digits
    # 64-100-100-10 spent most of its budget there) and a few rounds fill the pool for the
    # chains.
    low = oracle.low_precision
    hyps = sign_choices(settled) if low and not oriented else []
    angle = min(ANGLE * _null_tol(oracle), LINK_LOW) if low else ANGLE * _null_tol(oracle)
    many = GROUP_SHARE * k > GROUP_CAP
    rounds = GROUP_ROUNDS if oriented or hyps or _signs(tent, Theta, carry) is not None or not many else 2
    for _ in range(rounds):
        _refill(oracle, layers, widths, rng, pool, tol, lines, Theta)
        _prune(pool, known, tent, Theta, tol)
        # While the pool is dry the units left switch on few lines (3% of them at
        # 100-64-64-10): more lines a round; back down once kinks come (their entry lines
        # find the rest).
        lines = min(2 * lines, DRY_LINES) if len(pool) == 0 else max(GROUP_LINES, lines // 2)
        ntol = _null_tol(oracle) * NULL_GROWTH ** len(known)
        delta = np.zeros(tent[0].shape[0], dtype=bool) if oriented else _signs(tent, Theta, carry)
        deltas = [delta] if delta is not None else hyps
        hold = None  # rows of found verified already
        if deltas:
            memo = carry.setdefault("restrictions", {})  # restricted rows of kinks seen before
            cap = max(1, (ASKS_PER_UNIT * (k - len(Theta)) + 8) // len(deltas))
            parts = []
            for flip in deltas:
                rows, asks = cluster_units(
                    known, tent, flip, pool.x, pool.n, ntol, angle, rng, cap, size, low, cache=memo
                )
                parts.append(rows)
                if asks:
                    base, dirs = np.array([a for a, _ in asks]), np.array([u for _, u in asks])
                    _search(oracle, layers, base, dirs, rng, pool, ENTRY_WIDTH, Theta, nearest=True)
            found = np.vstack(parts)
            if delta is None:  # rows under each choice of the open signs: the choice whose rows hold
                found, hold = chosen_choice(oracle, known, tent, hyps, parts, rng, carry, tol)
        else:
            found = _group(oracle, known, tent, _recent(pool, GROUP_CAP), ntol, delta)
        if len(found):
            hold = verified(oracle, known, tent, found, rng, carry, tol) if hold is None else hold
            Theta = carry["Theta"] = _add(Theta, found[hold], k, tol)
        if "outfit" in carry:  # the last hidden layer's last units from the outputs (.outfit)
            Theta = carry["outfit"](Theta)
        if len(Theta) >= k:
            break
    return Theta


#: Kinks of the grouping's pool a unit of the next layer needs on average (see _gathered).
GROUP_SHARE = 2

#: Chains a round while the signs of the tentative layer are open (a few units fix them),
#: and at most once they are known (two a unit still missing up to that: the trained
#: diabetes 10-100-100-1, whose single kinks see more first-layer units active than d and
#: give no unit, waited for a pool of 200 kinks and refilled it one line a round until its
#: query budget ran out).
SIGN_CHAINS, CHAIN_CAP = 6, 32


def _affine_rest(Theta, carry):
    """Whether the units not found are affine in the layer below (``carry["affine"]``, the
    last hidden layer in float64: :func:`.affine.explained`), tested once for each number of
    units found; sets ``carry["affine_rest"]``."""
    test = carry.get("affine")
    if test is not None and len(Theta) and carry.get("affine_tested") != len(Theta):
        carry["affine_tested"] = len(Theta)
        carry["affine_rest"] = bool(test(Theta))
    return bool(carry.get("affine_rest"))


def _chained(oracle, known, tent, k, widths, rng, pool, Theta, carry, steps, max_rounds, delta):
    """Units (rows of Theta) from chains of kinks following each boundary (:func:`_chains`);
    while the signs of ``tent`` are open (``delta`` None), few chains a round, and only
    until the units found fix the signs."""
    signs_open = delta is None
    layers = [*known, tent]
    tol = 0.5 * oracle.window()
    rows: list = []  # sign equations of unfinished chains (_unfinished_sign_rows)
    loose, lines = _chain_loose(oracle), 1
    seeds: list = []  # the last round's open chains (as _chains returns them), to go on
    for _ in range(max_rounds):
        if not signs_open and _affine_rest(Theta, carry):
            break
        _prune(pool, known, tent, Theta, tol)
        want = 2 * (k - len(Theta))
        capped = want > CHAIN_CAP and not signs_open
        want = min(want, SIGN_CHAINS if signs_open else CHAIN_CAP)
        if len(pool) + len(seeds) < want:
            _refill(oracle, layers, widths, rng, pool, tol, lines, Theta=Theta)
            if not capped or len(pool) + len(seeds) < CHAIN_CAP // 4:
                # Many units missing (a capped round): more lines while the pool stays short,
                # and chains from what it holds once it has a quarter of them.
                lines = min(2 * lines, DRY_LINES) if capped else lines
                continue
        seeds = seeds[:want]
        pick = rng.choice(len(pool), size=min(want - len(seeds), len(pool)), replace=False)
        X0 = np.vstack([pool.x[pick], *[u[1][None] for u in seeds]])
        N0 = np.vstack([pool.n[pick], *[u[2][None] for u in seeds]])
        carried = [None] * len(pick) + [(u[0], u[4]) for u in seeds]
        found, unfinished = _chains(oracle, known, tent, X0, N0, rng, steps, delta, carried)
        pool.keep(np.setdiff1d(np.arange(len(pool)), pick))
        seeds = []
        if signs_open:
            rows.extend(_unfinished_sign_rows(known, tent, unfinished, _null_tol(oracle), loose))
            fixed = signs_from_rows(tent, Theta, rows)
            if fixed is not None:
                carry["delta"] = fixed
                break
        partial = [u for u in unfinished if len(u[3]) <= PARTIAL]  # completed from the pool
        if partial:
            _across(oracle, layers, partial, rng, pool)
        extra = _complete(oracle, known, tent, partial, pool)
        if loose and not signs_open:  # pairs of chains of one unit that each left directions open
            nulls = [_null_rows(u[0].reshape(-1, u[0].shape[-1]), _null_tol(oracle), loose) for u in unfinished]
            extra = [*extra, *merged_rows(carry.setdefault("open_chains", []), nulls)]
            if capped:  # they go on from their last kinks (just past a known boundary: _prune would
                # drop them), their equations kept (going on with only those that crossed new
                # boundaries in the round left the pool short: 14 units instead of 26 by 1.2 million
                # queries on the diabetes 10-100-100-1, a diagnostic run with its signs given)
                seeds = unfinished
        if extra:
            found = np.vstack([found, extra]) if found is not None else np.array(extra)
        if found is None:
            continue
        Theta = carry["Theta"] = _add(Theta, found[verified(oracle, known, tent, found, rng, carry, tol)], k, tol)
        if len(Theta) >= k or (signs_open and _signs(tent, Theta, carry) is not None):
            break
    return Theta
