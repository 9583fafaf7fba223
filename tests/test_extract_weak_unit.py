"""extract with n_hidden given: a unit whose trace in the outputs is below the visibility
statistic's floor is still recovered (the given n_hidden is tried before the visible count)."""

import numpy as np

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
