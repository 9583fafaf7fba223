"""Chosen-query extraction at the size of trained networks: exact rows through precisely
located kinks, memory bounded by the model (not queries x parameters)."""

import tracemalloc
import warnings

import numpy as np
import pytest

import relufast as rf
from relufast.chosen.driver import extract_chosen
from relufast.chosen.net import pre_activations
from relufast.chosen.oracle import Oracle
from relufast.chosen.refit import refit_layer


def _row_errors(W, b, Wt, bt):
    """Distance of each row (W, b), scaled to unit W, to the nearest true row up to sign."""
    H = np.hstack([W, b[:, None]]) / np.linalg.norm(W, axis=1)[:, None]
    Ht = np.hstack([Wt, bt[:, None]]) / np.linalg.norm(Wt, axis=1)[:, None]
    j = np.abs(H @ Ht.T).argmax(axis=1)
    s = np.sign(np.sum(H[:, :-1] * Ht[j, :-1], axis=1))
    return np.linalg.norm(H - s[:, None] * Ht[j], axis=1)


@pytest.mark.parametrize("seed", [3, 4])
def test_refit_first_layer_from_finite_difference_accuracy_to_rounding(seed):
    # Rows 1e-6 off (what finite differences give at d ~ 100) come back to ~1e-13, each
    # unit's contribution to the output (|u_i| x row error) at the rounding.
    d, k = 60, 12
    hidden, out = rf.planted.deep_relu(d, [k], 2, random_state=seed)
    rng = np.random.default_rng(100 + seed)  # not the planted network's stream
    W, b = hidden[0]
    est = W + 1e-6 * rng.standard_normal(W.shape)
    est /= np.linalg.norm(est, axis=1, keepdims=True)
    flip = np.where(rng.random(k) < 0.5, -1.0, 1.0)  # signs are open at this stage
    oracle = Oracle(rf.planted.relu_function(hidden, out), d)
    W2, b2, n, _ = refit_layer(oracle, [], (est * flip[:, None], b * flip), rng)
    assert n == k
    before, after = _row_errors(est, b, W, b), _row_errors(W2, b2, W, b)
    assert before.min() > 1e-7
    weight = np.abs(out[0]).max(axis=0)
    assert np.max(after * weight) < 1e-12
    assert np.all(np.sign(np.sum(W2 * est * flip[:, None], axis=1)) > 0)  # orientation kept


def test_refit_deeper_layer_in_the_space_of_the_layer_before():
    # Layer 2 of a 3-layer network, with layer 1 exact: its rows are hyperplanes in h_1.
    d, widths = 12, (10, 8)
    hidden, out = rf.planted.deep_relu(d, list(widths), 1, random_state=7)
    rng = np.random.default_rng(100)
    W2t, b2t = hidden[1]
    est = W2t + 1e-6 * rng.standard_normal(W2t.shape)
    oracle = Oracle(rf.planted.relu_function(hidden, out), d)
    W2, b2, n, _ = refit_layer(oracle, [hidden[0]], (est, b2t.copy()), rng)
    err = _row_errors(W2, b2, W2t, b2t)
    before = _row_errors(est, b2t, W2t, b2t)
    assert np.all(err <= before) and np.min(before) > 1e-7
    # Rows refitted whole (every unit of layer 1 seen active at their kinks) are exact.
    assert n >= 6 and np.sum(err < 1e-11) >= n


def test_refit_keeps_rows_it_cannot_confirm():
    # A model that is not piecewise linear (softplus): no segment fits two lines, so no
    # row changes (the estimate is kept, never replaced by a fit of noise).
    d, k = 10, 4
    hidden, out = rf.planted.deep_relu(d, [k], 1, random_state=1)
    f = rf.planted.relu_function(hidden, out, activation=lambda z: np.logaddexp(0.0, 4 * z) / 4)
    W, b = hidden[0]
    W2, b2, n, _ = refit_layer(Oracle(f, d), [], (W.copy(), b.copy()), np.random.default_rng(0))
    assert n == 0 and np.array_equal(W2, W) and np.array_equal(b2, b)


