"""The one network type: results, planted teachers and metrics share (U, V, b, c)."""

import numpy as np
import pytest

import relufast as rf
from relufast.network import Network, as_network

#: Rounding of a few float64 products.
ROUNDING = 1e-13


def test_biased_planted_network_predicts_with_biases():
    net = rf.planted.two_layer(6, 3, 4, random_state=0, bias="random", offset="random")
    X, Y = net.sample(50, random_state=1)
    expect = np.maximum(X @ net.V.T + net.b, 0.0) @ net.U.T + net.c
    assert np.max(np.abs(Y - expect)) < ROUNDING
    assert net.has_bias and net.b.shape == (3,) and net.c.shape == (4,)
    plain = rf.planted.two_layer(6, 3, 4, random_state=0)
    assert not plain.has_bias and np.all(plain.b == 0) and np.all(plain.c == 0)


def test_bias_specs_and_their_validation():
    assert np.all(rf.planted.two_layer(5, 2, 3, random_state=0, bias=0.5).b == 0.5)
    with pytest.raises(ValueError, match=r"bias must be finite with shape \(2,\)"):
        rf.planted.two_layer(5, 2, 3, random_state=0, bias=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="offset must be None, a number, 'random' or an array; got 'yes'"):
        rf.planted.two_layer(5, 2, 3, random_state=0, offset="yes")
    with pytest.raises(ValueError, match="U must have n_hidden = 2 columns"):
        Network(np.ones((3, 4)), np.ones((2, 5)))


def test_parameter_error_matches_units_on_v_and_b():
    net = rf.planted.two_layer(8, 3, 4, random_state=2, bias="random", offset="random")
    perm = np.array([2, 0, 1])
    s = np.array([2.0, 0.5, 3.0])  # positive rescaling of each unit
    est = Network(net.U[:, perm] / s, net.V[perm] * s[:, None], net.b[perm] * s, net.c)
    err = rf.metrics.parameter_error(est, net)
    assert max(err.U, err.V, err.b, err.c, err.max_angle) < ROUNDING
    wrong = Network(est.U, est.V, est.b + 0.1, est.c - 0.2)
    err = rf.metrics.parameter_error(wrong, net)
    assert err.b > 0.05 and err.c > 0.05 and err.V < ROUNDING


def test_units_with_the_same_direction_are_told_apart_by_their_bias():
    v = np.array([[1.0, 0.0], [1.0, 0.0]])
    truth = Network(np.array([[1.0, -1.0]]), v, np.array([0.0, -1.0]))
    est = Network(truth.U[:, ::-1], v, truth.b[::-1])
    err = rf.metrics.parameter_error(est, truth)
    assert list(err.permutation) == [1, 0] and err.b < ROUNDING and err.U < ROUNDING


def test_result_carries_biases_and_refuses_nan_success():
    run = rf._result.Run("test")
    res = run.result("exact", "ok", U=np.eye(2), V=np.eye(2), exact=True, residual=0.0)
    assert np.all(res.b == 0) and np.all(res.c == 0) and res.success
    assert np.allclose(res.predict(np.array([[1.0, -1.0]])), [[1.0, 0.0]])
    with pytest.warns(rf.RelufastWarning, match="not finite"):
        bad = rf._result.Run("test").result("approximate", "estimate", U=np.eye(2), V=np.full((2, 2), np.nan))
    assert bad.status == "failed" and not bad.success and not bad.exact
    with pytest.raises(ValueError, match="expected a network, a result with parameters"):
        as_network(object())


def test_fit_stage_with_biases_and_offset_is_exact():
    from relufast.stages.fit import fit_network, relu_stats

    net = rf.planted.two_layer(7, 3, 4, random_state=5, bias="random", offset="random")
    X, Y = net.sample(3000, random_state=6)
    fit = fit_network(X, Y, net.V, net.b, intercept=True, subset=(X[:500], Y[:500]), threads=2)
    assert fit.residual < ROUNDING * 10
    assert np.max(np.abs(fit.U - net.U)) < 1e-10 and np.max(np.abs(fit.c - net.c)) < 1e-10
    # The C++ pass against NumPy: features relu(X V^T + b) and a constant column.
    Uc = np.column_stack([net.U, net.c]) * 1.1
    st = relu_stats(X, Y, net.V, Uc, n_jobs=2, block_size=37, b=net.b, intercept=True)
    F = np.column_stack([np.maximum(X @ net.V.T + net.b, 0.0), np.ones(len(X))])
    assert np.allclose(st["gram"], F.T @ F, rtol=1e-12) and np.allclose(st["cross"], F.T @ Y, rtol=1e-12)
    assert np.isclose(st["sq_residual"], np.sum((Y - F @ Uc.T) ** 2), rtol=1e-10)
    # Without the offset the fit cannot reproduce the data: no false certificate.
    assert fit_network(X, Y, net.V, net.b).residual > 1e-3
