"""Last-layer units that never switch (:mod:`relufast.chosen.affine`): the function is
extracted, with those units listed in ``undetermined_units``."""

import warnings

import numpy as np
import pytest

import relufast as rf
from relufast import planted as P
from relufast.chosen import affine
from relufast.chosen.oracle import Oracle


def always_active(d, widths, m, n_always, seed):
    """A planted network whose first ``n_always`` last-layer units are active at every input
    (nonnegative weights on units that are >= 0, bias 1)."""
    hidden, out = P.deep_relu(d, list(widths), m, random_state=seed)
    W, b = (a.copy() for a in hidden[-1])
    W[:n_always], b[:n_always] = np.abs(W[:n_always]), 1.0
    return [*hidden[:-1], (W, b)], out


@pytest.mark.parametrize("d, widths, m, n_always, seed", [(10, (12, 8), 1, 3, 0), (20, (16, 12), 2, 5, 0)])
def test_units_that_never_switch_are_replaced_by_the_affine_part(d, widths, m, n_always, seed):
    hidden, out = always_active(d, widths, m, n_always, seed)
    f = P.relu_function(hidden, out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        res = rf.extract(f, d, widths, queries="chosen", random_state=0)
    assert res.status == "exact", res.message
    L, k = len(widths), widths[-1]
    assert res.diagnostics["affine_rest"] == n_always
    assert res.undetermined_units == tuple((L, i) for i in range(k - n_always, k))
    assert "switched on no search" in res.message and "undetermined_units" in res.message
    X = 5.0 * np.random.default_rng(1).standard_normal((4000, d))
    assert np.abs(res.predict(X) - f(X)).max() <= 1e-12 * np.abs(f(X)).max()
    assert [W.shape[0] for W, _ in res.layers[:-1]] == list(widths)  # the widths asked for


def test_affine_units_carry_an_affine_term_exactly():
    """relu(B+ h) - relu(B- h) = B h for h >= 0: two units an output, fitted with the rest."""
    rng = np.random.default_rng(0)
    d, k1, k2, m = 6, 7, 3, 2
    known = [(rng.standard_normal((k1, d)), rng.standard_normal(k1))]
    last = (rng.standard_normal((k2, k1)), rng.standard_normal(k2))
    B, A, c = rng.standard_normal((m, k1)), rng.standard_normal((m, k2)), rng.standard_normal(m)
    X = 3.0 * rng.standard_normal((500, d))
    H1 = np.maximum(X @ known[0][0].T + known[0][1], 0.0)
    Y = np.maximum(H1 @ last[0].T + last[1], 0.0) @ A.T + H1 @ B.T + c
    layer, (Wo, co), added = affine.affine_units(known, last, X, Y)
    assert added == 2 * m and layer[0].shape == (k2 + 2 * m, k1) and np.all(layer[0][k2:] >= 0)
    Z = np.maximum(np.maximum(X @ known[0][0].T + known[0][1], 0.0) @ layer[0].T + layer[1], 0.0)
    assert np.abs(Z @ Wo.T + co - Y).max() <= 1e-10 * np.abs(Y).max()


def test_a_unit_that_switches_is_not_affine():
    """With one switching last-layer unit left out the test fails; with only the
    always-active one left out it holds; at low precision it is not made."""
    hidden, out = always_active(10, (12, 8), 1, 1, 0)
    f = P.relu_function(hidden, out)
    (W1, b1), (W2, b2) = hidden
    tent = (W1, b1)
    rows = np.hstack([W2, np.zeros((8, 10)), b2[:, None]])  # phi-space rows of the true units
    rng = np.random.default_rng(0)
    oracle = Oracle(f, 10)
    carry: dict = {}
    assert affine.explained(oracle, [], tent, rows[1:], rng, carry)  # only the always-active unit 0 left out
    assert not affine.explained(oracle, [], tent, rows[2:], rng, carry)  # switching unit 1 left out too
    assert oracle.n_queries == len(affine.AFFINE_SCALES) * affine.AFFINE_POINTS  # its points asked once
    low = Oracle(P.relu_function(hidden, out, np.float32), 10)
    low(np.zeros((1, 10)))  # its precision is known from its answers
    assert not affine.explained(low, [], tent, rows[1:], rng, {}) and low.n_queries == 1


def test_a_wrong_affine_test_is_caught_by_the_certificate(monkeypatch):
    """Where the test is wrong (forced here: it says affine with units that switch still
    missing), the certificate sees the difference: no ``exact``, and the message says the
    search stopped on it."""
    from relufast.chosen import deep, driver

    real = deep._gathered

    def two(oracle, known, tent, k, widths, rng, pool, Theta, carry, *a):
        got = real(oracle, known, tent, k, widths, rng, pool, Theta, carry, *a)
        if known or k != 8:  # the first layer's searches as they are
            return got
        carry["Theta"] = got[:2]  # two of the last layer's five units that switch
        return got[:2]

    monkeypatch.setattr(deep, "_gathered", two)
    monkeypatch.setattr(driver, "explained", lambda oracle, known, tent, Theta, rng, carry: True)
    hidden, out = always_active(10, (12, 8), 1, 3, 0)
    with pytest.warns(rf.RelufastWarning, match="switches where no test point was"):
        res = rf.extract(P.relu_function(hidden, out), 10, (12, 8), queries="chosen", random_state=0)
    assert res.status != "exact" and not res.exact
    assert res.diagnostics["affine_rest"] >= 1