def test_one_hidden_layer_at_width_exact_without_a_dense_jacobian():
    # 300-48-1 has 14,497 weights: the former polish built a (3 P, P) Jacobian (2.5 GB).
    # Peak Python memory must stay a small multiple of one batch of queries.
    d, k = 300, 48
    hidden, out = rf.planted.deep_relu(d, [k], 1, random_state=2)
    f = rf.planted.relu_function(hidden, out)
    tracemalloc.start()
    try:
        res = extract_chosen(f, d, (k,), random_state=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert res.exact and res.status == "exact"
    X = 3.0 * np.random.default_rng(9).standard_normal((2000, d))
    Yt = f(X)
    Z, H = pre_activations([(res.V, res.b)], X)
    assert np.abs(H @ res.U.T + res.c - Yt).max() <= 1e-12 * np.abs(Yt).max()
    assert peak < 400 * 2**20, peak / 2**20
    n_par = k * (d + 1) + k + 1
    assert res.counts["queries"] < 30 * n_par
    assert "polish" not in res.seconds


def test_layer_refit_is_reported():
    d, widths = 10, (6, 4)
    hidden, out = rf.planted.deep_relu(d, list(widths), 1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = rf.extract(rf.planted.relu_function(hidden, out), d, widths, queries="chosen", random_state=0)
    rows = res.diagnostics["refitted_rows"]
    assert rows[0].startswith("layer 1: 6 of 6") and rows[1].startswith("layer 2: ")


@pytest.mark.parametrize("d,widths,m", [(10, (8, 6), 1), (40, (24, 16), 3)])
def test_wiggle_signs_settle_each_unit_of_a_narrow_layer(d, widths, m):
    from relufast.chosen.signs import wiggle_signs

    hidden, out = rf.planted.deep_relu(d, list(widths), m, random_state=11)
    oracle = Oracle(rf.planted.relu_function(hidden, out), d)
    rng = np.random.default_rng(12)
    W, b = hidden[0]
    wrong = rng.random(len(W)) < 0.5
    s = np.where(wrong, -1.0, 1.0)
    flip, settled = wiggle_signs(oracle, [], (W * s[:, None], b * s), rng)
    assert settled.all() and np.array_equal(flip, wrong)
    assert oracle.n_queries <= 3 * 6 * len(W) * 3  # three queries a point, a few points a unit


def test_wiggle_signs_never_guess_on_a_wide_layer():
    # 10-60-1: more units than inputs, no direction moves one unit alone: nothing settled
    # (the linear term of the next layer, or "signs unresolved", takes over), nothing wrong.
    from relufast.chosen.signs import wiggle_signs

    hidden, out = rf.planted.deep_relu(10, [60], 1, random_state=2)
    oracle = Oracle(rf.planted.relu_function(hidden, out), 10)
    W, b = hidden[0]
    flip, settled = wiggle_signs(oracle, [], (W, b), np.random.default_rng(0))
    assert not flip[settled].any()


def test_chosen_queries_have_a_default_budget(monkeypatch):
    # Without max_queries a chosen-query run is bounded (100 queries a hidden weight, 250 in
    # float32, at least 2 million); a run that spends it ends failed and names max_queries.
    from relufast import extraction

    assert extraction.chosen_budget(784, (32,)) == 100 * 32 * 785
    assert extraction.chosen_budget(10, (5,)) == 2_000_000
    monkeypatch.setattr(extraction, "CHOSEN_BUDGET_MIN", 3000)
    monkeypatch.setattr(extraction, "CHOSEN_BUDGET_PER_WEIGHT", 1)
    hidden, out = rf.planted.deep_relu(12, [8, 6], 1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        res = rf.extract(rf.planted.relu_function(hidden, out), 12, (8, 6), queries="chosen", random_state=0)
    assert res.status == "failed" and not res.exact
    assert "max_queries=3000" in res.message
    assert res.counts["queries"] <= 3000
    # float32 answers (read from the first one) take the low-precision budget.
    assert extraction.chosen_budget(784, (32,), low_precision=True) == 250 * 32 * 785
    monkeypatch.setattr(extraction, "CHOSEN_BUDGET_PER_WEIGHT_LOW", 50)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        f32 = rf.planted.relu_function(hidden, out, dtype=np.float32)
        res = rf.extract(f32, 12, (8, 6), queries="chosen", random_state=0)
    assert res.status == "failed" and "max_queries=7900" in res.message  # 50 x 158 hidden weights


def test_plane_fit_drops_a_misplaced_kink_of_high_leverage():
    # Kinks on a plane in R^40 to the rounding, one moved 1e-5 off it (a later layer's
    # boundary between the kink and its first side sample): with 1.4 rows an unknown the
    # outlier pulls the least-squares plane to ~1e-7 and hides its own residual; trimmed
    # by studentised residuals the plane comes back to the rounding.
    from relufast.chosen.refit import _plane_through

    rng = np.random.default_rng(0)
    k, P = 40, 56
    v = rng.standard_normal(k)
    v /= np.linalg.norm(v)
    c = 0.3
    F = 2.0 * rng.standard_normal((P, k))
    F -= ((F @ v + c) / (v @ v))[:, None] * v  # on the plane v . f + c = 0
    F[7] += 1e-5 * v
    w = v + 1e-6 * rng.standard_normal(k)
    w /= np.linalg.norm(w)
    got, cg, rel, whole, dropped = _plane_through(F, w, 2.0**-53)
    assert whole and dropped >= 1
    assert np.linalg.norm(got - v) < 1e-13 and abs(cg - c) < 1e-13
    assert rel < 16 * 2.0**-53
    # Without the outlier nothing is dropped.
    F[7] -= 1e-5 * v
    assert _plane_through(F, w, 2.0**-53)[4] == 0


def test_plane_fit_drops_several_misplaced_kinks():
    # Five kinks moved 1e-6 to 1e-4 off the plane: dropped one after another, each drop's
    # residuals and leverages updated from those before (Woodbury terms on one Cholesky
    # factor), exactly the five and the plane back at the rounding.
    from relufast.chosen.refit import _plane_through

    rng = np.random.default_rng(1)
    k, P = 60, 100
    v = rng.standard_normal(k)
    v /= np.linalg.norm(v)
    c = -0.2
    F = 2.0 * rng.standard_normal((P, k))
    F -= ((F @ v + c) / (v @ v))[:, None] * v
    bad = [3, 17, 41, 66, 90]
    F[bad] += np.array([1e-4, -3e-5, 1e-5, -3e-6, 1e-6])[:, None] * v
    w = v + 1e-6 * rng.standard_normal(k)
    w /= np.linalg.norm(w)
    got, cg, rel, whole, dropped = _plane_through(F, w, 2.0**-53)
    assert dropped == len(bad)
    assert np.linalg.norm(got - v) < 1e-13 and abs(cg - c) < 1e-13
    assert rel < 16 * 2.0**-53


def test_kink_found_where_one_output_is_near_zero():
    # An output near zero is computed from terms as large as the others: its rounding is
    # not a kink, and a kink located on it is checked against the line's largest output.
    from relufast.chosen.lines import find_kinks

    def f(X):
        z = X[:, 0] - 0.1
        big = 50.0 + X[:, 1]
        return np.stack([big, (big + 1e-3 * np.maximum(z, 0.0)) - big], axis=1)

    oracle = Oracle(f, 3)
    base = np.array([[0.1, 0.3, 0.0]])
    dirs = np.array([[1.0, 0.0, 0.0]])
    t = 1e-3 * np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5])
    kinks = find_kinks(oracle, base + 1e-5 * dirs, dirs, t)
    assert len(kinks.t) == 1 and abs(kinks.x[0, 0] - 0.1) < 1e-8


def test_two_hidden_layers_exact_through_refits_and_cheap_normals():
    # 64-32-32-10: both hidden layers refitted whole, deeper normals from the 32 directions
    # of the first layer; exact (it ended approximate at 2.5e-11 after 65 s before).
    d, widths, m = 64, (32, 32), 10
    hidden, out = rf.planted.deep_relu(d, list(widths), m, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = rf.extract(rf.planted.relu_function(hidden, out), d, widths, queries="chosen", random_state=0)
    assert res.exact, res.message
    rows = res.diagnostics["refitted_rows"]
    assert len(rows) == 2 and rows[0].startswith("layer 1: 32 of 32") and rows[1].startswith("layer 2: 32 of 32")
    P = sum(a * (b + 1) for a, b in zip([*widths, m], [d, *widths]))
    # 41-51 queries a weight over random states 0-5 before the per-kink spans, the located
    # single kinks and the long pool lines; 26-29 after (issue target: 30).
    assert res.counts["queries"] < 35 * P


def test_screened_lines_find_the_unknown_kink_between_known_ones():
    # On a line with 40 known kinks (computed) and one unknown, three queries a piece and a
    # short grid on the one piece that bends find it, in far fewer queries than a grid.
    from relufast.chosen.lines import screened_kinks

    rng = np.random.default_rng(3)
    known = np.sort(rng.uniform(-3, 3, 40))
    unknown = 0.5 * (known[17] + known[18])
    slopes = rng.uniform(0.5, 2.0, 41)

    def f(X):
        t = X[:, 0]
        y = sum(s * np.maximum(t - k, 0.0) for s, k in zip(slopes, [*known, unknown]))
        return (y + 0.1 * X[:, 1])[:, None]

    oracle = Oracle(f, 2)
    breaks = [np.concatenate([[-3.0], known, [3.0]])]
    kinks = screened_kinks(oracle, np.zeros((1, 2)), np.array([[1.0, 0.0]]), breaks)
    assert len(kinks.t) == 1 and abs(kinks.x[0, 0] - unknown) < 1e-10
    assert oracle.n_queries < 3 * 41 + 32 + 2


def test_single_kink_located_in_four_queries_and_no_kink_at_a_chord():
    # A bent piece holding one kink: its two outer pieces meet at the kink (four queries).
    # A kink within 1/16 of the piece's end makes that side a chord through the inner point,
    # which the other piece meets there: no kink may be reported at that point.
    from relufast.chosen.lines import screened_kinks

    def model(kinks, slopes):
        return lambda X: sum(s * np.maximum(X[:, :1] - k, 0.0) for s, k in zip(slopes, kinks)) + 0.1 * X[:, 1:]

    base, dirs, breaks = np.zeros((1, 2)), np.array([[1.0, 0.0]]), [np.array([0.0, 1.0])]
    oracle = Oracle(model([0.37], [1.5]), 2)
    kinks = screened_kinks(oracle, base, dirs, breaks)
    assert len(kinks.t) == 1 and abs(kinks.x[0, 0] - 0.37) < 1e-12
    assert oracle.n_queries == 3 + 4
    for near in (0.02, 0.985):  # inside the first or the last sixteenth, beside a middle kink
        true = np.array([near, 0.55])
        oracle = Oracle(model(true, [1.0, -2.0]), 2)
        kinks = screened_kinks(oracle, base, dirs, breaks)
        assert len(kinks.t) >= 1
        assert np.abs(kinks.x[:, :1] - true[None, :]).min(axis=1).max() < 1e-9  # only true kinks


def test_deeper_normals_measured_in_the_span_of_the_active_units():
    # Behind a known first layer, a second-layer kink's normal is measured along the rows of
    # the first-layer units active there (about half of them), not all k: fewer queries, the
    # same normal.
    from relufast.chosen.deep import downstream_basis
    from relufast.chosen.hyperplanes import jump_normals
    from relufast.chosen.lines import find_kinks
    from relufast.chosen.net import preact_jacobians

    d, widths, m = 40, (16, 8), 3
    hidden, out = rf.planted.deep_relu(d, list(widths), m, random_state=2)
    oracle = Oracle(rf.planted.relu_function(hidden, out), d)
    rng = np.random.default_rng(0)
    kinks = find_kinks(oracle, 0.5 * rng.standard_normal((4, d)), rng.standard_normal((4, d)), np.linspace(-3, 3, 2048))
    Z, _ = pre_activations(hidden, kinks.x)
    deep = np.abs(Z[0]).min(axis=1) > 1e-3  # kinks of the second layer
    sub = kinks._replace(**{f: getattr(kinks, f)[deep] for f in ("line", "t", "x", "u", "slope_jump")})
    before = oracle.n_queries
    nrm = jump_normals(oracle, sub, rng, downstream_basis(hidden[:1]))
    assert len(nrm.keep) >= 0.8 * len(sub.t) > 0
    assert oracle.n_queries - before < 0.8 * 2 * (widths[0] + 1) * len(sub.t)  # k + 1 a side: 2 (k + 1)
    J = np.concatenate(preact_jacobians(hidden, nrm.x), axis=1)[:, widths[0] :]  # second-layer gradients
    unit = np.abs(Z[1][deep][nrm.keep]).argmin(axis=1)
    g = J[np.arange(len(unit)), unit]
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    assert np.abs(np.abs(np.einsum("kd,kd->k", g, nrm.n)) - 1).max() < 1e-8


def test_kink_equations_without_the_projector_matrix():
    # deep._constraints forms (I - n n^T) A^T without the (d, d) projector (d^2 D flops a
    # kink at d = 784, where chains and their completion build it kink after kink).
    from relufast.chosen.deep import _constraints
    from relufast.chosen.net import feature_jacobians

    rng = np.random.default_rng(5)
    hidden, _ = rf.planted.deep_relu(30, [12, 8], 2, random_state=5)
    x, n = rng.standard_normal((7, 30)), rng.standard_normal((7, 30))
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    M = _constraints(hidden[:1], hidden[1], x, n)
    A = feature_jacobians(hidden[:1], hidden[1], x)
    P = np.eye(30)[None] - n[:, :, None] * n[:, None, :]
    assert M.shape == (7, 31, 12 + 8 + 1)
    np.testing.assert_allclose(M[:, :30, :-1], P @ np.swapaxes(A, 1, 2), atol=1e-12)
    assert np.all(M[:, :30, -1] == 0)
