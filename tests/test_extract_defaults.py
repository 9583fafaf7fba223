"""What ``relufast.extract(model, n_features)`` does by default: the query mode and the widths
read from the model, the classifier bridge, the runs stopped before they start, and one check
of the model's answers for both query modes."""

import warnings

import numpy as np
import pytest

import relufast as rf
from relufast import bridges

sklearn_nn = pytest.importorskip("sklearn.neural_network")
datasets = pytest.importorskip("sklearn.datasets")
from sklearn.exceptions import ConvergenceWarning  # noqa: E402

#: Largest output error of an extracted float64 network on fresh inputs, relative to the outputs.
EXACT_TOL = 1e-9


def _data(name):
    X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    sd = X.std(axis=0)
    return (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0), y


def _fitted(name, widths, max_iter=30, **kw):
    """An sklearn MLP (sklearn's default initialisation) trained briefly on a bundled data set."""
    X, y = _data(name)
    est = sklearn_nn.MLPRegressor if name == "diabetes" else sklearn_nn.MLPClassifier
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est(hidden_layer_sizes=widths, max_iter=max_iter, random_state=0, **kw).fit(X, y), X


def _planted(d, widths, m, seed):
    """A random ReLU network with biases (:func:`relufast.planted.deep_relu`) as a plain callable."""
    return rf.planted.relu_function(*rf.planted.deep_relu(d, widths, m, random_state=seed))


def _forward(layers, X):
    for W, b in layers[:-1]:
        X = np.maximum(X @ W.T + b, 0.0)
    W, b = layers[-1]
    return X @ W.T + b


# -- widths from the model, chosen queries by default -------------------------------------


# (A classifier is queried through predict_proba, whose logits are lost where the
# probabilities round to 0 or 1: classifiers have tests of their own below.)
@pytest.mark.parametrize("name,widths", [("diabetes", (16, 8)), ("diabetes", (8,)), ("diabetes", (6,))])
def test_sklearn_mlp_widths_read_from_the_model(name, widths):
    """extract(mlp, d) without n_hidden: the widths come from the architecture, chosen
    queries are used, and the network is certified and equals the model's (logits for a
    classifier). Before: random queries with the unit count estimated from the outputs."""
    mlp, X = _fitted(name, widths)
    res = rf.extract(mlp, X.shape[1], random_state=0)
    assert res.exact, res.message
    assert res.diagnostics["widths_from"] == "model" and res.diagnostics["queries"] == "chosen"
    assert res.message.startswith(f"Hidden widths {widths} read from the model")
    Xt = np.random.default_rng(5).standard_normal((300, X.shape[1]))
    want = bridges.logit_function(mlp)(Xt) if name != "diabetes" else mlp.predict(Xt)[:, None]
    got = res.predict(Xt)
    assert np.max(np.abs(got.reshape(want.shape) - want)) <= EXACT_TOL * np.max(np.abs(want))


@pytest.mark.parametrize("dtype_name,dims", [("float32", (30, 16, 1)), ("float64", (10, 16, 8, 1))])
def test_torch_sequential_widths_read_from_the_model(dtype_name, dims):
    """torch nn.Sequential at torch's default initialisation with the inputs of
    breast_cancer (30) and diabetes (10): widths from the Linear layers (nested Sequential
    included), certified at the model's precision."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    nn = torch.nn
    mods = [nn.Sequential(nn.Linear(i, o), nn.ReLU()) for i, o in zip(dims[:-2], dims[1:-1])]
    model = nn.Sequential(*mods, nn.Linear(dims[-2], dims[-1])).to(getattr(torch, dtype_name))
    assert bridges.hidden_widths(model) == dims[1:-1]
    res = rf.extract(model, dims[0], random_state=0)
    assert res.exact and res.precision == dtype_name, res.message
    assert res.diagnostics["widths_from"] == "model" and res.diagnostics["queries"] == "chosen"
    Xt = np.random.default_rng(1).standard_normal((200, dims[0]))
    with torch.no_grad():
        want = model(torch.from_numpy(Xt).to(getattr(torch, dtype_name))).double().numpy()
    tol = EXACT_TOL if dtype_name == "float64" else 1e-4
    assert np.max(np.abs(res.predict(Xt) - want)) <= tol * np.max(np.abs(want))


def test_hidden_widths_reads_only_relu_architectures():
    torch = pytest.importorskip("torch")
    nn = torch.nn
    assert bridges.hidden_widths(nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 2))) == (7,)
    for bad, found in [
        (nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2)), "Tanh"),
        (nn.Sequential(nn.Linear(5, 7), nn.Linear(7, 2)), "without a ReLU"),
        (nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Dropout(0.5), nn.Linear(7, 2)), "training mode"),
        (nn.Sequential(nn.Linear(5, 2)), "no hidden layer"),
    ]:
        arch = bridges.architecture(bad)
        assert arch.widths is None and found in arch.problem
        assert bridges.hidden_widths(bad) is None
    assert bridges.hidden_widths(nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Dropout(0.5), nn.Linear(7, 2)).eval())
    assert bridges.hidden_widths(lambda X: X) is None
    assert bridges.hidden_widths(nn.Linear(5, 2)) is None  # its forward is its own: not read
    mlp, _ = _fitted("diabetes", (4, 3), max_iter=2)
    assert bridges.hidden_widths(mlp) == (4, 3)
    tanh, _ = _fitted("diabetes", (4,), max_iter=2, activation="tanh")
    assert bridges.hidden_widths(tanh) is None


def test_non_relu_models_are_refused_when_chosen_queries_would_be_used():
    """Before: a tanh MLP went to random queries and ended 'failed' after its whole budget."""
    tanh, X = _fitted("diabetes", (6,), max_iter=5, activation="tanh")
    with pytest.raises(ValueError, match=r"activation='tanh'"):
        rf.extract(tanh, X.shape[1], max_queries=40_000, random_state=0)
    torch = pytest.importorskip("torch")
    nn = torch.nn
    with pytest.raises(ValueError, match="Sigmoid"):
        rf.extract(nn.Sequential(nn.Linear(4, 3), nn.Sigmoid(), nn.Linear(3, 1)), 4, max_queries=40_000)


def test_n_features_is_checked_against_the_model():
    """Before: sklearn's own error from inside the first query."""
    mlp, X = _fitted("diabetes", (4,), max_iter=2)
    with pytest.raises(ValueError, match="n_features = 12, but the model's first layer takes 10 features"):
        rf.extract(mlp, 12, random_state=0)


