"""BJW19 under noise: Thm 10 / Alg. 6 (test oracle 7 of docs/bjw19.md)."""

import warnings

import numpy as np
import pytest

import relufast as rf
from relufast.algorithms.bjw19 import polish, sign_by_projection

from .conftest import planted


def _instance(seed):
    return planted(8, 3, 6, seed, max_condition=3.0, max_cos=0.7, max_output_condition=10.0)


def _run(net, n, sigma, seed, **kw):
    X, Y = net.sample(n, random_state=seed + 100, noise=sigma)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rf.RelufastWarning)
        res = rf.recover(X, Y, n_hidden=3, method="bjw19-noisy", random_state=0, **kw)
    err = rf.metrics.parameter_error(res, net)
    V_err = np.linalg.norm(res.V - net.V[err.permutation])
    return res, err, V_err


@pytest.mark.parametrize("sigma", [0.1, 0.5, 1.0])
def test_noisy_pipeline_signs_errors_and_rate(sigma):
    # Spec oracle 7: all signs correct, median |V - V*|_F <= 0.15 (n = 2e4) and <= 0.06
    # (n = 2e5), ratio of medians in [2, 4.5] (n^-1/2), median relative U error <= 0.04 / 0.012.
    med = {}
    for n in (20_000, 200_000):
        v, u, margins = [], [], []
        for seed in range(5):
            res, err, V_err = _run(_instance(seed), n, sigma, seed)
            assert res.status == "approximate" and not res.exact
            assert err.max_angle < np.pi / 4  # a flipped sign would be an angle near pi
            v.append(V_err)
            u.append(err.U)
            margins.append(res.diagnostics["sign_margins"].min())
        med[n] = (np.median(v), np.median(u))
        assert min(margins) > 0
    assert med[20_000][0] <= 0.15 and med[200_000][0] <= 0.06
    assert med[20_000][1] <= 0.04 and med[200_000][1] <= 0.012
    assert 2.0 <= med[20_000][0] / med[200_000][0] <= 4.5


def test_sign_margins_decrease_with_noise():
    net = _instance(1)
    m = [_run(net, 20_000, s, 1)[0].diagnostics["sign_margins"].min() for s in (0.1, 0.5, 1.0)]
    assert m[0] > m[1] > m[2] > 0


def test_polish_reaches_a_much_smaller_error():
    net = _instance(1)
    _, e0, _ = _run(net, 20_000, 0.1, 1)
    _, e1, _ = _run(net, 20_000, 0.1, 1, polish_steps=5)
    assert e1.V < e0.V / 5 and e1.U < e0.U / 3


def test_sign_by_projection_fixes_flipped_rows():
    net = _instance(2)
    X, Y = net.sample(5000, random_state=3, noise=0.1)
    flips = np.array([1.0, -1.0, -1.0])
    V, margins = sign_by_projection(X, Y, flips[:, None] * net.V)
    np.testing.assert_array_equal(V, net.V)
    assert np.all(margins > 0.5)


def test_polish_is_exact_without_noise_and_respects_a_mask():
    net = _instance(3)
    X, Y = net.sample(3000, random_state=4)
    rng = np.random.default_rng(0)
    V0 = net.V + 0.01 * rng.standard_normal(net.V.shape)
    Yc = Y.copy()
    mask = rng.random(Y.shape) > 0.05
    Yc[~mask] += rng.uniform(-10, 10, size=(~mask).sum())  # gross corruption off the mask
    U, V = polish(X, Yc, net.U, V0, n_iter=8, mask=mask)
    err = rf.metrics.parameter_error((U, V), net)
    assert err.V < 1e-10 and err.U < 1e-10


def test_noisy_refuses_fewer_outputs_than_units():
    net = planted(6, 3, 2, 0)
    X, Y = net.sample(3000, random_state=1, noise=0.1)
    with pytest.warns(rf.RelufastWarning, match="m = 2 < k = 3"):
        res = rf.recover(X, Y, n_hidden=3, method="bjw19-noisy")
    assert res.status == "unsupported"
