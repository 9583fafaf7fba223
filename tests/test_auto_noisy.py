"""``auto`` and ``atv21`` on noisy outputs and on a wrong ``n_hidden`` (issue 33, items 2 and 4).

A good estimate on noisy outputs is ``approximate`` with the noise level it reaches, not
``failed`` "outside the basin"; a wrong ``n_hidden`` is named as such, with the count of
units the outputs show, not blamed on the estimate.
"""

import numpy as np
import pytest

import relufast
from relufast.metrics import parameter_error
from relufast.planted import two_layer


def _noisy(d, k, m, n, sigma, seed):
    net = two_layer(d, k, m, random_state=seed)
    X, Y = net.sample(n, random_state=seed + 1)
    return net, X, Y + sigma * np.random.default_rng(seed + 2).standard_normal(Y.shape)


@pytest.mark.parametrize("sigma", [0.05, 0.2])
def test_auto_on_noisy_outputs_is_approximate_and_close(sigma):
    net, X, Y = _noisy(8, 3, 4, 40_000, sigma, seed=11)
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, Y, n_hidden=3, method="auto", random_state=0)
    assert res.status == "approximate", res.message
    assert res.success
    err = parameter_error(res, net)
    assert err.V < 0.05 and err.U < 0.05, err
    # the error it reaches: the residual is the noise level, and the message says so
    noise = sigma * np.sqrt(Y.size) / np.linalg.norm(Y)
    assert abs(res.residual - noise) < 0.1 * noise
    assert "noise" in res.message


def test_atv21_on_noisy_outputs_reports_the_noise_level():
    net, X, Y = _noisy(9, 4, 6, 40_000, 0.1, seed=21)
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, Y, n_hidden=4, method="atv21", random_state=1)
    assert res.status == "approximate", res.message
    assert "outside the basin" not in res.message
    assert res.diagnostics["residual_moment_z"] <= 6.0
    assert res.diagnostics["noise_level"] == pytest.approx(res.residual, rel=1e-6)
    assert parameter_error(res, net).V < 0.05


def test_wrong_n_hidden_names_the_count_the_outputs_show():
    net = two_layer(12, 7, 9, random_state=31)
    X, Y = net.sample(40_000, random_state=32)
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, Y, n_hidden=5, method="auto", random_state=0)
    assert res.status == "failed"
    atv = next(a for a in res.diagnostics["auto_attempts"] if a["method"] == "atv21")
    assert "outside the basin" not in atv["message"]
    assert "show 7 hidden units, not n_hidden = 5" in atv["message"]
    assert "try n_hidden = 7" in res.message


def test_wrong_n_hidden_with_fewer_outputs_than_units():
    # m = 6 outputs of 7 units: the outputs show at least 6, more than n_hidden = 4
    net = two_layer(10, 7, 6, random_state=41)
    X, Y = net.sample(40_000, random_state=42)
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, Y, n_hidden=4, method="atv21", random_state=0)
    assert res.status == "failed"
    assert "outside the basin" not in res.message
    assert "hidden units, not n_hidden = 4" in res.message
