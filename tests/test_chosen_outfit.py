"""Rows of the last hidden layer's units not found, from the residual of the outputs' fit on
the units found (:mod:`relufast.chosen.outfit`)."""

import numpy as np
import pytest

import relufast as rf
from relufast.chosen import outfit
from relufast.chosen.oracle import Oracle


def _planted(rare=(), seed=0, on=0.04, dtype=np.float32, d=20, widths=(12, 8), m=3):
    """A planted d-12-8-m network (second-layer units ``rare`` moved so that each is active
    on about a fraction ``on`` of Gaussian inputs), its oracle, and the second layer's rows
    in phi-space [relu(W1 x + b1), x, 1] (the first layer known)."""
    (l1, (W2, b2)), out = rf.planted.deep_relu(d, list(widths), m, random_state=seed)
    X = np.random.default_rng(99).standard_normal((20000, d))
    b2 = b2.copy()
    for u in rare:
        z = np.maximum(X @ l1[0].T + l1[1], 0.0) @ W2[u]
        b2[u] = -np.quantile(z, 1.0 - on)
    hidden = [l1, (W2, b2)]
    oracle = Oracle(rf.planted.relu_function(hidden, out, dtype=dtype), d)
    oracle(np.random.default_rng(seed).standard_normal((2, d)))  # the precision is known after an answer
    Theta = np.hstack([W2, np.zeros((len(W2), d)), b2[:, None]])
    return oracle, hidden, Theta


def _off(row, true):
    """Distance between two rows as unit vectors, up to sign."""
    a, b = row / np.linalg.norm(row), true / np.linalg.norm(true)
    return min(np.linalg.norm(a - b), np.linalg.norm(a + b))


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-6), (np.float64, 1e-12)])
@pytest.mark.parametrize("oriented", [False, True])
def test_the_row_of_a_rarely_active_unit_not_found_from_the_outputs(oriented, dtype, tol):
    # The unit stands out where it is active, and there the residual is its part of the
    # outputs, linear in phi.
    oracle, hidden, Theta = _planted(rare=(5,), on=0.04, dtype=dtype)
    found = np.delete(Theta, 5, axis=0)
    before = oracle.n_queries
    rows = outfit.output_rows(oracle, [], hidden[0], found, np.random.default_rng(1), oriented)
    assert len(rows) == 1
    # Measured: 5.6e-8 and 6.4e-8 off in float32 (7.1e-16 and 2.0e-15 in float64), from one
    # batch of 1,664 and 3,200 points.
    assert _off(rows[0], Theta[5]) < tol, _off(rows[0], Theta[5])
    assert oracle.n_queries - before <= outfit.OUTFIT_BATCH * outfit.OUTFIT_BATCHES


def test_no_row_where_the_unit_not_found_is_active_on_most_inputs():
    # The fit on the units found misses most points: no row, one batch asked (the lines of
    # .residual go on alone).
    oracle, hidden, Theta = _planted(rare=(5,), on=0.96)
    before = oracle.n_queries
    rows = outfit.output_rows(oracle, [], hidden[0], np.delete(Theta, 5, axis=0), np.random.default_rng(1), True)
    assert len(rows) == 0 and oracle.n_queries - before == outfit._batch(hidden[0], True) == 128 * 13


def test_two_units_not_found_apart_by_their_output_directions():
    oracle, hidden, Theta = _planted(rare=(2, 6), on=0.03)
    found = np.delete(Theta, [2, 6], axis=0)
    rows = outfit.output_rows(oracle, [], hidden[0], found, np.random.default_rng(3), True, missing=2)
    for u in (2, 6):  # measured: 2.0e-7 and 5.9e-8 off
        assert min(_off(r, Theta[u]) for r in rows) < 1e-6, (u, [_off(r, Theta[u]) for r in rows])


def test_the_narrow_features_map_back_to_phi():
    # Where the tentative layer is narrower than its input (12 units, 40 inputs), the fit runs
    # on [relu(z~), z~, 1]: 25 unknowns instead of 53; the row in phi-space reads the
    # input through z~ (a unit of the tentative layer taken with the wrong sign).
    oracle, hidden, Theta = _planted(rare=(4,), on=0.03, d=40, dtype=np.float64)
    (W1, b1), _ = hidden
    flip = np.where(np.arange(12) % 3 == 0, -1.0, 1.0)
    tent = (W1 * flip[:, None], b1 * flip)
    G, kind, _ = outfit._linear([], tent, np.zeros((1, 40)))
    assert kind == "narrow" and G.shape[1] == 25
    # The true rows on the flipped layer: relu(z) = relu(-z) + z, z = W1 x + b1 = -z~.
    W2, b2 = Theta[:, :12], Theta[:, -1]
    neg = flip < 0
    rows_true = np.hstack([W2, W2[:, neg] @ W1[neg], (b2 + W2[:, neg] @ b1[neg])[:, None]])
    found = np.delete(rows_true, 4, axis=0)
    rows = outfit.output_rows(oracle, [], tent, found, np.random.default_rng(0), False)
    assert min(_off(r, rows_true[4]) for r in rows) < 1e-9


def test_nothing_asked_beyond_a_batch_when_every_unit_is_found():
    oracle, hidden, Theta = _planted()
    before = oracle.n_queries
    rows = outfit.output_rows(oracle, [], hidden[0], Theta, np.random.default_rng(1), True)
    assert len(rows) == 0
    assert oracle.n_queries - before == outfit._batch(hidden[0], True)


