"""atv21 with m >= k outputs: BJW19 Algorithm 5 (margin form) on the affine lift [x, 1]
makes the ATV21 estimate exact without the activation-region refinement."""

import warnings

import numpy as np
import pytest

import relufast as rf


@pytest.mark.parametrize("seed", [0, 1])
def test_lift_makes_a_biased_network_exact(seed):
    net = rf.planted.two_layer(d=20, k=10, m=10, bias="random", offset="random", random_state=seed)
    X, Y = net.sample(100_000, random_state=seed + 10)
    res = rf.recover(X, Y, n_hidden=10, method="atv21", random_state=seed)
    assert res.status.value == "exact"
    assert "affine lift" in res.message
    assert res.counts["refine_rounds"] == 0
    err = rf.metrics.parameter_error(res, net)
    assert max(err.U, err.V, err.b) < 1e-10
    Xf = np.random.default_rng(99).standard_normal((2000, 20))
    assert np.max(np.abs(res.predict(Xf) - net.predict(Xf))) < 1e-9 * np.max(np.abs(net.predict(Xf)))


def test_fewer_outputs_than_units_skip_the_lift():
    # [Y, 1] has rank m + 1 <= k: its span cannot hold each unit's rectified vector.
    net = rf.planted.two_layer(d=8, k=4, m=2, bias="random", offset="random", random_state=3)
    X, Y = net.sample(100_000, random_state=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        res = rf.recover(X, Y, n_hidden=4, method="atv21", random_state=0)
    assert "affine lift" not in res.message


def test_lift_rows_certify_directly():
    # The stage itself: estimates within ~0.2 rad certify to rounding on 5,000 rows.
    import importlib

    atv = importlib.import_module("relufast.algorithms.atv21")
    from relufast.stages.refine import RowPool

    rng = np.random.default_rng(5)
    net = rf.planted.two_layer(d=12, k=6, m=8, bias="random", offset="random", random_state=5)
    X, Y = net.sample(20_000, random_state=6)
    V0 = net.V / np.linalg.norm(net.V, axis=1, keepdims=True)
    b0 = net.b / np.linalg.norm(net.V, axis=1)
    V1 = V0 + 0.05 * rng.standard_normal(V0.shape)
    n1 = np.linalg.norm(V1, axis=1)
    pool = RowPool(6)
    V, b = atv.lift._lift_refine(X, Y, V1 / n1[:, None], b0 / n1, 1, pool)
    assert pool.full
    assert np.max(np.abs(V - V0)) < 1e-12 and np.max(np.abs(b - b0)) < 1e-12


def test_lift_pool_over_tensor_steps_at_k_above_the_region_limit():
    # k = 14 > LIFT_WAIT_K: region refinement waits for the last tensor step while the
    # pooled lift rows grow; exact with no region round.
    net = rf.planted.two_layer(d=30, k=14, m=14, bias="random", offset="random", random_state=4)
    X, Y = net.sample(100_000, random_state=5)
    res = rf.recover(X, Y, n_hidden=14, method="atv21", random_state=0)
    assert res.status.value == "exact" and res.counts["refine_rounds"] == 0
    err = rf.metrics.parameter_error(res, net)
    assert max(err.U, err.V, err.b) < 1e-10
