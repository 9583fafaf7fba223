"""Lines towards the last hidden layer's units not found, from the residual of the output
fit on the units found (:mod:`relufast.chosen.residual`, low precision)."""

import numpy as np
import pytest

import relufast as rf
from relufast.chosen.first_layer import KinkPool
from relufast.chosen.oracle import Oracle
from relufast.chosen.residual import residual_lines


def _planted(rare=None, seed=0, on=0.04):
    """A planted float32 20-12-8-3 network (second-layer unit ``rare`` moved so that it is
    active on about a fraction ``on`` of Gaussian inputs), its oracle, and the second
    layer's rows in phi-space [relu(W1 x + b1), x, 1] (the first layer known)."""
    d = 20
    (l1, (W2, b2)), out = rf.planted.deep_relu(d, [12, 8], 3, random_state=seed)
    if rare is not None:
        X = np.random.default_rng(99).standard_normal((20000, d))
        z = np.maximum(X @ l1[0].T + l1[1], 0.0) @ W2[rare]
        b2 = b2.copy()
        b2[rare] = -np.quantile(z, 1.0 - on)
    hidden = [l1, (W2, b2)]
    oracle = Oracle(rf.planted.relu_function(hidden, out, dtype=np.float32), d)
    oracle(np.random.default_rng(seed).standard_normal((2, d)))  # the precision is known after an answer
    Theta = np.hstack([W2, np.zeros((len(W2), d)), b2[:, None]])
    return oracle, hidden, Theta


def _on_unit(hidden, x, u):
    """Distance of the points x from unit u's (second-layer) boundary, and its normals there."""
    (W1, b1), (W2, b2) = hidden
    a = (x @ W1.T + b1 > 0).astype(float)
    g = (a * W2[u]) @ W1
    z = np.maximum(x @ W1.T + b1, 0.0) @ W2[u] + b2[u]
    gn = np.linalg.norm(g, axis=1)
    return np.abs(z) / gn, g / gn[:, None]


@pytest.mark.parametrize("oriented", [False, True])
@pytest.mark.parametrize("active", [0.04, 0.96])
@pytest.mark.parametrize("missing", [1, 5])
def test_residual_lines_find_kinks_of_the_unit_not_found(missing, active, oriented):
    # A unit active on 4% of the inputs stands out where it is active; one active on 96% (as
    # most units the searches of a trained float32 784-128-128-10 missed) stands out where
    # it is inactive, once the fit has the features in which it is linear.
    oracle, hidden, Theta = _planted(rare=missing, on=active)
    pool = KinkPool(oracle.d)
    rng = np.random.default_rng(1)
    found = np.delete(Theta, missing, axis=0)
    lines = residual_lines(oracle, [], hidden[0], found, rng, pool, oriented)
    assert lines > 0
    dist, normal = _on_unit(hidden, pool.x, missing)
    on = dist < 1e-3
    # Measured: 30 and 32 of 32 lines gave a kink on the rarely active unit's boundary (the
    # first version, whose fit kept the missing unit's points, 1 and 0), normals within
    # 3.4e-5 rad; 31 and 23 on the mostly active one's (none, without the features).
    assert on.sum() >= lines // 2, (lines, on.sum())
    angle = np.arccos(np.minimum(1.0, np.abs(np.einsum("kd,kd->k", normal[on], pool.n[on]))))
    assert np.median(angle) < 1e-3, angle


def test_residual_lines_ask_nothing_more_when_every_unit_is_found():
    oracle, hidden, Theta = _planted()
    pool = KinkPool(oracle.d)
    before = oracle.n_queries
    assert residual_lines(oracle, [], hidden[0], Theta, np.random.default_rng(1), pool) == 0
    assert len(pool) == 0
    assert oracle.n_queries - before == 2048  # the fit's points only


def test_pooled_normals_measured_again_behind_the_first_layer():
    # Kinks pooled before any layer was known carry normals measured in all d directions
    # (at d = 784 in float32 some are 0.03-1.5 rad off); behind the first layer they are
    # measured again in the span of its active units.
    from relufast.chosen.first_layer import measure_again

    oracle, hidden, _ = _planted()
    (W1, b1), (W2, b2) = hidden
    rng = np.random.default_rng(2)
    X = rng.standard_normal((40, oracle.d))
    u = rng.integers(0, len(W2), size=len(X))
    for _ in range(20):  # Newton steps onto each kink's unit boundary
        a = (X @ W1.T + b1 > 0).astype(float)
        g = (a * W2[u]) @ W1
        z = np.einsum("kj,kj->k", np.maximum(X @ W1.T + b1, 0.0), W2[u]) + b2[u]
        X = X - (z / np.einsum("kd,kd->k", g, g))[:, None] * g
    true = g / np.linalg.norm(g, axis=1, keepdims=True)
    off = rng.standard_normal(X.shape)
    off -= np.einsum("kd,kd->k", off, true)[:, None] * true
    first = true + 0.3 * off / np.linalg.norm(off, axis=1, keepdims=True)  # 0.3 rad off
    pool = KinkPool(oracle.d)
    pool.add(X, first / np.linalg.norm(first, axis=1, keepdims=True), np.zeros(len(X)))
    again = measure_again(oracle, pool, [hidden[0]], rng)
    angle = np.arccos(np.minimum(1.0, np.abs(np.einsum("kd,kd->k", pool.n, true))))
    # Measured: 40 of 40 measured again, 37 within 5e-5 rad, 2 at 3e-4, one left 0.36 off.
    assert again >= 30 and (angle < 1e-3).sum() >= 30, (again, np.sort(angle))


