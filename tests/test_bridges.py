"""Bridges to scikit-learn and PyTorch, and query-mode extraction of networks trained in the test."""

import subprocess
import sys
import warnings

import numpy as np
import pytest

import relufast
from relufast import metrics
from relufast.network import Network

sklearn_nn = pytest.importorskip("sklearn.neural_network")
from sklearn.exceptions import ConvergenceWarning  # noqa: E402

#: Round trips copy weights: equal to float64 rounding.
ROUNDTRIP_TOL = 1e-12
#: Weight error of an extraction from float64 queries: certified exact, refined in float64.
EXACT_TOL = 1e-8
#: Weight error of an extraction from float32 queries: limited by float32 rounding (6e-8).
F32_TOL = 1e-5


def trained_regressor(d=6, k=4, m=2, seed=0, n=400, max_iter=200):
    """A small MLPRegressor trained on a random teacher (seconds)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    Y = np.tanh(X @ rng.standard_normal((d, m)))
    mlp = sklearn_nn.MLPRegressor(hidden_layer_sizes=(k,), activation="relu", max_iter=max_iter, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp.fit(X, Y if m > 1 else Y[:, 0])
    return mlp


def test_import_does_not_import_torch_or_sklearn():
    code = "import sys, relufast; print('torch' in sys.modules, 'sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_from_sklearn_predicts_like_the_model():
    mlp = trained_regressor()
    net = relufast.from_sklearn(mlp)
    X = np.random.default_rng(1).standard_normal((50, 6))
    np.testing.assert_allclose(net.predict(X), mlp.predict(X), atol=ROUNDTRIP_TOL, rtol=ROUNDTRIP_TOL)
    assert (net.n_features, net.n_hidden, net.n_outputs) == (6, 4, 2)


def test_to_sklearn_roundtrip():
    net = Network(np.arange(6.0).reshape(2, 3) - 2, np.eye(3, 4) + 0.1, [0.1, -0.2, 0.3], [1.0, -1.0])
    mlp = relufast.bridges.to_sklearn(net)
    X = np.random.default_rng(2).standard_normal((20, 4))
    np.testing.assert_allclose(mlp.predict(X), net.predict(X), atol=ROUNDTRIP_TOL)
    back = relufast.from_sklearn(mlp)
    np.testing.assert_allclose(back.V, net.V)


def test_from_sklearn_validation():
    with pytest.raises(TypeError, match="fitted sklearn MLPRegressor"):
        relufast.from_sklearn(sklearn_nn.MLPRegressor())
    mlp = sklearn_nn.MLPRegressor(hidden_layer_sizes=(3, 3), max_iter=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp.fit(np.random.default_rng(0).standard_normal((30, 2)), np.zeros(30))
    with pytest.raises(ValueError, match="one hidden layer"):
        relufast.from_sklearn(mlp)


def test_extract_sklearn_regressor_exact():
    """A trained MLPRegressor (biases, float64) is extracted exactly by queries."""
    mlp = trained_regressor(d=6, k=4, m=2)
    net = relufast.from_sklearn(mlp)
    res = relufast.extract(mlp, 6, 4, queries="random", n_queries=50000, random_state=0)
    assert res.exact, res.message
    assert res.counts["queries"] >= 50000 and "queries" in res.message
    assert res.diagnostics["cryptanalytic_queries"] == relufast.extraction.cryptanalytic_queries(6, 4)
    err = metrics.parameter_error(net, res)
    assert err.V < EXACT_TOL and err.U < EXACT_TOL and err.b < EXACT_TOL
    np.testing.assert_allclose(res.to_sklearn().predict(np.eye(6)), mlp.predict(np.eye(6)), atol=1e-8)


def test_extract_callable_float32_escalates():
    """A callable returning float32: certified at float32, queries doubled until it holds."""
    rng = np.random.default_rng(4)
    V, U = rng.standard_normal((3, 5)), rng.standard_normal((4, 3))

    def model(X):
        return np.maximum(X.astype(np.float32) @ V.T.astype(np.float32), 0) @ U.T.astype(np.float32)

    res = relufast.extract(model, 5, 3, n_queries=200, random_state=0)
    assert res.exact and res.precision == "float32", res.message
    assert metrics.parameter_error((U, V), res).V < F32_TOL


def test_extract_auto_skips_the_bias_free_method_on_biased_queries():
    """method="auto": biased queries go to atv21 alone; bias-free ones try bjw19-gaussian
    first; m < k goes to atv21 either way."""
    from relufast._auto import query_plan

    biased = relufast.planted.two_layer(8, 4, 5, bias="random", offset="random", random_state=0)
    plain = relufast.planted.two_layer(8, 4, 5, random_state=0)
    Xb, Yb = biased.sample(20000, random_state=1)
    Xp, Yp = plain.sample(20000, random_state=1)
    assert query_plan(Xb, Yb, 4) == ["atv21"]
    assert query_plan(Xp, Yp, 4) == ["bjw19-gaussian", "atv21"]
    assert query_plan(Xp, Yp[:, :2], 4) == ["atv21"]
    res = relufast.extract(biased, 8, 4, n_queries=20000, random_state=0)
    assert res.exact and res.method == "atv21"


def test_extract_validation():
    with pytest.raises(TypeError, match="model must be"):
        relufast.extract(42, 3)
    with pytest.raises(ValueError, match="n_queries must be an integer >= 8"):
        relufast.extract(lambda X: X, 3, n_queries=5)
    with pytest.raises(ValueError, match="method must be"):
        relufast.extract(lambda X: X, 3, method="gklw19")


# --- PyTorch -----------------------------------------------------------------------------


def _torch_net(d, k, m, dtype, seed=0, bias=True):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)  # tiny models: threads only contend with the C++ kernels
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(d, k, bias=bias), torch.nn.ReLU(), torch.nn.Linear(k, m, bias=bias)).to(
        dtype
    )
    return torch, model


def _train(torch, model, d, steps=60, seed=0):
    """A few Adam steps on a random regression task (the weights become 'trained')."""
    g = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    X = torch.randn(512, d, generator=g, dtype=dtype)
    Y = torch.sin(X[:, :1]) + X[:, 1:2] ** 2
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(X)[:, :1] - Y) ** 2).mean()
        loss.backward()
        opt.step()
    return model


def test_torch_roundtrip():
    torch = pytest.importorskip("torch")
    torch, model = _torch_net(5, 3, 2, torch.float64)
    net = relufast.from_torch(model)
    X = np.random.default_rng(0).standard_normal((10, 5))
    with torch.no_grad():
        ref = model(torch.from_numpy(X)).numpy()
    np.testing.assert_allclose(net.predict(X), ref, atol=ROUNDTRIP_TOL)
    back = relufast.bridges.to_torch(net)
    with torch.no_grad():
        np.testing.assert_allclose(back(torch.from_numpy(X)).numpy(), ref, atol=ROUNDTRIP_TOL)
    with pytest.raises(ValueError, match="two-layer ReLU network"):
        relufast.from_torch(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1)))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        relufast.from_torch(np.zeros(3))


@pytest.mark.parametrize("dtype_name,bias", [("float64", False), ("float32", False), ("float32", True)])
def test_extract_torch(dtype_name, bias):
    torch = pytest.importorskip("torch")
    d, k, m = 8, 4, 5
    _, model = _torch_net(d, k, m, getattr(torch, dtype_name), seed=1, bias=bias)
    model = _train(torch, model, d)
    net = relufast.from_torch(model)
    res = relufast.extract(model, d, k, queries="random", n_queries=40000 if bias else 4000, random_state=0)
    assert res.exact, res.message
    assert res.precision == dtype_name
    tol = EXACT_TOL if dtype_name == "float64" else F32_TOL
    err = metrics.parameter_error(net, res)
    assert err.V < tol and err.U < tol
    assert res.to_torch() is not None


def test_classifier_is_queried_before_its_output_activation():
    """Wine (3 classes, softmax) and a binary subset (logistic): the query function gives
    the logits (centred for softmax), trained in the test on the bundled data."""
    datasets = pytest.importorskip("sklearn.datasets")
    X, y = datasets.load_wine(return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    for Xc, yc in ((X, y), (X[y < 2], y[y < 2])):
        mlp = sklearn_nn.MLPClassifier(hidden_layer_sizes=(5,), max_iter=50, random_state=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            mlp.fit(Xc, yc)
        f, dtype = relufast.extraction.as_query_function(mlp)
        logits = relufast.from_sklearn(mlp).predict(Xc)
        if logits.shape[1] > 1:
            logits = logits - logits.mean(axis=1, keepdims=True)
        np.testing.assert_allclose(f(Xc), logits, atol=1e-8)
        assert dtype == "float64"


def test_extract_of_a_plain_callable_does_not_import_torch():
    """Importing torch costs seconds: a plain callable must not pay it (torch modules exist
    only once their caller imported torch)."""
    import subprocess
    import sys

    # An import hook records any attempt to import torch, installed or not.
    code = (
        "import sys, importlib.abc\n"
        "tried = []\n"
        "class Watch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            tried.append(name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Watch())\n"
        "import numpy as np, relufast\n"
        "V = np.eye(3)[:2]; f = lambda X: np.maximum(X @ V.T, 0).sum(axis=1, keepdims=True)\n"
        "res = relufast.extract(f, 3, n_hidden=2, queries='chosen', random_state=0)\n"
        "assert res.exact, res.message\n"
        "assert not tried, tried\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
