"""extract with n_hidden given: a unit whose trace in the outputs is below the visibility
statistic's floor is still recovered (the given n_hidden is tried before the visible count)."""

import numpy as np
import pytest

import relufast as rf
from relufast.units import visible_units


def test_given_n_hidden_recovers_a_weak_unit():
    net = rf.planted.two_layer(d=10, k=5, m=1, bias="random", offset="random", random_state=0)
    X = np.random.default_rng(1).standard_normal((20000, 10))
    assert visible_units(X, net.predict(X)).count < 5  # one output weight is 0.004: below the floor
    res = rf.extract(net.predict, n_features=10, n_hidden=5, random_state=0)
    assert res.status.value == "exact" and res.n_hidden == 5
    assert "never active" not in res.message
    Xf = np.random.default_rng(2).standard_normal((1000, 10))
    assert np.max(np.abs(res.predict(Xf) - net.predict(Xf))) < 1e-9


@pytest.mark.parametrize("k", [6, 8])
def test_more_units_than_inputs_are_not_called_dead(k):
    # Gaussian-query methods recover at most d units: the message says so, and does not
    # claim that the other units are never active (all of them are).
    rng = np.random.default_rng(k)
    V, U, b = rng.standard_normal((k, 4)), rng.standard_normal((2, k)), 0.3 * rng.standard_normal(k)

    def f(X):
        return np.maximum(X @ V.T + b, 0) @ U.T

    with pytest.warns(rf.RelufastWarning):
        res = rf.extract(f, n_features=4, n_hidden=k, queries="random", random_state=0, max_queries=40_000)
    assert res.status.value != "exact"
    assert "never active" not in res.message and f"n_hidden = {k} > d = 4" in res.message
    with pytest.warns(rf.RelufastWarning):
        res = rf.extract(f, n_features=4, random_state=0, max_queries=40_000)
    assert "inf" not in res.message and "never active" not in res.message.split("(units that")[0]