def test_deep_widths_go_to_chosen_queries_and_random_says_what_to_pass():
    """A callable with n_hidden=(6, 4): chosen queries by default (before: ValueError). Asked
    for random queries, the error names the argument to pass."""
    f = _planted(10, (6, 4), 2, seed=1)
    res = rf.extract(f, 10, (6, 4), random_state=0)
    assert res.exact and res.diagnostics["queries"] == "chosen" and res.diagnostics["widths_from"] == "argument"
    with pytest.raises(ValueError, match=r"Pass queries='chosen' \(or leave queries unset\)"):
        rf.extract(f, 10, (6, 4), queries="random")


def test_random_queries_on_more_units_than_inputs_stop_before_querying():
    """n_hidden > d with Gaussian queries: 'unsupported' at once, no query made, and the
    message says what to pass (before: d units fitted until max_queries). Without
    queries='random' the default goes to chosen queries, which extract it."""
    f = _planted(4, (6,), 2, seed=6)
    calls = []

    def counted(X):
        calls.append(len(X))
        return f(X)

    with pytest.warns(rf.RelufastWarning, match="n_hidden = 6 > d = 4"):
        res = rf.extract(counted, 4, 6, queries="random", max_queries=40_000, random_state=0)
    assert res.status.value == "unsupported" and calls == [] and "queries='chosen'" in res.message
    res = rf.extract(f, 4, 6, random_state=0)
    assert res.exact and res.diagnostics["queries"] == "chosen", res.message


def test_random_queries_without_n_hidden_say_pass_n_hidden():
    """A one-output model with two rarely active units (bias -2): Gaussian queries show 2 of
    its 4 units and the fit is not exact; the message says to pass n_hidden (before: it
    counted units and said nothing of it)."""
    rng = np.random.default_rng(0)
    V = rng.standard_normal((4, 5))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    b, u = np.array([0.2, -0.1, -2.0, -2.0]), rng.standard_normal(4)

    def f(X):
        return np.maximum(X @ V.T + b, 0.0) @ u

    with pytest.warns(rf.RelufastWarning, match="pass n_hidden"):
        res = rf.extract(f, 5, max_queries=20_000, random_state=0)
    assert not res.exact and res.diagnostics["visible_units"] == 2
    assert res.diagnostics["widths_from"] == "visible units" and res.diagnostics["queries"] == "random"
    assert "if the model has more, pass n_hidden" in res.message


# -- the classifier bridge -----------------------------------------------------------------


class _ProbaOnly:
    """A fitted classifier seen only through predict_proba (no weights to read)."""

    def __init__(self, clf):
        self._clf = clf
        self.classes_ = clf.classes_
        self.out_activation_ = clf.out_activation_
        self.n_outputs_ = clf.n_outputs_

    def predict_proba(self, X):
        return self._clf.predict_proba(X)


