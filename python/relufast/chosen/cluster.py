"""Units of a deeper layer from kinks clustered by their restricted rows (signs known).

Once the signs of the tentative layer l+1 are known (:func:`.deep._signs`), the features of
the next layer are ``h_{l+1} = relu(z_{l+1})`` and a unit u of layer l+2 is ``z_u = v . h_{l+1}
+ c`` with no linear term. At a kink x_p of u with measured normal n_p (:mod:`.hyperplanes`)
only the units S_p of layer l+1 active at x_p enter: ``A_{p,S}^T v_S`` is parallel to n_p
(``A_p = d h_{l+1} / dx``, known) and ``h_S(x_p) . v_S + c = 0``. When these d + 1 equations
in the |S_p| + 1 unknowns have a one-dimensional null space, the kink alone gives u's row
restricted to S_p, up to scale (the restriction of [RK20] Sec. 4 and [CJM20] Sec. 5 to one
activation region; relufast's own batched form).

Two kinks of the same unit give restrictions parallel on their common coordinates; kinks of
different units do not. Kinks are linked when they share at least MIN_OVERLAP units of layer
l+1 and agree there; each linked component is one unit, whose full row is the null vector of
all its kinks' equations stacked (one-dimensional once the active sets of its kinks cover
every unit of layer l+1). All pairs are compared in one matrix product, no SVD per pair.

References
----------
.. [CJM20] N. Carlini, M. Jagielski, I. Mironov, "Cryptanalytic Extraction of Neural Network
   Models", CRYPTO 2020.
.. [RK20] D. Rolnick, K. Kording, "Reverse-Engineering Deep ReLU Networks", ICML 2020.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .._blas import thread_map
from .net import active_jacobian, features, pre_activations, preact_jacobians
from .nullspace import svd

__all__ = ["signed", "cluster_units", "to_phi"]

#: Units of layer l+1 two kinks must both see active to be compared.
MIN_OVERLAP = 2
#: Kinks a component needs before its stacked equations are solved (or entry lines asked
#: for), float64 and low precision. In float64 one: a unit active on 0.1% of Gaussian
#: inputs (planted 100-64-64-10) leaves a kink on few random lines; waiting for three
#: linked ones spent the 2 million queries of its budget, while a wrong row from a lone kink is rejected
#: by the verification of :func:`.deep.next_layer`. In float32 a lone kink's row (normals
#: ~1e-4 off) fails that verification round after round: three.
CLUSTER_MIN, CLUSTER_MIN_LOW = 1, 3


def signed(tent, flip):
    """The tentative layer with the units of ``flip`` negated (their true orientation)."""
    s = np.where(flip, -1.0, 1.0)
    return tent[0] * s[:, None], tent[1] * s


def to_phi(tent, flip, rows):
    """Rows ``(v, c)`` on ``[relu(z_{l+1}), 1]`` (true signs) as rows on ``[phi, 1]`` of the
    tentative layer (:func:`.net.features`): ``relu(-z~) = relu(z~) - z~``."""
    Wt, bt = tent
    kt = Wt.shape[0]
    v, c = rows[:, :kt], rows[:, -1]
    vf = v * flip[None, :]
    beta = -vf @ Wt
    const = c - vf @ bt
    return np.hstack([v, beta, const[:, None]])


def _equations(known, true_tent, x, n):
    """Equations (K, min(k, d) + 2, k + 1) on (v, c) at kinks x with normals n, and the active sets.

    ``(I - n n^T) A^T v = 0`` (A = d h_{l+1} / dx, (k, d)) in k + 1 rows instead of d: with
    ``A^T = Q R`` (Q (d, k) orthonormal) and ``n = Q m + n_perp``, it is
    ``(I - m m^T) R v = 0`` and ``|n_perp| m^T R v = 0`` (the same singular values; at
    d = 784 the d-row form took 17.7 GiB for 3,567 kinks). Batched in FD-sized blocks, side by
    side on the method's threads."""
    kt = true_tent[0].shape[0]
    layers = [*known, true_tent]
    K, d = x.shape
    r = min(kt, d)  # rank bound of A
    E = np.zeros((K, r + 2, kt + 1))
    S = np.zeros((K, kt), dtype=bool)
    step = max(1, int(EQUATION_BYTES // (8 * kt * d)))
    if not known:  # A^T = W~^T diag(active): one QR of W~^T for every kink
        Q0, R0 = np.linalg.qr(true_tent[0].T)

    def block(lo):  # the blocks side by side on the method's threads (each writes its own rows)
        sl = slice(lo, min(K, lo + step))
        Z, _ = pre_activations(layers, x[sl])
        act = Z[-1] > 0
        if known:
            A = act[:, :, None] * preact_jacobians(layers, x[sl])[-1]  # (c, k, d), d relu(z) / dx
            Q, R = np.linalg.qr(np.swapaxes(A, 1, 2))  # (c, d, r), (c, r, k)
        else:
            Q, R = np.broadcast_to(Q0, (len(act), *Q0.shape)), R0[None] * act[:, None, :]
        m = np.einsum("cdk,cd->ck", Q, n[sl])
        perp = np.sqrt(np.maximum(0.0, 1.0 - np.einsum("ck,ck->c", m, m)))
        mR = np.einsum("ck,ckj->cj", m, R)
        T = np.concatenate([R - m[:, :, None] * mR[:, None, :], (perp[:, None] * mR)[:, None, :]], axis=1)
        T /= np.maximum(np.linalg.norm(T, axis=(1, 2), keepdims=True), 1e-300)
        pt = np.concatenate([np.maximum(Z[-1], 0.0), np.ones((len(act), 1))], axis=1)
        pt /= np.linalg.norm(pt, axis=1, keepdims=True)
        E[sl, : r + 1, :kt] = T
        E[sl, r + 1] = pt
        S[sl] = act

    thread_map(block, range(0, K, step))
    return E, S


#: Memory of one block of Jacobians in :func:`_equations` (bytes).
EQUATION_BYTES = 64 * 2**20


def _restrictions(E, S, tol, ratio=False, cache=None):
    """Per kink the normalised restricted row (zeros off S and NaN rows where the kink does
    not determine it: a null space of another dimension). ``ratio`` (low precision): the
    second smallest singular value may instead stand GAP times above the smallest and
    GAP_LOW times above the tolerance.

    ``cache``: a dict of the rows computed before, by a digest of the kink's equations and
    active set (a search clusters the pool again each round; 2,048 of the 3,263 kinks of a
    trained float32 784-64-64-10's second layer had been seen before, ad-hoc count)."""
    K, _, cols = E.shape
    R = np.full((K, cols), np.nan)
    keys: list = [None] * K
    todo = []
    for p in range(K):
        if cache is not None:
            keys[p] = (hashlib.blake2b(E[p].tobytes() + S[p].tobytes(), digest_size=16).digest(), tol, ratio)
            if keys[p] in cache:
                R[p] = cache[keys[p]]
                continue
        todo.append(p)
    # The kinks not seen before in RESTRICTION_PARTS pieces side by side on the method's
    # threads (an SVD a kink, each its own: the same rows on any number of threads).
    c = max(1, -(-len(todo) // RESTRICTION_PARTS))

    def piece(lo):
        for p in todo[lo : lo + c]:
            R[p] = _restriction(E[p], S[p], tol, ratio)

    thread_map(piece, range(0, len(todo), c))
    if cache is not None:
        for p in todo:
            cache[keys[p]] = R[p].copy()
    return R


#: Pieces of :func:`_restrictions`' kinks (the SVDs of a trained float32 784-128-128-10's
#: second layer took 12 s of its main thread, one after another).
RESTRICTION_PARTS = 4


def _restriction(Ep, Sp, tol, ratio):
    """:func:`_restrictions` for one kink (equations Ep, active set Sp)."""
    cols = Ep.shape[1]
    row = np.full(cols, np.nan)
    idx = np.append(np.nonzero(Sp)[0], cols - 1)
    if len(idx) < 2:
        return row
    _, s, Vt = svd(Ep[:, idx], full_matrices=True)
    s = np.concatenate([s, np.zeros(len(idx) - len(s))])
    gap = len(s) < 2 or s[-2] > GAP * tol * s[0]
    gap = gap or (ratio and s[-2] > GAP * s[-1] and s[-2] > GAP_LOW * tol * s[0])
    if s[-1] <= tol * s[0] and gap:
        row[:] = 0.0
        row[idx] = Vt[-1] * np.sign(Vt[-1, -1] if Vt[-1, -1] != 0 else 1.0)
    return row


#: The second smallest singular value of a kink's restricted equations must exceed GAP
#: times the null tolerance; at low precision, or GAP times the smallest and GAP_LOW times
#: the tolerance. Of 15 kinks of the trained float32 784-128-128-10's missing second-layer
#: units whose restricted rows were within 0.01 rad (ad-hoc replay), 5 passed the first test, 14 either
#: (second singular values 0.007-0.026 of the largest, 100-2,000 times the smallest);
#: a full gap of 10 x tolerance let in more kinks of bad normals (a first search of 121
#: units instead of 124, ad-hoc).
GAP, GAP_LOW = 100.0, 10.0


def _components(adj):
    """Connected components (lists of indices) of a boolean adjacency matrix."""
    n = len(adj)
    label = -np.ones(n, dtype=int)
    comps: list = []
    for s in range(n):
        if label[s] >= 0:
            continue
        stack, comp = [s], []
        label[s] = len(comps)
        while stack:
            i = stack.pop()
            comp.append(i)
            for j in np.nonzero(adj[i] & (label < 0))[0]:
                label[j] = len(comps)
                stack.append(j)
        comps.append(comp)
    return comps


def _split(E, S, adj, comp, tol, ratio=False):
    """The row of a component whose stacked equations have no null vector (kinks of two
    units joined by one false link): the closed neighbourhood of one of its best-linked
    kinks (SPLIT_TRIES of them, by degree) that covers every unit and has a null vector."""
    comp = np.asarray(comp)
    sub = adj[np.ix_(comp, comp)]
    for i in np.argsort(-sub.sum(axis=1))[:SPLIT_TRIES]:
        hood = comp[np.append(np.nonzero(sub[i])[0], i)]
        if len(hood) >= CLUSTER_MIN and S[hood].any(axis=0).all():
            row = _null_row(E[hood], tol, ratio)
            if row is not None:
                return row
    return None


#: Best-linked kinks of a failed component whose neighbourhoods are tried.
SPLIT_TRIES = 6


def _null_row(E, tol, ratio=False):
    """The null vector of stacked equations E when it is one-dimensional with a clear gap.
    ``ratio`` (low precision): the smallest singular value may instead be up to LOOSE times
    the tolerance where the second smallest stands GAP times above it, or within the
    tolerance where the second stands ROW_GAP_LOW times the tolerance above it."""
    R = E.reshape(-1, E.shape[-1])
    _, s, Vt = svd(R, full_matrices=False)
    if len(s) < R.shape[1]:
        return None
    if s[-1] <= tol * s[0] and s[-2] > GAP * tol * s[0]:
        return Vt[-1]
    if ratio and s[-1] <= LOOSE * tol * s[0] and s[-2] > GAP * s[-1]:
        return Vt[-1]
    if ratio and s[-1] <= tol * s[0] and s[-2] > ROW_GAP_LOW * tol * s[0]:
        return Vt[-1]
    return None


#: How far above the null tolerance the smallest singular value of a component's stacked
#: equations may lie at low precision when the next one stands GAP times above it. A weak
#: second-layer unit of a trained float32 784-64-64-10 (output weights 0.2, active on 3% of
#: Gaussian inputs) has normals 4e-4 to 2e-3 rad off: its 19 linked kinks stacked gave
#: 1.74e-4 of the largest against a tolerance of 1.67e-4, the next 0.057, and the row 5.6e-4
#: off; the search went on for minutes without it (ad-hoc replay against the weights).
LOOSE = 10.0


#: At low precision, a smallest singular value within the tolerance makes a row where the
#: next stands this many times the tolerance above it (GAP in float64; the row is verified
#: against the model before it is taken). The 135 linked kinks of a trained float32
#: 784-128-128-10's last second-layer unit (active on 0.4% of Gaussian inputs, normals 1e-3
#: to 3.5e-3 rad off) stacked gave 1.45e-4 of the largest against a tolerance of 1.67e-4,
#: the next 1.14e-2 (68 times the tolerance), and a row within 2e-7 of the true one; the
#: search ended `failed` with them in its pool (ad-hoc replay against the weights).
ROW_GAP_LOW = 30.0


def _outliers(ang):
    """Kinks of a component (pairwise angles ``ang`` between their restrictions, NaN where
    they share too few units) whose median angle to the others exceeds OUTLIER times the
    component's typical one (and OUTLIER_FLOOR radians)."""
    with np.errstate(invalid="ignore"):
        A = np.where(np.eye(len(ang), dtype=bool), np.nan, ang)
        med = np.nanmedian(A, axis=1) if len(ang) > 1 else np.zeros(len(ang))
    med = np.nan_to_num(med, nan=0.0)
    return med > max(OUTLIER * np.median(med), OUTLIER_FLOOR)


#: A kink's median angle to the rest of its component, over the component's median of
#: these, above which it is dropped at low precision; and the floor (radians). On a
#: float32 64-32-32-10 (a diagnostic run against its weights), a unit's kinks agreed
#: within 1e-4 but one in 6 to 40 had a normal 4e-3 to 1e-2 off: the stacked equations had
#: no null vector (smallest singular values 1.5e-4 to 5e-4 of the largest, tolerance
#: 1.7e-4) and 1e-5 to 4e-5 without it.
OUTLIER, OUTLIER_FLOOR = 4.0, 1e-3


def cluster_units(
    known, tent, flip, x, n, tol, angle, rng, max_asks=None, min_size=CLUSTER_MIN, trim=False, cache=None
):
    """Rows (on ``[phi, 1]`` of the tentative layer, :func:`to_phi`) of the units whose kinks
    among (x, n) form a linked component covering every unit of the tentative layer.

    Parameters
    ----------
    known : list of (W, b)
    tent : (W~, b~)
        Tentative layer; ``flip`` (bool per unit) gives its true orientation.
    x, n : ndarray of shape (K, d)
        Kinks not explained by any known unit and their normals.
    tol : float
        Relative singular value below which equations count as satisfied.
    angle : float
        Largest angle between two restrictions of one unit on their common coordinates.
    rng : numpy Generator
    max_asks : int or None
        Most entry lines asked for (components in random order).
    min_size : int
        Kinks a component needs (CLUSTER_MIN, or CLUSTER_MIN_LOW at low precision).
    trim : bool
        Drop the kinks whose restrictions stand apart from the rest of their component
        (low precision, :func:`_outliers`).
    cache : dict or None
        Restricted rows of kinks seen before (:func:`_restrictions`; the caller keeps it
        for one tentative layer: a row of k + 1 numbers a kink).

    Returns (rows, asks): asks are (kink, normal, unit) triples of components some unit of
    the tentative layer was never active at (:func:`_nearest_kinks`).
    """
    true_tent = signed(tent, flip)
    kt = tent[0].shape[0]
    if len(x) == 0 or (len(x) < min_size and not (trim and SMALL_ASKS)):
        return np.zeros((0, kt + tent[0].shape[1] + 1)), []
    E, S = _equations(known, true_tent, x, n)
    R = _restrictions(E, S, tol, ratio=trim, cache=cache)
    det = np.nonzero(np.isfinite(R[:, 0]))[0]
    R, M = R[det], np.hstack([S[det], np.ones((len(det), 1), dtype=bool)]).astype(float)
    R2 = R**2
    dot = R @ R.T
    na, nb = R2 @ M.T, M @ R2.T  # |r_p|^2 on q's set, |r_q|^2 on p's set
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.abs(dot) / np.sqrt(na * nb)
    overlap = M[:, :-1] @ M[:, :-1].T
    adj = (overlap >= MIN_OVERLAP) & (cos >= np.cos(angle))
    np.fill_diagonal(adj, False)
    rows, asks, pending, small = [], [], [], []
    for comp in _components(adj):
        if trim and len(comp) > min_size:
            with np.errstate(invalid="ignore"):
                ang = np.arccos(np.clip(cos[np.ix_(comp, comp)], -1.0, 1.0))
            comp = list(np.asarray(comp)[~_outliers(ang)])
        members = det[comp]
        missing = np.nonzero(~S[members].any(axis=0))[0]
        if len(comp) < min_size:
            # Too few kinks for a row at low precision, but their entry lines may still
            # bring the kinks (a rarely active unit leaves one kink a round: SMALL_ASKS).
            if trim and len(missing) and SMALL_ASKS:
                small.append((len(missing), -len(members), members, missing))
            continue
        if len(missing):
            pending.append((len(missing), -len(members), members, missing))
            continue
        row = _null_row(E[members], tol, trim)
        if row is None:  # a false link joined two units: try the neighbourhoods of its hubs
            row = _split(E[det], S[det], adj, comp, tol, trim)
        if row is not None:
            rows.append(row / np.linalg.norm(row[:-1]))
    # Entry lines for components in random order, at most max_asks lines a round: early on
    # most components miss most units (784-128-128-10 asked for 5,439 lines of 128 points
    # in its first round); a fixed order (fewest units missed first) asked for the
    # same component round after round while another unit waited (10-15-15-1).
    order = [pending[i] for i in rng.permutation(len(pending))]
    if not pending:
        order += [small[i] for i in rng.permutation(len(small))]
    for _, _, members, missing in order:
        if max_asks is not None and len(asks) >= max_asks:
            break
        asks.extend(_entry_lines(known, true_tent, E[members], x[members], missing, tol, rng, trim))
    if not rows:
        return np.zeros((0, kt + tent[0].shape[1] + 1)), asks
    return to_phi(tent, flip, np.array(rows)), asks


def _partial_row(E, missing, tol, ratio=False):
    """The row of a component restricted to the units it saw active (zero on ``missing``):
    its equations keep one null direction per missing unit besides it. None otherwise.
    ``ratio`` (low precision): the last of those directions may stand up to LOOSE times the
    tolerance where the next one stands PARTIAL_GAP times above it (and the tolerance)."""
    R = E.reshape(-1, E.shape[-1])
    # Tall (many kinks): the reduced SVD has every right singular vector, and no U of
    # (rows x rows) (a full one took 61 s of 226 at 784-128-128-10).
    _, s, Vt = svd(R, full_matrices=R.shape[0] < R.shape[1])
    s = np.concatenate([s, np.zeros(Vt.shape[0] - len(s))])
    want = len(missing) + 1
    K = Vt[s <= tol * s[0]]
    if len(K) != want and ratio and want < len(s):
        # The unit's own direction comes from the measured normals, the missing units'
        # from exact zeros: a float32 784-128-128-10's last second-layer unit (active on
        # 0.5% of Gaussian inputs) had 12 linked kinks missing 52 first-layer units, its
        # own direction at 2.06e-4 of the largest against a tolerance of 1.67e-4, the next
        # at 2.43e-2; the row was never asked for and the search ended `failed` (ad-hoc
        # replay against the weights).
        if s[-want] <= LOOSE * tol * s[0] and s[-want - 1] > PARTIAL_GAP * max(s[-want], tol * s[0]):
            K = Vt[-want:]
    if len(K) != want:
        return None
    _, _, Ct = svd(K[:, missing].T, full_matrices=True)
    theta = Ct[-1] @ K
    return theta / np.linalg.norm(theta)


#: At low precision, how far above the last of a partial row's null directions (or the
#: tolerance) the next must stand. A partial row only draws entry lines (a wrong one costs
#: their queries; the rows they lead to are verified), so an order of magnitude: the same
#: network's unit at random state 0 with the affine normals of 2026-11-29 had 8 linked kinks
#: missing 57 first-layer units, its own direction at 3.3e-4 of the largest (tolerance
#: 1.67e-4), the next at 1.07e-2 (32 times above), and the search ended `failed` at
#: GAP (ad-hoc replay against the weights).
PARTIAL_GAP = 10.0


def _entry_lines(known, true_tent, E, x, missing, tol, rng, ratio=False):
    """Lines (base, direction) that cross a unit's boundary just inside the active side of
    each unit j it was never seen active with.

    Where z_j <= 0 the unit is ``theta0 . h + c`` with theta0 its partial row
    (:func:`_partial_row`), known; its boundary enters the side z_j > 0 at points where
    both theta0 . h + c and z_j vanish, found by Newton steps from the component's kink
    nearest to z_j = 0 (computed, no query). A short line just past such a point, across
    the boundary, meets it there (at a distance set by the unknown coefficient v_j)."""
    theta = _partial_row(E, missing, tol, ratio)
    if theta is None:
        return []
    layers = [*known, true_tent]
    kt = true_tent[0].shape[0]

    def newton(y, j):
        for _ in range(NEWTON):  # exact in one step within a linear region
            Phi, Z = features(known, true_tent, y[None])
            r = np.array([Z[-1][0, j], Phi[0, :kt] @ theta[:kt] + theta[-1]])
            Jz = preact_jacobians(layers, y[None])[-1][0]
            g = np.stack([Jz[j], (theta[:kt] * (Z[-1][0] > 0)) @ Jz])
            if np.abs(r).max() <= 1e-13 * (1.0 + np.abs(y).max()):
                break
            y = y - np.linalg.pinv(g) @ r
        Phi, Z = features(known, true_tent, y[None])
        res = max(abs(Z[-1][0, j]), abs(Phi[0, :kt] @ theta[:kt] + theta[-1]))
        return y, g, res <= 1e-9

    out = []
    # Every missed unit's pre-activation and gradient at the component's kinks, computed
    # once, not once per missed unit (3.1 -> 2.7 s of a trained float32 784-64-64-10).
    Jz, Zl = preact_jacobians(layers, x)[-1], features(known, true_tent, x)[1][-1]
    for j in missing:
        z, zj = Jz[:, j], Zl[:, j]
        order = np.argsort(np.abs(zj) / np.maximum(np.linalg.norm(z, axis=1), 1e-300))
        for p in order[:ENTRY_POINTS]:
            y, g, ok = newton(x[p].copy(), j)
            if ok:  # a random step along the intersection spreads the entry points
                t = rng.standard_normal(len(y))
                t -= np.linalg.pinv(g) @ (g @ t)
                y2, _, ok2 = newton(y + ENTRY_SPREAD * t / max(np.linalg.norm(t), 1e-300), j)
                y = y2 if ok2 else y
            if not ok:
                continue
            gj = preact_jacobians(layers, y[None])[-1][0, j]
            gj = gj / np.linalg.norm(gj)
            base = y + ENTRY_STEP * gj
            grad = theta[:kt] @ active_jacobian(layers, base[None])[0]
            m = grad - (grad @ gj) * gj
            if np.linalg.norm(m) > 0:
                out.append((base, m / np.linalg.norm(m)))
    return out


#: At low precision, components with fewer kinks than a row needs also ask for entry lines
#: in a round where no other component asks. A trained float32 784-128-128-10's last
#: units are active on 0.39% and 2.1% of inputs: at its ninth round of residual lines the
#: first had one kink, seeing 64 of the 128 units below, and nothing asked; its 64 entry
#: lines crossed its boundary 33 times and raised that to 100 (ad-hoc replay against the
#: module's weights). Planted float32 10-15-15-1, 64-32-32-10, 200-32-32-10 and
#: 100-64-64-10 at seeds 0 and 1 (``bench/chosen_once.py``): all exact, 7.23 million
#: queries in all instead of 7.91 (per run -40% to +23%); asked for alongside the others,
#: they cost the 10-15-15-1 at seed 0 its run (``failed`` after 2 million queries).
SMALL_ASKS = True

#: Entry points per missed unit, and the length of the random step that spreads them.
ENTRY_POINTS, ENTRY_SPREAD = 3, 0.3
#: Newton steps to a point where a unit's boundary meets the boundary of a unit it missed.
NEWTON = 12
#: How far past that point, into the missed unit's active side, the line is drawn.
ENTRY_STEP = 0.01
