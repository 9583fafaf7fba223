"""The Levenberg-Marquardt stage and the atv21 path it opens: fewer outputs than units (m < k)."""

import warnings

import numpy as np
import pytest

import relufast as rf
from relufast.stages.levmar import levenberg_marquardt, lm_rows


def _teacher(d, k, m, seed):
    """Hidden biases, an offset and output weights |U| in [0.5, 2] of random sign."""
    r = np.random.default_rng(seed)
    V = r.standard_normal((k, d))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    U = r.choice([-1.0, 1.0], (m, k)) * r.uniform(0.5, 2.0, (m, k))
    return rf.planted.PlantedNetwork(U=U, V=V, b=0.5 * r.standard_normal(k), c=r.standard_normal(m))


def _tilted(V, angle, rng):
    E = rng.standard_normal(V.shape)
    E -= np.sum(E * V, axis=1, keepdims=True) * V
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    return np.cos(angle) * V + np.sin(angle) * E


@pytest.mark.parametrize("d,k,m", [(12, 6, 1), (10, 8, 2)])
@pytest.mark.parametrize("angle", [0.1, 0.3])
def test_converges_to_the_network_from_an_estimate_off_by_a_few_tenths(d, k, m, angle):
    net = _teacher(d, k, m, 3)
    rng = np.random.default_rng(4)
    X, Y = net.sample(lm_rows(d, k, m), random_state=5)
    out = levenberg_marquardt(X, Y, _tilted(net.V, angle, rng), net.b + angle * rng.standard_normal(k))
    assert out.history[-1] < 1e-14 and out.history[0] > 1e-2
    res = rf.RecoveryResult(U=out.U, V=out.V, b=out.b, c=out.c, status="exact", message="", method="lm")
    err = rf.metrics.parameter_error(res, net)
    assert max(err.U, err.V) < 1e-10


def test_a_start_outside_the_basin_is_reported_by_its_residual():
    net = _teacher(8, 4, 1, 0)
    X, Y = net.sample(4000, random_state=1)
    V0 = np.random.default_rng(2).standard_normal((4, 8))
    out = levenberg_marquardt(X, Y, V0 / np.linalg.norm(V0, axis=1, keepdims=True), np.zeros(4), max_steps=5)
    assert out.steps <= 5 and len(out.history) >= 1 and np.all(np.diff(out.history) <= 0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_atv21_exact_with_one_output_and_more_units(seed):
    # m = 1 < k, biases and an offset: the affine lift does not apply (it needs m >= k), so
    # the Levenberg-Marquardt stage takes the paper's estimate, then the certificate.
    net = _teacher(12, 8, 1, seed)
    X, Y = net.sample(400_000, random_state=seed + 50)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rf.RelufastWarning)
        res = rf.recover(X, Y[:, 0], n_hidden=8, method="atv21", random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and max(err.U, err.V) < 1e-8, res.message


def test_a_reflected_unit_is_no_local_minimum_with_the_linear_part():
    # relu(z) = z + relu(-z): with a free linear part a unit started as (-v, -b) fits as well,
    # and fold_linear reflects it back (its coefficient in the linear part is -1).
    from relufast.stages.levmar import fold_linear

    d, k, m = 12, 6, 2
    net = _teacher(d, k, m, 3)
    rng = np.random.default_rng(4)
    X, Y = net.sample(lm_rows(d, k, m) + d, random_state=5)
    V0, b0 = _tilted(net.V, 0.2, rng), net.b.copy()
    V0[[1, 4]] *= -1
    b0[[1, 4]] *= -1
    out = levenberg_marquardt(X, Y, V0, b0, linear=True)
    assert out.L is not None and out.L.shape == (m, d) and np.abs(out.L).max() > 0.1
    folded, off = fold_linear(out)
    assert out.history[-1] < 1e-14 and off < 1e-10 and folded.L is None
    res = rf.RecoveryResult(U=folded.U, V=folded.V, b=folded.b, c=folded.c, status="exact", message="", method="lm")
    err = rf.metrics.parameter_error(res, net)
    assert max(err.U, err.V, err.b, err.c) < 1e-10


def test_a_unit_the_tensor_step_missed_is_found_from_the_residual(monkeypatch):
    # The tensor step returns one unit twice and misses another (as Jennrich does at k near
    # 20 with one output); the deflation fits the distinct units, estimates the missing one
    # from the residual's Hermite tensors, and the fit of all units is certified.
    from relufast.algorithms import atv21 as A

    original = A.pipeline._estimate

    def duplicating(*args, **kwargs):
        out = original(*args, **kwargs)
        if out is None:
            return None
        V0, a, bb, c0, d6 = out
        V0, bb = V0.copy(), bb.copy()
        V0[1], bb[1] = V0[0], bb[0]  # unit 0 twice, unit 1 missing
        return V0, a, bb, c0, d6

    monkeypatch.setattr(A.pipeline, "_estimate", duplicating)
    net = _teacher(10, 6, 1, 0)
    X, Y = net.sample(300_000, random_state=1)
    res = rf.recover(X, Y[:, 0], n_hidden=6, method="atv21", random_state=0, n_restarts=2)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and max(err.U, err.V, err.b, err.c) < 1e-8, res.message
    assert res.counts["deflations"] >= 1


def test_a_trained_scikit_learn_regressor_with_one_output_is_exact():
    # A network trained elsewhere: scikit-learn, one output, 8 hidden units, fitted to the
    # outputs of a wider random network (targets with many directions), then queried on
    # Gaussian inputs. (Targets of one direction, like tanh(x . w), train units into
    # near-parallel pairs, which the samples can hardly tell apart.)
    sklearn = pytest.importorskip("sklearn.neural_network")
    r = np.random.default_rng(0)
    wide = _teacher(12, 24, 1, 7)
    Xt = r.standard_normal((4000, 12))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn's ConvergenceWarning
        mlp = sklearn.MLPRegressor(hidden_layer_sizes=(8,), max_iter=300, random_state=0)
        mlp.fit(Xt, wide.predict(Xt)[:, 0])
    (W1, W2), (b1, b2) = mlp.coefs_, mlp.intercepts_
    net = rf.planted.PlantedNetwork(U=W2.T, V=W1.T, b=b1, c=b2)
    X = r.standard_normal((300_000, 12))
    res = rf.recover(X, mlp.predict(X), n_hidden=8, method="atv21", random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and max(err.U, err.V) < 1e-8, res.message


def test_float32_outputs_with_one_output_are_certified_at_float32():
    # The same path on a model evaluated in float32: certified at float32, weights to its rounding.
    net = _teacher(12, 5, 1, 2)
    W1, b1, W2, c = (np.asarray(a, dtype=np.float32) for a in (net.V.T, net.b, net.U.T, net.c))

    def model(X):
        X = np.asarray(X, dtype=np.float32)
        return np.maximum(X @ W1 + b1, 0) @ W2 + c

    res = rf.extract(model, 12, 5, random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and res.precision == "float32" and max(err.U, err.V) < 1e-5, res.message