@pytest.mark.parametrize("name", ["breast_cancer", "digits"])
def test_logit_function_from_predict_proba_only(name):
    """Binary: the logit; softmax: the logits minus their mean per input. Checked against
    the weights (read here by the test only)."""
    clf, X = _fitted(name, (8,))
    f = bridges.logit_function(_ProbaOnly(clf))
    layers = bridges.layers_of(clf)
    Xt = np.random.default_rng(2).standard_normal((300, X.shape[1]))
    z = _forward(layers, Xt)
    want = z if z.shape[1] == 1 else z - z.mean(axis=1, keepdims=True)
    got = f(Xt)
    assert got.shape == want.shape
    # Precision of the bridge: eps (1 + e^|z|) for the logistic, eps |z| for the softmax.
    bound = 1e-14 * (np.exp(np.abs(z).max()) if z.shape[1] == 1 else np.abs(z).max()) + 1e-13
    assert np.max(np.abs(got - want)) <= bound


def test_binary_classifier_is_not_exact_and_says_why():
    """breast_cancer (binary, 30-8-1): a logistic logit is read from p to about eps (1 + e^z),
    so away from the decision boundary it is not known to float64; the certificate keeps to
    the scales where p does not round to 1 and the message names the cause (before: a
    ValueError at the certificate's far probes, where the logit is lost)."""
    clf, X = _fitted("breast_cancer", (8,))
    with pytest.warns(rf.RelufastWarning, match="binary classifier"):
        res = rf.extract(clf, X.shape[1], random_state=0)
    assert not res.exact and res.status in ("approximate", "failed")
    assert "1 - p loses its digits" in res.message


def test_binary_classifier_with_two_layers_ends_approximate_not_with_an_error():
    """breast_cancer 30-16-8-1 (50 iterations): the deeper layer's search lines (norms up to
    60) and the output layer's fit points (scale 10) reached saturated probabilities and
    stopped extract with a ValueError; lines are now halved, and fit points drawn in, where
    the model does not answer, and the result is the bridge's `approximate`."""
    clf, X = _fitted("breast_cancer", (16, 8), max_iter=50)
    with pytest.warns(rf.RelufastWarning, match="binary classifier"):
        res = rf.extract(clf, X.shape[1], random_state=0)
    assert res.status == "approximate" and res.residual < 1e-6, res.message
    assert res.n_hidden == (16, 8)


@pytest.mark.parametrize("widths", [(16,), (16, 8)])
def test_trained_multiclass_classifier_certified_where_its_logits_can_be_read(widths):
    """digits trained to convergence (64-16-10, 64-16-8-10): the softmax's probabilities
    underflow beyond logit differences of about 745, which the certificate's probes at
    scale 1e4 reached (before: a ValueError naming predict_proba). The probes now stop at the
    largest scale where the extracted network's logit differences stay under 600."""
    clf, X = _fitted("digits", widths, max_iter=500)
    res = rf.extract(clf, X.shape[1], random_state=0)
    assert res.exact, res.message
    top = res.diagnostics["certificate_scales"]
    assert 10 <= max(top) < 1e4  # bounded, beyond the data's scale
    assert "the largest scale at which the model's outputs can be read" in res.message
    logits = bridges.logit_function(clf)
    got = res.predict(X)
    got -= got.mean(axis=1, keepdims=True)
    assert np.abs(got - logits(X)).max() <= 1e-12 * np.abs(logits(X)).max()


def test_digits_classifier_at_sklearn_default_width_two_layers_is_exact():
    """digits 64-100-100-10 (sklearn's default width, 50 iterations; widths from the model): a
    first layer wider than the input, whose signs come from the chains that follow the second
    layer's boundaries. It ended `failed` at its 2 million queries while one first-layer unit,
    crossed where another kink shared its grid cells on every line of the search, was
    missing (bench/test_bench_defaults.py: exact in 869,341 queries)."""
    clf, X = _fitted("digits", (100, 100), max_iter=50)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        res = rf.extract(clf, X.shape[1], random_state=0)
    assert res.exact, res.message
    assert res.n_hidden == (100, 100)
    assert res.counts["queries"] < 2_000_000
    logits = bridges.logit_function(clf)
    got = res.predict(X[:200])
    want = logits(X[:200])
    assert np.abs((got - got.mean(axis=1, keepdims=True)) - want).max() <= 1e-9 * np.abs(want).max()


def test_digits_classifier_with_three_hidden_layers_is_exact():
    """digits 64-16-8-8-10 (50 iterations; widths from the model). The clustering of the
    second layer proposed pieces of third-layer boundaries as second-layer units in every
    round, each tested afresh on four lines, until one passed: the second layer came out
    with a wrong unit and the third failed (`failed` at 1.3 million queries, or the grouping's
    full SVDs ran past 90 s). Each proposal's record of hits now stays with it."""
    clf, X = _fitted("digits", (16, 8, 8), max_iter=50)
    res = rf.extract(clf, X.shape[1], random_state=0)
    assert res.exact, res.message
    assert res.n_hidden == (16, 8, 8)
    assert res.counts["queries"] < 200_000
    logits = bridges.logit_function(clf)
    got, want = res.predict(X[:200]), logits(X[:200])
    assert np.abs((got - got.mean(axis=1, keepdims=True)) - want).max() <= 1e-9 * np.abs(want).max()


