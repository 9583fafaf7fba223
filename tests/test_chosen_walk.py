"""Following a deeper unit's boundary past a known one (chosen queries, :mod:`relufast.chosen.deep`):
the step with a computed normal, the chains once the signs are known, and a first layer
wider than the input."""

import warnings

import numpy as np
import pytest

import relufast as rf
from relufast.chosen import deep, fit, walk
from relufast.chosen.oracle import Oracle


def _true_unit(hidden, r):
    """Pre-activation of unit r of the second layer and its gradient, from the true weights."""
    (W1, b1), (W2, b2) = hidden[:2]

    def z(X):
        return np.maximum(X @ W1.T + b1, 0) @ W2[r] + b2[r]

    def grad(X):
        return ((X @ W1.T + b1 > 0) * W2[r]) @ W1

    return z, grad


def _boundary_points(z, d, n, rng):
    """Points where z changes sign on random lines (bisection on the true network)."""
    out = []
    while len(out) < n:
        a, u = 0.5 * rng.standard_normal(d), rng.standard_normal(d)
        t = np.linspace(-3, 3, 601)
        v = z(a + t[:, None] * u)
        ch = np.nonzero(np.sign(v[:-1]) != np.sign(v[1:]))[0]
        if len(ch) == 0:
            continue
        lo, hi = t[ch[0]], t[ch[0] + 1]
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if np.sign(z((a + mid * u)[None])[0]) == np.sign(v[ch[0]]) else (lo, mid)
        out.append(a + 0.5 * (lo + hi) * u)
    return np.array(out)


@pytest.mark.parametrize("seed", [0, 1])
def test_screened_step_stays_on_the_boundary_with_the_right_normal(seed):
    """The computed normal of a step (no finite differences) is that of the model's boundary
    at the new kink, to 1e-9, and the new kink lies on the boundary followed (a kink of
    another unit would fail the check line); fewer queries a chain-step than a measured
    step's window alone."""
    d, widths = 10, (20, 10)
    hidden, out = rf.planted.deep_relu(d, widths, 1, random_state=seed)
    oracle = Oracle(rf.planted.relu_function(hidden, out), d)
    rng = np.random.default_rng(seed)
    flip = rng.random(widths[0]) < 0.5  # the tentative layer: signs open
    s = np.where(flip, -1.0, 1.0)
    tent = (hidden[0][0] * s[:, None], hidden[0][1] * s)
    moved = 0
    spent = {"queries": 0, "chain_steps": 0}
    for r in range(widths[1]):
        z, grad = _true_unit(hidden, r)
        try:
            X = _boundary_points(z, d, 4, np.random.default_rng(r))
        except ValueError:
            continue
        G = grad(X)
        N = G / np.linalg.norm(G, axis=1, keepdims=True)
        q = oracle.n_queries
        Xn, Nn, ok = walk.walk_step(oracle, [], tent, X, N, [(-1, 0)] * len(X), rng)
        spent["queries"] += oracle.n_queries - q
        spent["chain_steps"] += len(X)
        for c in np.nonzero(ok)[0]:
            g = grad(Xn[c : c + 1])[0]
            assert abs(z(Xn[c : c + 1])[0]) <= 1e-9 * np.linalg.norm(g)
            assert 1 - abs(Nn[c] @ g) / np.linalg.norm(g) <= 1e-9
            assert not np.allclose(Xn[c], X[c])
            moved += 1
    assert moved >= 10
    # Under the 48-point window alone of a step that measures its normal (which adds
    # 2 (d + 1) = 22 queries).
    assert spent["queries"] / spent["chain_steps"] < 48


def test_chain_targets_with_known_signs_are_the_units_never_truly_active():
    """With the signs known, a chain has only to see each unit active in its true
    orientation (the linear term is fixed); with them open, each unit on both sides."""
    pats = [np.array([True, False, True, False]), np.array([True, False, False, False])]
    open_ = deep._targets(pats, 4, 0)
    assert sorted(open_) == [(0, -1), (1, 1), (3, 1)]
    delta = np.array([False, True, False, False])  # unit 1 truly active where z~ < 0
    known = deep._targets(pats, 4, 0, delta)
    assert sorted(known) == [(3, 1)]