def test_output_units_adds_the_verified_row_once_per_count():
    oracle, hidden, Theta = _planted(rare=(3,), on=0.05)
    carry = {"Theta": np.delete(Theta, 3, axis=0)}
    rng = np.random.default_rng(2)
    assert outfit.output_units(oracle, [], hidden[0], 8, rng, carry, True) == 1
    assert len(carry["Theta"]) == 8 and _off(carry["Theta"][-1], Theta[3]) < 1e-4
    before = oracle.n_queries
    carry["Theta"] = carry["Theta"][:-1]  # the same count again: not tried twice
    assert outfit.output_units(oracle, [], hidden[0], 8, rng, carry, True) == 0
    assert oracle.n_queries == before


def test_a_wrong_row_does_not_pass():
    # A group whose residual is no one unit's (here: the fit's features miss the layer a unit
    # reads) is dropped by the fit or by the verification: nothing is added.
    oracle, hidden, Theta = _planted(rare=(3,), on=0.05)
    (W1, b1), _ = hidden
    wrong = (np.roll(W1, 1, axis=1), b1)  # a tentative layer that is not the model's
    carry = {"Theta": np.delete(Theta, 3, axis=0)}
    assert outfit.output_units(oracle, [], wrong, 8, np.random.default_rng(2), carry, True) == 0
    assert len(carry["Theta"]) == 7


def test_the_outputs_test_passes_the_unit_and_nothing_far_from_it():
    # Kinks of a rarely active unit show at few predicted crossings in float32; a row that
    # explains where the outputs stand out is its unit's (a row 0.1 off, a unit found again
    # or the row with the wrong orientation explain none of it).
    oracle, hidden, Theta = _planted(rare=(3,), on=0.05)
    found = np.delete(Theta, 3, axis=0)
    rng = np.random.default_rng(4)
    far = Theta[3].copy()
    far[:12] += 0.1 * np.linalg.norm(far[:12]) * rng.standard_normal(12) / np.sqrt(12)
    cands = np.array([Theta[3], far, found[0], -Theta[3]])
    assert outfit._explains(oracle, [], hidden[0], found, cands, rng).tolist() == [True, False, False, False]


def test_from_outputs_asks_only_for_the_last_few_units():
    # Called by the searches every round: nothing asked below ``least`` units found or with
    # more than OUTFIT_UNITS missing; otherwise asked again while rows come.
    oracle, hidden, Theta = _planted(rare=(1, 3), on=0.04, widths=(12, 10))
    found = np.delete(Theta, [1, 3], axis=0)
    rng = np.random.default_rng(5)
    before = oracle.n_queries
    assert len(outfit.from_outputs(oracle, [], hidden[0], found, 10, rng, {}, True, least=9)) == 8
    assert len(outfit.from_outputs(oracle, [], hidden[0], found[:3], 10, rng, {}, True)) == 3
    assert oracle.n_queries == before
    carry: dict = {}
    got = outfit.from_outputs(oracle, [], hidden[0], found, 10, rng, carry, True, least=8)
    assert len(got) == 10 and carry["Theta"] is got and carry["output_rows"] == 2
    for u in (1, 3):
        assert min(_off(r, Theta[u]) for r in got[8:]) < 1e-4


def test_extraction_with_the_outputs_asked_is_certified():
    # A planted float32 20-10-10-10 whose searches leave their last second-layer unit to the
    # outputs on the CPUs measured (SkylakeX, Haswell and Zen kernels: output_rows 1); what
    # any route must give is the certificate at float32.
    hidden, out = rf.planted.deep_relu(20, [10, 10], 10, random_state=3)
    f = rf.planted.relu_function(hidden, out, dtype=np.float32)
    res = rf.extract(f, 20, n_hidden=[10, 10], queries="chosen", random_state=3)
    assert res.status.value == "exact" and res.precision == "float32"
    assert res.residual <= res.diagnostics["certificate_tolerance"]


def test_rows_from_the_outputs_end_the_search(monkeypatch):
    # The driver (no model: its steps stubbed): a search that leaves one unit of the last
    # layer, the outputs give it, and the layer is taken without another search or residual
    # lines; the rows are counted in diagnostics["output_rows"].
    import types

    from relufast._result import Run
    from relufast.chosen import driver

    searches, lines = [], []

    def one_short(oracle, known, tent, k, widths, rng, pool, *, carry, **kw):
        searches.append(1)
        carry["Theta"] = np.ones((k - 1, 9))
        return None

    def outputs(oracle, known, tent, Theta, k, rng, carry, oriented, least):
        assert oriented and least == driver.LAST_UNITS * k
        carry["Theta"], carry["output_rows"] = np.vstack([Theta, np.full(9, 2.0)]), 1
        return carry["Theta"]

    monkeypatch.setattr(driver, "next_layer", one_short)
    monkeypatch.setattr(driver, "from_outputs", outputs)
    monkeypatch.setattr(driver, "measure_again", lambda *a: 0)
    monkeypatch.setattr(driver, "residual_lines", lambda *a: lines.append(1) or 32)
    monkeypatch.setattr(driver, "resolve_signs", lambda W, b, coef, beta, const: (W, b, coef, const, True))
    monkeypatch.setattr(driver, "_refit", lambda oracle, known, tent, *a: (tent, True, np.ones(len(tent[0]), bool)))
    oracle = types.SimpleNamespace(low_precision=True)
    tent, diag = (np.eye(4), np.zeros(4)), {}
    got = driver._peel(
        oracle, [], tent, np.ones(4, bool), 1, (4, 64), np.random.default_rng(0), None, Run("chosen"), diag, 3
    )
    assert got is not None and len(got[1][0]) == 64
    assert searches == [1] and not lines and diag["output_rows"] == 1
