"""Precision-aware certificates: float32 outputs are certified at float32."""

import numpy as np
import pytest

import relufast
from relufast import metrics, planted
from relufast.stages.precision import FLOOR_FACTOR, UNIT_ROUNDOFF, Precision, resolve_precision

#: Weight error of a network recovered from float32 outputs: float32 rounding of the
#: outputs (2^-24 = 6e-8) limits it; 1e-6 leaves 20x over what was measured (2-5e-8).
WEIGHT_TOL_F32 = 1e-6
#: Residual ceiling at float32: the rounding floor of the certificate itself.
EPS32 = UNIT_ROUNDOFF["float32"]


def float32_outputs(net, X):
    """Outputs as a float32 forward pass computes them (a deployed model)."""
    X32 = X.astype(np.float32)
    H = np.maximum(X32 @ net.V.T.astype(np.float32) + net.b.astype(np.float32), np.float32(0))
    return H @ net.U.T.astype(np.float32) + net.c.astype(np.float32)


def check_f32(res, net, d, k):
    assert res.status == "exact", res.message
    assert res.exact and res.precision == "float32"
    assert res.residual <= FLOOR_FACTOR * EPS32 * np.sqrt(d + k)
    assert "float32 precision" in res.message
    err = metrics.parameter_error(net, res)
    assert err.V < WEIGHT_TOL_F32 and err.U < WEIGHT_TOL_F32


def test_resolve_precision():
    assert resolve_precision(np.zeros(3, np.float32)).name == "float32"
    assert resolve_precision(np.zeros(3)).name == "float64"
    assert resolve_precision([1.0, 2.0]).name == "float64"
    assert resolve_precision(np.zeros(3), "float32").name == "float32"
    assert resolve_precision(np.zeros(3), 2.0**-24).name == "float32"
    p = Precision("float64", UNIT_ROUNDOFF["float64"])
    assert p.tol(1e-10, 10, 5) == 1e-10  # float64 thresholds are unchanged
    assert resolve_precision(None, "float32").tol(1e-10, 16, 0) == pytest.approx(FLOOR_FACTOR * EPS32 * 4)
    with pytest.raises(ValueError, match="precision must be None"):
        resolve_precision(np.zeros(3), "float8")
    with pytest.raises(ValueError, match="unit roundoff in"):
        resolve_precision(np.zeros(3), 0.5)


@pytest.mark.parametrize(
    "method,d,k,m,n",
    [
        ("bjw19-gaussian", 20, 10, 12, 40000),  # the case: k = 10 said "failed"
        ("bjw19-fpt", 10, 4, 3, 40000),  # m < k: said non_identifiable
        ("bjw19-enumeration", 4, 3, 3, 60),  # read rounding as rank > k
    ],
)
def test_float32_outputs_exact_at_float32(method, d, k, m, n):
    net = planted.two_layer(d, k, m, random_state=3)
    X = np.random.default_rng(1).standard_normal((n, d))
    res = relufast.recover(X, float32_outputs(net, X), n_hidden=k, method=method, random_state=0)
    check_f32(res, net, d, k)


def test_float32_atv21_with_biases():
    d, k, m = 10, 4, 3
    net = planted.two_layer(d, k, m, random_state=3, bias=0.5, offset=1.0)
    X = np.random.default_rng(1).standard_normal((200000, d))
    res = relufast.recover(X, float32_outputs(net, X), n_hidden=k, method="atv21", random_state=0)
    check_f32(res, net, d, k)
    assert metrics.parameter_error(net, res).b < WEIGHT_TOL_F32


def test_precision_keyword_on_float64_array():
    """Outputs rounded to float32 but handed over as float64: precision= says so."""
    d, k, m = 10, 4, 6
    net = planted.two_layer(d, k, m, random_state=5)
    X = np.random.default_rng(2).standard_normal((20000, d))
    Y = float32_outputs(net, X).astype(np.float64)
    res = relufast.recover(X, Y, n_hidden=k, method="bjw19-gaussian", random_state=0, precision="float32")
    check_f32(res, net, d, k)


def test_float64_result_says_float64():
    d, k, m = 8, 3, 4
    net = planted.two_layer(d, k, m, random_state=0)
    X = np.random.default_rng(0).standard_normal((5000, d))
    res = relufast.recover(X, net.predict(X), n_hidden=k, method="bjw19-gaussian", random_state=0)
    assert res.exact and res.precision == "float64" and res.residual < 1e-12


def test_wrong_network_is_not_exact_at_float32():
    """A float32 certificate still rejects outputs that no k-unit network produces."""
    d, k, m = 10, 4, 6
    net = planted.two_layer(d, k + 1, m, random_state=7)
    X = np.random.default_rng(3).standard_normal((20000, d))
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, float32_outputs(net, X), n_hidden=k, method="bjw19-gaussian", random_state=0)
    assert not res.exact and res.status != "exact"
