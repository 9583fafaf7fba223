"""Networks from the wild: inputs in a subspace for every method, near-duplicate
pairs merged into an effective network, networks trained by scikit-learn in the test and
extracted by queries, and the number of hidden units estimated when not given."""

import warnings

import numpy as np
import pytest
from scipy.linalg import subspace_angles

import relufast
from relufast import metrics, planted
from relufast.network import Network
from relufast.units import merge_near_duplicates

#: Exact on the span: the fit residual and the weights within the span at float64 rounding.
SPAN_TOL = 1e-10
#: Weight error of an exact extraction from float64 queries (certified, refined in float64).
EXACT_TOL = 1e-8
#: Samples too few to separate a pair at cos 0.999 (5000 give an exact result at this seed).
N_FEW = 2000
#: The merged network is the best k - 1 network near the merged pair: its residual within
#: 1e-6 relative of Gauss-Newton's optimum started from the planted pair merged.
OPTIMUM_SLACK = 1 + 1e-6
#: 1 - cos of the other rows: the k - 1 network shifts them a little to absorb the pair's
#: difference (measured 2.4e-5 at cos 0.999).
SHIFT_TOL = 1e-4


def _project_out(net, N):
    """The planted network's minimum-norm representative on the row space (N: null basis)."""
    Vp = net.V - (net.V @ N.T) @ N
    s = np.linalg.norm(Vp, axis=1)
    return Network(net.U * s[None, :], Vp / s[:, None])


@pytest.fixture(scope="module")
def subspace_case():
    net = planted.two_layer(12, 4, 6, random_state=7)
    X = np.random.default_rng(1).standard_normal((20000, 12))
    zero = [2, 5, 9]
    X[:, zero] = 0.0  # like blank pixels: zero in every sample
    return net, X, zero


def test_gaussian_inputs_with_zero_columns(subspace_case):
    """bjw19-gaussian on X with 3 zero columns (d = 12, k = 4, m = 6): an exact fit on the
    span, non_identifiable, the minimum-norm rows and the 3 null directions listed."""
    net, X, zero = subspace_case
    Y = net.predict(X)
    with pytest.warns(relufast.RelufastWarning, match="not unique"):
        res = relufast.recover(X, Y, n_hidden=4, method="bjw19-gaussian", random_state=0)
    assert res.status == "non_identifiable" and not res.exact and res.V is not None, res.message
    assert res.residual < SPAN_TOL and res.diagnostics["span_residual"] < SPAN_TOL
    assert res.diagnostics["input_rank"] == 9
    N = res.diagnostics["unidentifiable_directions"]
    np.testing.assert_array_equal(N, np.eye(12)[zero])
    assert np.all(res.V[:, zero] == 0.0)  # minimum norm, exactly
    assert "9 of 12 dimensions" in res.message
    err = metrics.parameter_error(_project_out(net, N), res)
    assert err.V < SPAN_TOL and err.U < SPAN_TOL


def test_rotated_subspace_every_units_free_method(subspace_case):
    """A null space that is not coordinate-aligned (X times a projector of rank 10), for
    bjw19-gaussian and atv21 (which ran on such data as non_identifiable without a network).
    The reported null directions may be any orthonormal basis of span(Q)."""
    net, _, _ = subspace_case
    rng = np.random.default_rng(2)
    Q = np.linalg.qr(rng.standard_normal((12, 2)))[0]
    X = rng.standard_normal((40000, 12))
    X -= (X @ Q) @ Q.T
    Y = net.predict(X)
    for method in ("bjw19-gaussian", "atv21"):
        with pytest.warns(relufast.RelufastWarning, match="not unique"):
            res = relufast.recover(X, Y, n_hidden=4, method=method, random_state=0)
        assert res.status == "non_identifiable" and res.residual < SPAN_TOL, (method, res.message)
        N = res.diagnostics["unidentifiable_directions"]
        # Any orthonormal basis of span(Q) is right: compare the spans by principal angles.
        assert N.shape == (2, 12) and np.allclose(N @ N.T, np.eye(2), atol=1e-12)
        assert subspace_angles(N.T, Q).max() < 1e-8 and np.abs(X @ N.T).max() < 1e-10
        assert np.abs(res.V @ N.T).max() < 1e-12
        err = metrics.parameter_error(_project_out(net, N), res)
        assert err.V < SPAN_TOL, (method, err)


def test_subspace_below_n_hidden_is_left_to_the_method():
    """Inputs spanning fewer than n_hidden dimensions: no restriction (the method reports)."""
    net = planted.two_layer(6, 4, 5, random_state=0)
    X = np.random.default_rng(0).standard_normal((3000, 6))
    X[:, 3:] = 0.0
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, net.predict(X), n_hidden=4, method="bjw19-gaussian")
    assert not res.exact


def _near_duplicate(net, cos_target, seed=5):
    rng = np.random.default_rng(seed)
    V = np.array(net.V)
    z = rng.standard_normal(V.shape[1])
    z -= (z @ V[0]) * V[0]
    theta = np.arccos(cos_target)
    V[1] = np.cos(theta) * V[0] + np.sin(theta) * z / np.linalg.norm(z)
    return Network(net.U, V)


