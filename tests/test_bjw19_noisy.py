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


# ---- noiseless data through bjw19-noisy: the exact activation-region refinement ----

#: Relative residual an exact float64 result reaches after the refinement (measured ~1e-15).
NOISELESS_RESIDUAL = 1e-12
#: Weight error of an exact float64 result: rounding level, with margin.
NOISELESS_WEIGHT_TOL = 1e-10


def _quiet(X, Y, k, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", rf.RelufastWarning)
        return rf.recover(X, Y, n_hidden=k, method="bjw19-noisy", random_state=0, **kw)


@pytest.mark.parametrize("m", [6, 3])  # m > k: the spectrum says noiseless; m = k: the certificate decides
def test_noiseless_data_end_exact(m):
    net = planted(8, 3, m, 4, max_condition=3.0, max_cos=0.7, max_output_condition=10.0)
    X, Y = net.sample(20_000, random_state=5)
    res = _quiet(X, Y, 3)
    assert res.status == "exact" and res.exact, res.message
    assert res.residual <= NOISELESS_RESIDUAL
    err = rf.metrics.parameter_error(res, net)
    assert err.V < NOISELESS_WEIGHT_TOL and err.U < NOISELESS_WEIGHT_TOL
    assert res.diagnostics["exact_refinement"].startswith("certified")
    assert res.counts["refine_rounds"] >= 1
    assert res.precision == "float64"


def test_noiseless_data_without_refinement_say_so():
    net = _instance(2)
    X, Y = net.sample(20_000, random_state=6)
    res = _quiet(X, Y, 3, exact_refine=False)
    assert res.status == "approximate" and not res.exact
    assert "exact_refine=True" in res.message
    assert res.diagnostics["exact_refinement"] == "not run: disabled"


def test_noisy_data_with_m_equal_k_stay_approximate():
    net = planted(8, 3, 3, 4, max_condition=3.0, max_cos=0.7, max_output_condition=10.0)
    X, Y = net.sample(20_000, random_state=7, noise=0.1)
    res = _quiet(X, Y, 3)
    assert res.status == "approximate" and not res.exact
    assert "noisy" in res.diagnostics["exact_refinement"]


def test_noisy_data_with_m_above_k_skip_the_refinement():
    res, _, _ = _run(_instance(3), 20_000, 0.1, 3)
    assert res.diagnostics["exact_refinement"] == "not run: the outputs look noisy"
    assert "refine_rounds" not in res.counts


def test_biased_noiseless_data_are_not_called_exact():
    net = planted(8, 3, 6, 4, max_condition=3.0, max_cos=0.7, max_output_condition=10.0, bias=0.3, offset=0.5)
    X, Y = net.sample(20_000, random_state=8)
    res = _quiet(X, Y, 3, exact_refine=True)
    assert not res.exact and res.status == "approximate"
    assert "atv21" in res.diagnostics["exact_refinement"] or "noisy" in res.diagnostics["exact_refinement"]


def test_float32_noiseless_outputs_are_exact_at_float32():
    """Rounding of float32 outputs is not noise (the noise test and tol use the floor)."""
    from relufast.stages.precision import FLOOR_FACTOR, UNIT_ROUNDOFF

    d, k = 8, 3
    net = _instance(5)
    X, Y = net.sample(20_000, random_state=9)
    res = _quiet(X, Y.astype(np.float32), k)
    assert res.status == "exact" and res.precision == "float32", res.message
    assert res.residual <= FLOOR_FACTOR * UNIT_ROUNDOFF["float32"] * np.sqrt(d + k)
    assert "float32 precision" in res.message
    err = rf.metrics.parameter_error(res, net)
    assert err.V < F32_WEIGHT_TOL and err.U < F32_WEIGHT_TOL


#: Weight error from float32 outputs: their rounding (6e-8) limits it; 1e-6 leaves 20x margin.
F32_WEIGHT_TOL = 1e-6


def test_exact_refine_is_validated():
    X, Y = _instance(0).sample(200, random_state=1)
    with pytest.raises(ValueError, match="exact_refine must be 'auto', True or False; got 'yes'"):
        rf.recover(X, Y, n_hidden=3, method="bjw19-noisy", exact_refine="yes")
    with pytest.raises(ValueError, match="tol must be a positive number"):
        rf.recover(X, Y, n_hidden=3, method="bjw19-noisy", tol=-1.0)


def test_a_refinement_that_stops_leaves_the_approximate_result(monkeypatch):
    import sys

    noisy_module = sys.modules["relufast.algorithms.bjw19.noisy"]  # the package exports the function

    def stop(*args, **kwargs):
        raise ValueError("the activation patterns populate more than max_regions regions")

    monkeypatch.setattr(noisy_module, "refine_to_exact", stop)
    X, Y = _instance(2).sample(5_000, random_state=6)
    res = _quiet(X, Y, 3)
    assert res.status == "approximate" and "max_regions" in res.diagnostics["exact_refinement"]
