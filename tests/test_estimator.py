"""relufast.estimator.ReluNetRegressor: a scikit-learn estimator over relufast.recover:
planted recovery, pipelines and grid searches beside MLPRegressor, and
scikit-learn's own estimator checks."""

import pickle
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn.base import clone  # noqa: E402
from sklearn.model_selection import GridSearchCV  # noqa: E402
from sklearn.neural_network import MLPRegressor  # noqa: E402
from sklearn.pipeline import Pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

import relufast as rf  # noqa: E402
from relufast.estimator import ReluNetRegressor  # noqa: E402

#: Exact recovery: weights and predictions at float64 rounding (plus conditioning).
EXACT_TOL = 1e-10


@pytest.fixture(scope="module")
def planted():
    net = rf.planted.two_layer(d=10, k=4, m=6, random_state=0)
    X, Y = net.sample(6000, random_state=1)
    return net, X, Y


def test_fit_recovers_a_planted_network(planted):
    net, X, Y = planted
    est = ReluNetRegressor(random_state=0)
    assert est.fit(X, Y) is est
    assert est.status_ == "exact" and est.exact_ and est.n_hidden_ == 4  # n_hidden from the outputs
    assert est.residual_ < EXACT_TOL and est.n_features_in_ == 10
    err = rf.metrics.parameter_error((est.U_, est.V_, est.b_, est.c_), net)
    assert err.U < EXACT_TOL and err.V < EXACT_TOL
    X_new = np.random.default_rng(7).standard_normal((500, 10))
    np.testing.assert_allclose(est.predict(X_new), net.predict(X_new), atol=EXACT_TOL * np.abs(Y).max())
    assert est.score(X_new, net.predict(X_new)) == pytest.approx(1.0, abs=1e-12)
    assert est.result_.status == "exact" and est.method_ == est.result_.method


def test_single_output_with_biases_predicts_one_dimensional():
    net = rf.planted.two_layer(d=8, k=4, m=1, bias="random", offset="random", random_state=1)
    X, Y = net.sample(60000, random_state=1)
    est = ReluNetRegressor(n_hidden=4, random_state=0).fit(X, Y[:, 0])
    assert est.status_ == "exact" and est.method_ == "atv21", est.result_.message
    assert est.predict(X[:5]).shape == (5,)
    assert rf.metrics.parameter_error(est.result_, net).V < EXACT_TOL


def test_params_clone_and_pickle(planted):
    _, X, Y = planted
    est = ReluNetRegressor(n_hidden=4, method="bjw19-gaussian", random_state=0, options={"tol": 1e-9})
    assert est.get_params() == {
        "n_hidden": 4,
        "method": "bjw19-gaussian",
        "time_limit": None,
        "random_state": 0,
        "n_jobs": None,
        "options": {"tol": 1e-9},
    }
    assert est.set_params(n_hidden=3) is est and est.n_hidden == 3
    copy = clone(est.set_params(n_hidden=4))
    assert copy.get_params() == est.get_params() and not hasattr(copy, "result_")
    copy.fit(X, Y)
    back = pickle.loads(pickle.dumps(copy))  # the RecoveryResult's read-only mappings too
    assert back.result_.status == "exact" and dict(back.result_.counts) == dict(copy.result_.counts)
    np.testing.assert_array_equal(back.predict(X[:50]), copy.predict(X[:50]))


def test_random_targets_fit_predict_and_warn():
    """Random Y is no ReLU network: fit and predict still work; the status says it and a
    RelufastWarning explains why."""
    rng = np.random.default_rng(3)
    X, y = rng.standard_normal((300, 5)), rng.standard_normal(300)
    with pytest.warns(rf.RelufastWarning):
        est = ReluNetRegressor(n_hidden=2, random_state=0, time_limit=2).fit(X, y)
    assert est.status_ != "exact" and not est.exact_
    assert est.predict(X).shape == (300,) and np.all(np.isfinite(est.predict(X)))


def test_no_network_predicts_the_mean_and_warns():
    """A method that returns no network (zero outputs: rank 0 < n_hidden) leaves a usable estimator."""
    X = np.random.default_rng(4).standard_normal((200, 4))
    with pytest.warns(rf.RelufastWarning) as caught:  # the method's own warning, then the estimator's
        est = ReluNetRegressor(n_hidden=2, method="bjw19-gaussian").fit(X, np.zeros((200, 2)))
    assert any("predict returns the mean" in str(w.message) for w in caught)
    assert est.U_ is None and est.status_ != "exact"
    np.testing.assert_array_equal(est.predict(X[:3]), np.zeros((3, 2)))


@pytest.mark.filterwarnings(
    # n_hidden = 3 < 4 planted units has no exact fit (warned), and MLPRegressor stops at max_iter.
    "ignore::relufast.RelufastWarning",
    "ignore::sklearn.exceptions.ConvergenceWarning",
)
def test_grid_search_in_a_pipeline_beside_mlp(planted):
    """StandardScaler centres X, which gives the network hidden biases b = -V mean / sd:
    atv21 recovers them. The grid picks relufast with the planted k over k = 3 and over an
    MLPRegressor of the same shape."""
    net, X, Y = planted
    pipe = Pipeline([("scale", StandardScaler()), ("model", ReluNetRegressor())])
    grid = GridSearchCV(
        pipe,
        [
            {"model": [ReluNetRegressor(method="atv21", random_state=0)], "model__n_hidden": [3, 4]},
            {"model": [MLPRegressor(hidden_layer_sizes=(4,), max_iter=200, random_state=0)]},
        ],
        cv=3,
    )
    grid.fit(X, Y)
    scores = grid.cv_results_["mean_test_score"]
    assert grid.best_params_["model__n_hidden"] == 4 and isinstance(grid.best_estimator_[-1], ReluNetRegressor)
    assert scores[1] == pytest.approx(1.0, abs=1e-10) and scores[0] < 0.99 and scores[2] < scores[1]
    best = grid.best_estimator_[-1]
    assert best.status_ == "exact"
    X_new = np.random.default_rng(8).standard_normal((200, 10))
    np.testing.assert_allclose(grid.predict(X_new), net.predict(X_new), atol=1e-8)


def test_import_relufast_does_not_import_sklearn():
    code = (
        "import sys, relufast; a = 'sklearn' in sys.modules; "
        "est = relufast.ReluNetRegressor; print(a, 'sklearn' in sys.modules, est.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "relufast.estimator"]


#: None of scikit-learn's checks fails. What the method's nature changes is declared by
#: tags instead: ``poor_score`` (random targets are no ReLU network, so the certified fit
#: does not exist and the estimate can score below the checks' 0.5), multi-output targets.
#: The checks fit random data: the RelufastWarnings that explain each non-exact status are
#: expected there.
EXPECTED_FAILED_CHECKS: dict = {}


@pytest.mark.filterwarnings("ignore::relufast.RelufastWarning")
@parametrize_with_checks(
    [ReluNetRegressor(time_limit=2, random_state=0)], expected_failed_checks=lambda est: EXPECTED_FAILED_CHECKS
)
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)