def test_sign_rows_hold_for_the_linear_term_of_known_flips():
    """The rows fixed by known signs vanish on (v, beta, c) with beta = -sum_j delta_j v_j w~_j
    and not on a different linear term."""
    rng = np.random.default_rng(3)
    Wt, bt = rng.standard_normal((6, 4)), rng.standard_normal(6)
    delta = np.array([1, 0, 1, 0, 0, 1], dtype=bool)
    v = rng.standard_normal(6)
    beta = -(delta * v) @ Wt
    R = deep._sign_rows((Wt, bt), delta, 6 + 4 + 1)[0]
    assert np.abs(R @ np.r_[v, beta, 0.7]).max() <= 1e-12
    assert np.abs(R @ np.r_[v, beta + 0.1, 0.7]).max() > 1e-3
    assert deep._sign_rows((Wt, bt), None, 11).shape == (1, 0, 11)


def test_first_layer_wider_than_the_input_in_a_deep_network():
    """10-20-10-1 (the first layer twice the input: no wiggle settles its signs): exact; the
    code before this change took 925,009 queries here (random_state 0)."""
    hidden, out = rf.planted.deep_relu(10, (20, 10), 1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        res = rf.extract(rf.planted.relu_function(hidden, out), 10, n_hidden=(20, 10), queries="chosen", random_state=0)
    assert res.status.value == "exact"
    assert res.counts["queries"] < 400_000


def test_unfinished_chains_settle_the_signs_of_a_wide_layer():
    """Chains stopped long before they crossed every first-layer boundary (16-40-20: a first
    layer wider than the input) leave a null direction per boundary missed; projected off
    those, their equations still determine every flip of the layer: the true ones."""
    d, widths = 16, (40, 20)
    hidden, out = rf.planted.deep_relu(d, widths, 2, random_state=0)
    oracle = Oracle(rf.planted.relu_function(hidden, out), d)
    rng = np.random.default_rng(0)
    flip = rng.random(widths[0]) < 0.5
    s = np.where(flip, -1.0, 1.0)
    tent = (hidden[0][0] * s[:, None], hidden[0][1] * s)
    X, N = [], []
    for r in range(8):
        z, grad = _true_unit(hidden, r)
        x = _boundary_points(z, d, 1, np.random.default_rng(r))
        g = grad(x)
        X.append(x[0]), N.append(g[0] / np.linalg.norm(g[0]))
    found, unfinished = deep._chains(oracle, [], tent, np.array(X), np.array(N), rng, 80)
    assert len(unfinished) >= 4  # most did not cross all 40 boundaries both ways
    assert all(len(todo) > 0 for _, _, _, todo, _ in unfinished)
    rows = deep._unfinished_sign_rows([], tent, unfinished, deep._null_tol(oracle))
    got = fit.signs_from_rows(tent, np.zeros((0, widths[0] + d + 1)), rows)
    assert got is not None
    assert np.array_equal(got, flip)


def test_chain_null_spaces_loose_direction_counts_only_behind_a_gap():
    """Float64 chains: the unit's own direction (finite-difference noise, above the null
    tolerance) counts as null only where the next singular value is GAP times higher."""
    from relufast.chosen import nullspace

    tol = 1e-6 / 30
    s = np.array([1.0, 5e-3, 1e-7, 1e-16])
    assert nullspace._null_count(s, 1.0, tol) == 1  # the tolerance alone: only the exact zero
    assert nullspace._null_count(s, 1.0, tol, nullspace.CHAIN_LOOSE) == 2
    assert nullspace._null_count(np.array([1.0, 1e-5, 1e-7, 1e-16]), 1.0, tol, nullspace.CHAIN_LOOSE) == 1  # no gap
    assert nullspace._null_count(np.array([1.0, 5e-3, 1e-5, 1e-16]), 1.0, tol, nullspace.CHAIN_LOOSE) == 1  # too far
    rng = np.random.default_rng(0)
    theta = rng.standard_normal(12)
    # A stack whose null vector is theta up to 1e-7 noise, the next singular value ~1e-2.
    R = rng.standard_normal((40, 12))
    R -= np.outer(R @ theta, theta) / (theta @ theta)
    R += 1e-7 * rng.standard_normal(R.shape)
    M = R[None]
    assert nullspace._solve(M, tol) is None
    row = nullspace._solve(M, tol, nullspace.CHAIN_LOOSE)
    assert row is not None and abs(abs(row @ theta) / np.linalg.norm(row) / np.linalg.norm(theta) - 1) < 1e-10


def test_two_open_chains_of_one_unit_give_its_row():
    """Chains that each left other directions open share only their unit's row; a chain of
    another unit sharing two open directions with one of them gives no row."""
    from relufast.chosen import nullspace

    rng = np.random.default_rng(1)
    D = 30
    theta, phi = rng.standard_normal(D), rng.standard_normal(D)
    e = np.eye(D)

    def null(*vs):
        return np.linalg.qr(np.array(vs).T)[0].T

    store: list = []
    assert nullspace.merged_rows(store, [null(theta, e[1], e[2])]) == []
    assert nullspace.merged_rows(store, [null(phi, e[1], e[2])]) == []  # shares e1, e2 only: no row
    rows = nullspace.merged_rows(store, [null(theta, e[3], e[4] + e[5])])
    assert len(rows) == 1
    cos = abs(rows[0] @ theta) / np.linalg.norm(rows[0]) / np.linalg.norm(theta)
    assert cos > 1 - 1e-12 and np.isclose(np.linalg.norm(rows[0][:-1]), 1.0)
    assert len(store) == 3
    assert nullspace.merged_rows([], [np.zeros((0, D))]) == []  # nothing open: not stored

    # NumPy's SVD not converging (it did under OpenBLAS's SkylakeX kernels): LAPACK's QR
    # iteration gives the same row; a null space with a NaN is neither merged nor stored.
    def fails(*a, **k):
        raise np.linalg.LinAlgError("SVD did not converge")

    store = [null(theta, e[1], e[2])]
    bad = null(phi, e[1], e[2])
    bad[0, 0] = np.nan
    assert nullspace.merged_rows(store, [bad]) == [] and len(store) == 1
    R = rng.standard_normal((3, 7, 5))  # a stack of kinks' equations: one matrix at a time
    want = nullspace._right_svd(R)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(np.linalg, "svd", fails)
        again = nullspace.merged_rows(store, [null(theta, e[3], e[4] + e[5])])
        got = nullspace._right_svd(R)
    assert len(again) == 1 and abs(abs(again[0] @ rows[0]) / np.linalg.norm(rows[0]) ** 2 - 1) < 1e-12
    assert np.allclose(got[0], want[0], rtol=1e-12) and np.allclose(np.abs(got[1]), np.abs(want[1]), atol=1e-10)


def test_chain_steering_targets_include_units_never_crossed():
    """With the signs known a chain solves once every unit was seen truly active, but it is
    steered towards the units it has seen on one side only: a unit always active along it
    leaves its coefficient mixed with the linear term's."""
    pats = [np.array([True, False, True, False]), np.array([True, False, False, False])]
    delta = np.array([False, True, False, False])
    assert sorted(deep._targets(pats, 4, 0, delta)) == [(3, 1)]
    # unit 0 truly active throughout (go to z~ < 0); unit 1 (flipped) truly active throughout too
    assert sorted(deep._targets(pats, 4, 0, delta, crossed=True)) == [(0, -1), (1, 1), (3, 1)]


def test_first_crossing_takes_the_nearer_of_two_units_in_one_cell():
    """Two known boundaries within one cell of the walk's grid: the step goes to the nearer
    (whatever the units' order) with only that unit switched past it (the pattern at the
    cell's end has both, and no step was taken there before)."""
    W = np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    layers = [(W, np.array([-0.0115, -0.0085]))]
    X, N, V = np.zeros((1, 3)), np.array([[0.0, 1.0, 0.0]]), np.array([[1.0, 0.0, 0.0]])
    Y, D, XB, tau, G, pats = walk._first_crossings(layers, X, N, V)
    assert np.allclose(XB[0], [0.0085, 0, 0], atol=1e-15)
    assert pats[0].tolist() == [False, True]
    assert np.isfinite(tau[0]) and 0 < Y[0, 0] - 0.0085 < 0.003
    assert np.allclose(G[0], W[1])


def _reach_case(seed, noise):
    """A planted 10-20-10-1, a second-layer unit r, and a first-layer unit u that r's boundary
    meets; the null space (r's row, with ``noise``, and u's direction) of a chain of r that
    never saw u active, and a point of that chain with u inactive."""
    d = 10
    hidden, out = rf.planted.deep_relu(d, (20, 10), 1, random_state=seed)
    (W1, b1), (W2, b2) = hidden
    tent = (W1, b1)
    rng = np.random.default_rng(seed)
    for r in range(10):
        z, grad = _true_unit(hidden, r)
        P = _boundary_points(z, d, 30, rng)
        Z1 = P @ W1.T + b1
        for u in range(20):
            inactive = P[Z1[:, u] < 0]
            if (Z1[:, u] > 0).any() and len(inactive) and abs(W2[r, u]) > 0.1:
                theta = np.concatenate([W2[r], np.zeros(d), [b2[r]]]) + noise * rng.standard_normal(31)
                K = np.linalg.qr(np.stack([theta, np.eye(31)[u]], axis=1))[0].T
                x0 = inactive[0]
                n0 = grad(x0[None])[0]
                return hidden, out, tent, r, u, K, x0, n0 / np.linalg.norm(n0), z, grad
    raise AssertionError("no case")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reach_puts_a_chain_back_before_a_unit_it_never_saw_active(seed):
    """From a chain's null space (its row and the direction of a unit never seen active), the
    point where its known boundary meets that unit's, computed: the chain is put back on its
    boundary just before it, with the boundary's normal, facing that unit."""
    from relufast.chosen import reach

    _, _, tent, r, u, K, x0, n0, z, grad = _reach_case(seed, 0.0)
    back = reach.reach_start([tent], K, [(u, 1)], x0, n0, np.random.default_rng(seed))
    assert back is not None
    xs, ns, target = back
    assert target == (u, 1)
    g = grad(xs[None])[0]
    assert abs(z(xs[None])[0]) / np.linalg.norm(g) < 1e-12
    assert 1 - abs(g @ ns) / np.linalg.norm(g) < 1e-12
    zu = xs @ tent[0][u] + tent[1][u]
    assert -1.01 * reach.REACH_BACK <= zu / np.linalg.norm(tent[0][u]) < 0


@pytest.mark.parametrize("seed", [0, 1])
def test_step_after_put_back_crosses_with_a_row_known_to_1e_7(seed):
    """A chain put back from a row known to 1e-7 (as the trained diabetes 10-100-100-1's
    chains know theirs) steps across the unit it never saw active, onto its own boundary
    there, with the normal from the two kinks found on the new piece."""
    from relufast.chosen import reach

    hidden, out, tent, r, u, K, x0, n0, z, grad = _reach_case(seed, 1e-7)
    oracle = Oracle(rf.planted.relu_function(hidden, out), 10)
    rng = np.random.default_rng(seed)
    xs, ns, target = reach.reach_start([tent], K, [(u, 1)], x0, n0, rng)
    Xn, Nn, ok = walk.walk_step(oracle, [], tent, xs[None], ns[None], [target], rng, put_back=np.array([True]))
    assert ok[0]
    assert Xn[0] @ tent[0][u] + tent[1][u] > 0  # past the unit's boundary
    g = grad(Xn)[0]
    assert abs(z(Xn)[0]) / np.linalg.norm(g) < 1e-9
    assert 1 - abs(g @ Nn[0]) / np.linalg.norm(g) < 1e-9
