"""General rectified activations (BJW19 Sec. 9.1) and Hermite coefficients (test oracle 1 of docs/bjw19.md)."""

import math
import warnings

import numpy as np
import pytest

import relufast as rf
from relufast.activations import EXPM1, RELU, RELU2, custom, get_activation
from relufast.stages.hermite import activation_coefficient

from .conftest import EXACT_TOL

S2PI = math.sqrt(2 * math.pi)


def test_hermite_coefficients_of_relu_and_relu_squared():
    relu = [1 / S2PI, 0.5, 1 / S2PI, 0.0, -1 / S2PI, 0.0, 3 / S2PI]
    relu2 = [0.5, 2 / S2PI, 1.0, 2 / S2PI, 0.0]
    for r, c in enumerate(relu):
        assert abs(activation_coefficient(r, RELU) - c) < 1e-10
    for r, c in enumerate(relu2):
        assert abs(activation_coefficient(r, RELU2) - c) < 1e-10


def _cubic_plus_linear():
    def inv(y):
        q = np.sqrt(y * y / 4 + 1 / 27)
        return np.cbrt(y / 2 + q) + np.cbrt(y / 2 - q)

    return custom(lambda t: t + t**3, inv, "t+t^3")


@pytest.mark.parametrize(
    "act,norms",
    [("relu2", None), (3.0, None), ("expm1", [0.5, 0.8, 1.2, 1.5]), (_cubic_plus_linear(), [0.7, 1.0, 1.3, 0.9])],
    ids=["relu2", "relu3", "expm1", "custom"],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_recovery_with_rectified_activations(act, norms, seed):
    # Spec oracle 14 (relu^2, (m, k, d, n) = (6, 4, 8, 5e4)) plus the other kinds.
    net = rf.planted.two_layer(
        d=8, k=4, m=6, random_state=seed, max_cos=0.7, max_condition=3.0, activation=act, row_norms=norms
    )
    X, Y = net.sample(50000, random_state=seed + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rf.RelufastWarning)
        res = rf.recover(X, Y, n_hidden=4, method="bjw19-gaussian", activation=act, random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.U < EXACT_TOL and err.V < EXACT_TOL
    np.testing.assert_allclose(res.predict(X), Y, atol=1e-10 * np.abs(Y).max())
    if norms is not None:  # non-homogeneous: the row norms are recovered too
        np.testing.assert_allclose(np.sort(np.linalg.norm(res.V, axis=1)), np.sort(norms), rtol=1e-10)


def test_activation_lookup_and_validation():
    assert get_activation("relu") is RELU and get_activation(1) is RELU
    assert get_activation("relu2").degree == 2.0 and get_activation(EXPM1) is EXPM1
    with pytest.raises(ValueError, match="unknown activation 'tanh'"):
        get_activation("tanh")
    with pytest.raises(ValueError, match="positive and increasing"):
        custom(lambda t: -t, lambda y: -y)
    with pytest.raises(ValueError, match=r"inverse\(forward\(t\)\) must equal t"):
        custom(lambda t: t * t, lambda y: y)
    with pytest.raises(ValueError, match="positive number"):
        get_activation(-1.0)


def test_hermite_stage_closed_forms_match_quadrature():
    from scipy.integrate import quad

    from relufast.stages.hermite import gaussian_pdf, hermite_he, relu_coefficient, step_coefficient

    for b in (-1.3, 0.0, 0.7):
        for r in range(6):
            relu = quad(lambda z, b=b, r=r: (z + b) * hermite_he(r, z) * gaussian_pdf(z), -b, np.inf, epsabs=1e-13)[0]
            step = quad(lambda z, r=r: hermite_he(r, z) * gaussian_pdf(z), -b, np.inf, epsabs=1e-13)[0]
            assert abs(relu_coefficient(r, b) - relu) < 1e-10
            assert abs(step_coefficient(r, b) - step) < 1e-10
    for r in range(5):  # the quadrature of the named ReLU agrees with the closed form at b = 0
        assert abs(activation_coefficient(r, RELU) - relu_coefficient(r, 0.0)) < 1e-10
    assert hermite_he(3, np.array([2.0])).shape == (1,) and float(hermite_he(3, 2.0)) == 2.0