def test_close_network_polished_beside_its_boundaries_and_certified_afresh():
    """diabetes 10-16-8-1 (50 iterations): a second-layer row refitted only in part kept an
    error the fit points, drawn away from the boundaries, did not show; the certificate
    found it beside that unit's boundary (`approximate` at 7.8e-14, tolerance 2.1e-14). A
    network that close is polished again with points beside every boundary and certified
    on fresh probes."""
    mlp, X = _fitted("diabetes", (16, 8), max_iter=50)
    res = rf.extract(mlp, X.shape[1], random_state=0)
    assert res.exact, res.message
    assert "polished on" in res.diagnostics["repair"]
    assert 0.0 < res.seconds["repair"] < res.seconds["total"]  # timed, and inside the run
    Xt = np.random.default_rng(2).standard_normal((1000, X.shape[1]))
    want = mlp.predict(Xt)
    assert np.abs(res.predict(Xt)[:, 0] - want).max() <= EXACT_TOL * np.abs(want).max()


def test_saturated_classifier_is_a_clear_error():
    """Probabilities that round to 0 or 1 carry no logit: extract stops with the inputs' norms
    (before: clipped logits fitted as if exact, then 'outside the class')."""
    clf, X = _fitted("breast_cancer", (8,))
    f = bridges.logit_function(clf)
    assert np.isinf(f(1e4 * np.ones((1, X.shape[1])))).all()
    with pytest.raises(ValueError, match=r"non-finite outputs \(.*inf.*\) .* at input norms"):
        rf.extract(lambda Z: f(1e4 * Z), X.shape[1], 8, queries="random", n_queries=1000, random_state=0)


# -- one check of the model's answers, both modes ----------------------------------------------


def _bad_models():
    f = _planted(6, (3,), 2, seed=1)
    return {
        "none": (lambda X: None, r"shape \(\d+, m\) or \(\d+,\).*it returned None"),
        "scalar": (lambda X: 1.0, r"it returned a scalar"),
        "rows": (lambda X: f(X)[:-1], r"shape \(\d+, m\) or \(\d+,\).*it returned shape \(\d+, 2\)"),
        "transposed": (lambda X: f(X).T, r"one row per query, shape \(\d+, m\).*the transpose"),
        "nan": (
            lambda X: np.where(np.linalg.norm(X, axis=1, keepdims=True) > 3.0, np.nan, f(X)),
            r"non-finite outputs \(NaN\) for \d+ of \d+ queries, at input norms 3",
        ),
    }


@pytest.mark.parametrize("queries", ["random", "chosen"])
@pytest.mark.parametrize("case", ["none", "scalar", "rows", "transposed", "nan"])
def test_wrong_answers_are_named(case, queries):
    """Before: NumPy's reshape error, LinAlgError (NaN, random), FloatingPointError (NaN,
    chosen), and a transposed answer reshaped silently."""
    model, pattern = _bad_models()[case]
    with pytest.raises(ValueError, match=pattern):
        rf.extract(model, 6, 3, queries=queries, random_state=0, **({"n_queries": 2000} if queries == "random" else {}))


def test_outputs_whose_width_changes_are_named():
    f = _planted(6, (3,), 2, seed=1)
    calls = []

    def changing(X):
        calls.append(1)
        return f(X) if len(calls) == 1 else f(X)[:, :1]

    with pytest.raises(ValueError, match=r"1 outputs per query; earlier calls returned 2"):
        rf.extract(changing, 6, 3, queries="random", n_queries=2000, batch_size=1000, random_state=0)


# -- ReluNetRegressor: fewer outputs than units on data that are not Gaussian -------------------


def test_estimator_names_the_input_law_when_m_is_below_k():
    """diabetes (m = 1 < k = 5, X not Gaussian): the warning and the message say why (before:
    'never active' units and near-duplicates)."""
    from relufast.estimator import ReluNetRegressor

    X, y = datasets.load_diabetes(return_X_y=True)
    with pytest.warns(rf.RelufastWarning) as record:
        est = ReluNetRegressor(n_hidden=5, random_state=0).fit(X, y)
    assert not est.exact_
    first = str(record[0].message)
    assert first.startswith("no certified network: with m = 1 output(s) < n_hidden = 5")
    assert "X is not standard Gaussian: column" in first and "fit n_hidden <= 1" in first
    assert est.result_.message == first
