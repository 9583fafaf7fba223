"""Units the data cannot see (dead, pruned) and near-duplicate units."""

import numpy as np
import pytest

import relufast
from relufast import metrics, planted
from relufast.network import Network
from relufast.units import near_duplicates, visible_units

#: Exact recovery of the visible units from float64 outputs.
EXACT_TOL = 1e-9


@pytest.fixture(scope="module")
def net():
    return planted.two_layer(12, 6, 8, random_state=1)


@pytest.fixture(scope="module")
def X():
    return np.random.default_rng(0).standard_normal((20000, 12))


def test_pruned_units_are_named(net, X):
    U = np.array(net.U)
    U[:, [1, 4]] = 0.0  # pruned: zero output columns
    Y = Network(U, net.V).predict(X)
    assert visible_units(X, Y).count == 4
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, Y, n_hidden=6, method="bjw19-gaussian", random_state=0)
    assert res.status == "rank_deficient"
    assert "2 of 6 units are never active on these inputs" in res.message
    assert "n_hidden=4 recovers the rest" in res.message
    res4 = relufast.recover(X, Y, n_hidden=4, method="bjw19-gaussian", random_state=0)
    assert res4.exact
    assert metrics.parameter_error(Network(U[:, [0, 2, 3, 5]], net.V[[0, 2, 3, 5]]), res4).V < EXACT_TOL


def test_dead_units_extract_recovers_the_rest(net):
    b = np.zeros(6)
    b[[0, 3]] = -50.0  # never active on Gaussian queries

    def model(Xq):
        return Network(net.U, net.V, b).predict(Xq)

    res = relufast.extract(model, 12, 6, n_queries=20000, random_state=0)
    assert res.exact and res.n_hidden == 4, res.message
    assert res.message.startswith("2 of 6 units are never active")
    alive = [1, 2, 4, 5]
    assert metrics.parameter_error(Network(net.U[:, alive], net.V[alive]), res).V < EXACT_TOL


def test_near_duplicate_pair_exact_when_resolvable(net, X):
    """cos 0.999: 20000 samples resolve the pair, the theory allows exact recovery."""
    rng = np.random.default_rng(5)
    V = np.array(net.V)
    z = rng.standard_normal(12)
    z -= (z @ V[0]) * V[0]
    V[1] = V[0] + 0.045 * z / np.linalg.norm(z)
    V[1] /= np.linalg.norm(V[1])
    assert 0.998 < V[0] @ V[1] < 0.9995
    res = relufast.recover(X, Network(net.U, V).predict(X), n_hidden=6, method="bjw19-gaussian", random_state=0)
    assert res.exact and metrics.parameter_error(Network(net.U, V), res).V < EXACT_TOL


def test_near_duplicate_pair_named_when_not(net, X):
    """cos 1 - 4.5e-6: the moment cannot tell the pair apart; the message names it."""
    rng = np.random.default_rng(5)
    V = np.array(net.V)
    z = rng.standard_normal(12)
    z -= (z @ V[0]) * V[0]
    V[1] = V[0] + 3e-3 * z / np.linalg.norm(z)
    V[1] /= np.linalg.norm(V[1])
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, Network(net.U, V).predict(X), n_hidden=6, method="bjw19-gaussian", random_state=0)
    assert not res.exact
    assert "near-duplicates" in res.message and "samples" in res.message


def test_near_duplicates_helper():
    V = np.array([[1.0, 0.0], [0.99, 0.1], [0.0, 1.0]])
    pairs = near_duplicates(V)
    assert [(i, j) for i, j, _, _ in pairs] == [(0, 1)]
    assert pairs[0][3] > 100
    assert near_duplicates(np.eye(3)) == []


def test_real_inputs_in_a_subspace_digits():
    """Digits images: pixels zero in every image make X span a subspace; V is reported on
    the row space of X (minimum norm) and the other directions are named."""
    datasets = pytest.importorskip("sklearn.datasets")
    raw = datasets.load_digits().data[:400]
    sd = raw.std(axis=0)
    X = (raw - raw.mean(axis=0)) / np.where(sd > 0, sd, 1.0)  # standardised, as for training
    n, d = X.shape
    rng = np.random.default_rng(3)
    k, m = 3, 4
    V = rng.standard_normal((k, d))
    U = rng.standard_normal((m, k))
    Y = np.maximum(X @ V.T, 0.0) @ U.T
    with pytest.warns(relufast.RelufastWarning, match="not unique"):
        res = relufast.recover(X, Y, n_hidden=k, method="bjw19-enumeration", random_state=0)
    rX = np.linalg.matrix_rank(X)
    assert rX < d
    # An exact fit that the data do not determine is non_identifiable, never exact.
    assert res.status == "non_identifiable" and not res.exact, res.message
    assert res.diagnostics["input_rank"] == rX
    N = res.diagnostics["unidentifiable_directions"]
    assert N.shape == (d - rX, d) and np.abs(X @ N.T).max() < 1e-12
    assert f"{rX} of {d} dimensions" in res.message
    P = np.eye(d) - N.T @ N  # projector on the row space of X
    assert np.abs(res.V @ N.T).max() < 1e-12  # minimum norm: nothing off the row space
    # The returned network still reproduces the outputs on X (a minimum-norm representative).
    np.testing.assert_allclose(res.predict(X), np.maximum(X @ (V @ P).T, 0.0) @ U.T, atol=1e-10)
