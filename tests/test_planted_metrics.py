import numpy as np
import pytest

import relufast as rf


def test_planted_network_shapes_and_constraints():
    net = rf.planted.two_layer(
        d=10, k=4, m=6, random_state=0, max_cos=0.5, max_condition=2.0, max_output_condition=20.0
    )
    assert net.U.shape == (6, 4) and net.V.shape == (4, 10)
    np.testing.assert_allclose(np.linalg.norm(net.V, axis=1), 1.0)
    C = np.abs(net.V @ net.V.T) - np.eye(4)
    assert C.max() <= 0.5
    s = np.linalg.svd(net.V, compute_uv=False)
    assert s[0] / s[-1] <= 2.0


def test_conditioned_network():
    net = rf.planted.two_layer(d=12, k=5, m=5, random_state=1, condition=30.0)
    s = np.linalg.svd(net.V, compute_uv=False)
    assert 10 < s[0] / s[-1] < 100


@pytest.mark.parametrize("law", rf.planted.INPUT_DISTRIBUTIONS)
def test_inputs_have_zero_mean_unit_variance(law):
    net = rf.planted.two_layer(d=3, k=2, m=2, random_state=0)
    X, Y = net.sample(200000, random_state=1, input=law)
    np.testing.assert_allclose(X.mean(axis=0), 0.0, atol=0.01)
    # "mixture" is GKLW19's +-1 two-Gaussian mixture: covariance I + 1 1^T.
    np.testing.assert_allclose(X.var(axis=0), 2.0 if law == "mixture" else 1.0, atol=0.02)
    np.testing.assert_allclose(Y, np.maximum(X @ net.V.T, 0) @ net.U.T)


def test_noise_level():
    net = rf.planted.two_layer(d=3, k=2, m=2, random_state=0)
    X, Y = net.sample(100000, random_state=1, noise=0.5)
    assert abs(np.std(Y - net(X)) - 0.5) < 0.01


def test_parameter_error_handles_permutation_and_scaling():
    net = rf.planted.two_layer(d=6, k=3, m=4, random_state=2)
    perm = np.array([2, 0, 1])
    scale = np.array([0.5, 3.0, 1.5])
    U = net.U[:, perm] / scale
    V = net.V[perm] * scale[:, None]
    err = rf.metrics.parameter_error((U, V), net)
    assert err.U < 1e-15 and err.V < 1e-15 and err.max_angle < 1e-7
    np.testing.assert_array_equal(err.permutation, perm)
    # A sign flip of a row is an error (sign is identifiable for ReLU).
    Vf = net.V.copy()
    Vf[0] *= -1
    assert rf.metrics.parameter_error((net.U, Vf), net).V > 0.5


def test_function_error():
    net = rf.planted.two_layer(d=6, k=3, m=4, random_state=2)
    X = np.random.default_rng(0).standard_normal((1000, 6))
    assert rf.metrics.function_error(net, net, X) == 0.0
    other = rf.planted.two_layer(d=6, k=3, m=4, random_state=3)
    assert rf.metrics.function_error(other, net, X) > 0.1


def test_parameter_error_shape_mismatch():
    a = rf.planted.two_layer(d=6, k=3, m=4, random_state=2)
    b = rf.planted.two_layer(d=6, k=2, m=4, random_state=2)
    with pytest.raises(ValueError, match="shapes differ"):
        rf.metrics.parameter_error(a, b)


def test_relu_function_ignores_a_spurious_invalid_flag_but_not_a_nan():
    """A float32 BLAS kernel that raises the invalid flag on finite data (a CI machine's
    OpenBLAS did, in `H @ Wo.T`) no longer fails a run where warnings are errors; a NaN
    in the outputs on inputs without one is still reported."""
    import warnings

    from relufast import planted as P

    hidden, out = P.deep_relu(5, (4, 3), 2, random_state=0)

    def flagging(z):  # the invalid flag raised, the value thrown away
        _ = np.array([np.inf], dtype=z.dtype) * 0
        return np.maximum(z, 0)

    X = np.random.default_rng(0).standard_normal((7, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Y = P.relu_function(hidden, out, np.float32, activation=flagging)(X)
        ref = P.relu_function(hidden, out, np.float64)(X)
    np.testing.assert_allclose(Y, ref, rtol=1e-5, atol=1e-5)
    with pytest.warns(RuntimeWarning, match="NaN"):
        P.relu_function(hidden, out, np.float32, activation=lambda z: z * np.nan)(X)
