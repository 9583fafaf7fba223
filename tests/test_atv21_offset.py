"""Bias-free methods given outputs with an offset say so and name atv21."""

import warnings

import pytest

import relufast as rf


def _data(offset):
    # m = 5 > k = 3: an offset c shows as rank(Y) = 4 while the centred outputs have rank 3.
    net = rf.planted.two_layer(8, 3, 5, random_state=0, offset=offset, max_cos=0.7)
    return net.sample(30000, random_state=1)


@pytest.mark.parametrize("method", ["bjw19-noisy", "gklw19", "bjw19-ica"])
def test_bias_free_methods_name_the_offset(method):
    X, Y = _data("random")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        res = rf.recover(X, Y, n_hidden=3, method=method, random_state=0)
    assert not res.exact
    assert "constant offset c" in res.message and "use atv21" in res.message


def test_the_advice_is_right_and_absent_without_offset():
    X, Y = _data("random")
    res = rf.recover(X, Y, n_hidden=3, method="atv21", random_state=0)
    assert res.exact and res.residual <= 1e-10
    X, Y = _data(None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        res = rf.recover(X, Y, n_hidden=3, method="bjw19-ica", random_state=0)
    assert "offset" not in res.message