def test_near_duplicate_pair_merged_when_unresolvable():
    """A planted pair at cos 0.9999 (angle 0.014) and too few samples to separate it: the
    result is the merged effective network (5 units), approximate, naming the pair. (At
    cos 0.999 the completion rounds now separate the pair from the same 2,000 samples.)"""
    from relufast.stages.fit import fit_network, polish

    net = _near_duplicate(planted.two_layer(12, 6, 8, random_state=1), 0.9999)
    X = np.random.default_rng(0).standard_normal((N_FEW, 12))
    Y = net.predict(X)
    with pytest.warns(relufast.RelufastWarning) as caught:
        res = relufast.recover(X, Y, n_hidden=6, method="bjw19-gaussian", random_state=0)
    assert any("Merged near-duplicates" in str(w.message) for w in caught)
    assert res.status == "approximate" and res.n_hidden == 5 and not res.exact, res.message
    assert res.diagnostics["merged_pairs"] and "samples would separate them" in res.message
    assert res.residual < res.diagnostics["unmerged"]["residual"]
    # The oracle: the planted pair merged, refitted and polished (the best 5-unit network).
    Vm = np.vstack([net.V[0] + net.V[1], net.V[2:]])
    Vm /= np.linalg.norm(Vm, axis=1, keepdims=True)
    _, V_best = polish(X, Y, fit_network(X, Y, Vm).U, Vm, n_iter=30)
    assert res.residual <= OPTIMUM_SLACK * fit_network(X, Y, V_best).residual
    best = (res.V @ net.V.T).max(axis=0)
    assert np.all(best[2:] > 1 - SHIFT_TOL)  # the other planted rows, each near a returned row
    assert np.all(best[:2] > 0.999)  # the merged unit lies within the pair's angle of both


def test_merge_near_duplicates_helper():
    net = _near_duplicate(planted.two_layer(8, 4, 5, random_state=3), 0.9995)
    X = np.random.default_rng(1).standard_normal((5000, 8))
    out = merge_near_duplicates(X, net.predict(X), net)
    assert out.network.n_hidden == 3 and [p[:2] for p in out.pairs] == [(0, 1)]
    assert 0 < out.residual < 1e-2  # a pair 0.03 rad apart: differs on 1% of the inputs
    assert merge_near_duplicates(X, net.predict(X), planted.two_layer(8, 4, 5, random_state=3)) is None
    with pytest.raises(ValueError, match="expected X of shape"):
        merge_near_duplicates(X[:, :3], net.predict(X), net)


def _trained_classifier(X, y, k, seed=0):
    sklearn_nn = pytest.importorskip("sklearn.neural_network")
    from sklearn.exceptions import ConvergenceWarning

    mlp = sklearn_nn.MLPClassifier(hidden_layer_sizes=(k,), activation="relu", max_iter=300, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp.fit(X, y)
    return mlp


def test_extract_sklearn_classifier_trained_in_the_test():
    """A binary MLPClassifier (d = 5, k = 3, biases) trained here on Gaussian data, extracted
    through relufast.extract before its logistic output: exact to float64 (m = 1: atv21)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 5))
    y = (np.sin(X @ rng.standard_normal(5)) > 0).astype(int)
    mlp = _trained_classifier(X, y, 3)
    teacher = relufast.from_sklearn(mlp)
    res = relufast.extract(mlp, 5, 3, queries="random", n_queries=40000, random_state=0)
    assert res.exact and res.precision == "float64", res.message
    err = metrics.parameter_error(teacher, res)
    assert err.V < EXACT_TOL and err.U < EXACT_TOL
    Xt = rng.standard_normal((100, 5))
    np.testing.assert_allclose(res.predict(Xt), teacher.predict(Xt), atol=1e-8)


def test_extract_estimates_the_number_of_units():
    """n_hidden=None on a planted network with 2 dead units: 4 visible, said and recovered."""
    net = planted.two_layer(10, 6, 8, random_state=4)
    b = np.zeros(6)
    b[[1, 4]] = -50.0  # never active on Gaussian queries

    def model(Xq):
        return Network(net.U, net.V, b).predict(Xq)

    res = relufast.extract(model, 10, n_queries=20000, random_state=0)
    assert res.exact and res.n_hidden == 4 and res.diagnostics["visible_units"] == 4, res.message
    assert res.message.startswith("n_hidden not given: 4 hidden unit(s) visible")
    alive = [0, 2, 3, 5]
    assert metrics.parameter_error(Network(net.U[:, alive], net.V[alive]), res).V < EXACT_TOL


def test_extract_softmax_classifier_trained_on_wine():
    """A 3-class MLPClassifier (d = 13, k = 4) trained on the bundled wine data, queried on
    Gaussian inputs through its centred log-probabilities (rank 2 < k: atv21): exact."""
    datasets = pytest.importorskip("sklearn.datasets")
    X, y = datasets.load_wine(return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    mlp = _trained_classifier(X, y, 4)
    res = relufast.extract(mlp, 13, 4, queries="random", n_queries=40000, random_state=0)
    assert res.exact and res.n_hidden == 4 and res.U.shape == (3, 4), res.message
    logits = relufast.from_sklearn(mlp).predict(X)
    np.testing.assert_allclose(res.predict(X), logits - logits.mean(axis=1, keepdims=True), atol=1e-12)


def test_parameter_error_names_what_to_compare_for_a_deep_teacher():
    """GP19's teacher f = P(u(W x - t)) has no output layer: parameter_error(res, teacher)
    says to compare rows (it raised AttributeError: 'str' object has no attribute 'degree')."""
    from relufast.algorithms.gp19 import row_angles

    teacher = planted.deep_teacher(6, 3, threshold=2.0, random_state=0)
    estimate = Network(np.ones((1, 3)), teacher.W + 1e-3)
    with pytest.raises(TypeError, match="row_angles"):
        metrics.parameter_error(estimate, teacher)
    with pytest.raises(TypeError, match="not a two-layer network"):
        metrics.parameter_error(teacher, estimate)
    assert 0 < row_angles(estimate.V, teacher.W).max() < 1e-2