def test_residual_lines_grow_with_the_units_not_found():
    # RESIDUAL_LINES lines a unit not found (up to RESIDUAL_UNITS of them): a row is complete
    # once its kinks cover every unit of the layer below, and one round's kinks on four
    # missing units of a trained 784-128-128-10 covered 119-127 of its 128 first-layer units.
    from relufast.chosen import residual

    oracle, hidden, Theta = _planted(rare=1, on=0.96)
    found = np.delete(Theta, 1, axis=0)
    counts = []
    for missing in (1, 2):
        pool = KinkPool(oracle.d)
        counts.append(residual_lines(oracle, [], hidden[0], found, np.random.default_rng(1), pool, True, missing))
        assert (_on_unit(hidden, pool.x, 1)[0] < 1e-3).sum() >= counts[-1] // 2
    assert counts[0] <= residual.RESIDUAL_LINES < counts[1] <= 2 * residual.RESIDUAL_LINES, counts


def test_a_lone_kink_asks_for_entry_lines_at_low_precision(monkeypatch):
    # A second-layer unit with one kink (a rarely active unit leaves one a round): too few
    # for a row at low precision (CLUSTER_MIN_LOW), but with no other component asking,
    # its entry lines are drawn toward the first-layer units it has not seen active.
    from relufast.chosen import cluster

    hidden, _ = rf.planted.deep_relu(12, [10, 4], 1, random_state=2)
    (W1, b1), (W2, b2) = hidden
    rng = np.random.default_rng(0)

    def z(x):
        return np.maximum(x @ W1.T + b1, 0.0) @ W2[0] + b2[0]

    for _ in range(200):  # a point on unit 0's boundary, by bisection along a random line
        a, u = rng.standard_normal(12), rng.standard_normal(12)
        lo, hi = a, a + 3.0 * u
        if np.sign(z(lo)) != np.sign(z(hi)):
            break
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.sign(z(mid)) == np.sign(z(lo)) else (lo, mid)
    x = (lo + hi) / 2
    act = x @ W1.T + b1 > 0
    n = (W2[0] * act) @ W1
    assert 0 < act.sum() < len(act)  # some first-layer units not seen active
    args = ([], (W1, b1), np.zeros(len(W1), dtype=bool), x[None], (n / np.linalg.norm(n))[None], 1e-8, 1e-6)
    kw = dict(min_size=cluster.CLUSTER_MIN_LOW, trim=True)
    rows, asks = cluster.cluster_units(*args, np.random.default_rng(1), **kw)
    assert len(rows) == 0 and len(asks) > 0
    seen = act.copy()  # the lines cross the boundary where units not seen are active
    for base, direction in asks:
        pts = base + np.linspace(-1.0, 1.0, 2001)[:, None] * direction
        vals = np.array([z(p) for p in pts])
        for c in np.nonzero(np.sign(vals[1:]) != np.sign(vals[:-1]))[0]:
            seen |= pts[c] @ W1.T + b1 > 0
    assert seen.sum() > act.sum()
    monkeypatch.setattr(cluster, "SMALL_ASKS", False)
    assert cluster.cluster_units(*args, np.random.default_rng(1), **kw)[1] == []


@pytest.mark.parametrize(
    "d, dtype, chains", [(128, np.float32, False), (64, np.float32, True), (128, np.float64, True)]
)
def test_no_chains_at_low_precision_above_coarse_dims(monkeypatch, d, dtype, chains):
    # With the signs of the layer below known, a search whose single kinks left units
    # missing follows their boundaries with chains, except at low precision above
    # COARSE_DIMS inputs, where they get COARSE_CHAIN_ROUNDS: there the chains' equations
    # (d + 1 rows a kink from normals 1e-3 off) found no unit in any run measured, at 20-60 s
    # a round at d = 784.
    from relufast.chosen import deep

    hidden, out = rf.planted.deep_relu(d, [6, 4], 1, random_state=0)
    oracle = Oracle(rf.planted.relu_function(hidden, out, dtype=dtype), d)
    oracle(np.zeros((1, d)))  # the precision is known from the first answer
    assert oracle.low_precision == (dtype == np.float32)
    calls = []
    monkeypatch.setattr(deep, "_gathered", lambda *a, **k: a[7])  # single kinks find no unit
    monkeypatch.setattr(deep, "_chained", lambda *a: calls.append(a[10]) or a[7])
    pool = KinkPool(d)
    rng = np.random.default_rng(0)
    found = deep.next_layer(oracle, [], hidden[0], 4, (6, 4), rng, pool, max_rounds=7, oriented=True)
    assert found is None  # no unit: the driver's next search draws new lines
    assert calls == [7 if chains else deep.COARSE_CHAIN_ROUNDS] and deep.COARSE_CHAIN_ROUNDS < 7
