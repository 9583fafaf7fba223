"""BJW19 Algorithm 8 (Thm 13) and the halfspace primitive (Thm 12), oracle 12."""

import numpy as np
import pytest

import relufast as rf
from relufast.algorithms.bjw19 import halfspace_estimate


@pytest.mark.parametrize("eta", [0.3, 1.0, 3.0])
def test_halfspace_error_falls_with_n(eta):
    rng = np.random.default_rng(1)
    d = 10
    errs = []
    for n in (10**4, 10**5, 10**6):
        v = rng.standard_normal(d)
        v /= np.linalg.norm(v)
        X = rng.standard_normal((n, d))
        y = np.sign(np.maximum(X @ v, 0) + eta * rng.standard_normal(n))
        errs.append(np.sum((halfspace_estimate(X, y) - v) ** 2))
    assert errs[0] > errs[2]
    if eta == 1.0:
        assert errs[2] <= 0.01  # oracle 12: the halfspace error bound
    assert errs[2] <= 0.01 * (1 + eta)


@pytest.mark.parametrize("sigma", [0.3, 1.0])
def test_given_M_mode_with_heavy_tailed_noise(sigma):
    rng = np.random.default_rng(2)
    net = rf.planted.two_layer(d=5, k=2, m=4, random_state=0)
    X, Y0 = net.sample(200_000, random_state=1)
    E = rng.standard_t(3, size=Y0.shape)
    E *= sigma / E.std()
    M = np.linalg.pinv(net.U) + 1e-3 * rng.standard_normal((2, 4))
    res = rf.recover(X, Y0 + E, n_hidden=2, method="bjw19-independent-noise", given_M=M, random_state=0)
    assert res.status == "approximate"
    assert np.linalg.norm(Y0 + E - res.predict(X)) <= 1.01 * np.linalg.norm(E)
    assert rf.metrics.parameter_error(res, net).max_angle <= 0.1


def test_brute_force_grid_small_instance_and_cap():
    rng = np.random.default_rng(3)
    net = rf.planted.two_layer(d=3, k=1, m=1, random_state=0)
    X, Y0 = net.sample(20000, random_state=1)
    Y = Y0 + 0.1 * rng.standard_normal(Y0.shape)
    res = rf.recover(X, Y, n_hidden=1, method="bjw19-independent-noise", eps=0.2, random_state=0)
    assert res.counts["candidates"] == 2 * 10 + 1
    assert rf.metrics.parameter_error(res, net).max_angle < 0.1
    net2 = rf.planted.two_layer(d=4, k=2, m=3, random_state=0)
    X2, Y2 = net2.sample(1000, random_state=1)
    with pytest.raises(ValueError, match=r"brute-force grid of Alg. 8 has .* candidate left inverses .* max_guesses"):
        rf.recover(X2, Y2, n_hidden=2, method="bjw19-independent-noise")


def test_grid_has_signs_for_negative_output_weights():
    # Spec errata 8: the paper's grid has only positive entries, so a negative U (whose
    # left inverse is negative) would be missed. relufast's grid has signs and zero.
    rng = np.random.default_rng(5)
    net = rf.planted.two_layer(d=3, k=1, m=1, random_state=0)
    net = rf.planted.PlantedNetwork(U=-np.abs(net.U), V=net.V)
    X, Y0 = net.sample(20000, random_state=1)
    Y = Y0 + 0.1 * rng.standard_normal(Y0.shape)
    res = rf.recover(X, Y, n_hidden=1, method="bjw19-independent-noise", eps=0.2, random_state=0)
    assert res.U[0, 0] < 0
    assert rf.metrics.parameter_error(res, net).max_angle < 0.1


def test_pure_noise_explains_almost_nothing():
    # With no network in the data the best candidate barely beats the zero network
    # (which is always a candidate, Alg. 8 step 0).
    rng = np.random.default_rng(4)
    X = rng.standard_normal((5000, 3))
    Y = rng.standard_normal((5000, 2))
    res = rf.recover(X, Y, n_hidden=1, method="bjw19-independent-noise", given_M=np.array([[1.0, -1.0]]))
    assert res.residual > 0.99


def test_given_M_shape_is_checked():
    X = np.zeros((100, 3))
    Y = np.zeros((100, 2))
    with pytest.raises(ValueError, match=r"given_M must have shape \(n_hidden, n_outputs\) = \(1, 2\); got \(2, 2\)"):
        rf.recover(X, Y, n_hidden=1, method="bjw19-independent-noise", given_M=np.eye(2))
