"""Passive recovery statuses that tell the true cause (issue 31, items 5, 6 and 11).

``rank_deficient`` only when rank(Y) < n_hidden over every sample; a unit too weak or too
rarely active for a method is named as such, and ``auto`` goes on to the methods that
handle it; an error names the method the caller chose.
"""

import numpy as np
import pytest

import relufast
from relufast.planted import PlantedNetwork, two_layer


def _scaled(net, X, factor, unit):
    U = net.U.copy()
    U[:, unit] *= factor
    return PlantedNetwork(U=U, V=net.V, b=net.b, c=net.c).predict(X)


def _rank(Y, tol=1e-12):
    s = np.linalg.svd(Y, compute_uv=False)
    return int(np.sum(s > tol * s[0]))


@pytest.fixture(scope="module")
def rare():
    """A biased unit active on a handful of 24,000 samples; rank(Y) = k = 3."""
    net = two_layer(8, 3, 4, bias=[0.0, 0.0, -3.6], random_state=11)
    X, Y = net.sample(24_000, random_state=12)
    active = int(np.sum(X @ net.V[2] + net.b[2] > 0))
    assert 1 <= active <= 12 and _rank(Y) == 3
    return net, X, Y


@pytest.mark.parametrize("method", ["bjw19-gaussian", "bjw19-ica"])
def test_rarely_active_unit_is_not_rank_deficient(rare, method):
    _, X, Y = rare
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, Y, n_hidden=3, method=method, random_state=0)
    assert res.status == "failed", res.message
    assert "rank(Y) = 3 = n_hidden over all 24000 samples" in res.message
    assert "atv21" in res.message
    assert "rank(Y) = 2 < n_hidden" not in res.message


def test_auto_goes_on_to_atv21_when_a_rare_unit_is_also_small(rare):
    net, X, _ = rare
    Y = _scaled(net, X, 1e-6, 2)
    assert _rank(Y) == 3
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, Y, n_hidden=3, method="auto", random_state=0, time_limit=2.0)
    assert res.status != "rank_deficient", res.message
    tried = [a["method"] for a in res.diagnostics["auto_attempts"]]
    assert "atv21" in tried
    assert "bjw19-fpt" not in tried  # U has rank k: Alg. 7 is not for these data


@pytest.fixture(scope="module")
def plain():
    net = two_layer(9, 3, 4, random_state=17)
    X, Y = net.sample(16_000, random_state=18)
    return net, X, Y


@pytest.mark.parametrize("factor", [1e-8, 1e-9])
def test_weak_output_column_auto_is_exact_through_atv21(plain, factor):
    net, X, _ = plain
    Y = _scaled(net, X, factor, 1)
    res = relufast.recover(X, Y, n_hidden=3, method="auto", random_state=0)
    assert res.status == "exact", res.message
    assert relufast.metrics.parameter_error(res, net).V < 1e-6


@pytest.mark.parametrize("method", ["bjw19-gaussian", "bjw19-ica"])
def test_weak_output_column_names_a_weak_unit(plain, method):
    net, X, _ = plain
    Y = _scaled(net, X, 1e-8, 1)
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, Y, n_hidden=3, method=method, random_state=0)
    assert res.status == "failed", res.message
    assert "over all 16000 samples" in res.message and "weak" in res.message


def test_fpt_weak_output_column_is_not_non_identifiable(plain):
    net, X, _ = plain
    Y = _scaled(net, X, 1e-8, 1)
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, Y, n_hidden=3, method="bjw19-fpt", random_state=0)
    assert res.status != "non_identifiable", res.message
    assert "pairwise independent" not in res.message


def test_fpt_tiny_output_noise_is_not_non_identifiable():
    net = two_layer(7, 3, 4, random_state=23)
    X, Y = net.sample(16_000, random_state=24)
    Y = Y + 1e-10 * np.random.default_rng(25).standard_normal(Y.shape)
    res = relufast.recover(X, Y, n_hidden=3, method="bjw19-fpt", random_state=0)
    assert res.status == "exact", res.message  # the residual of the noise is below tol
    assert relufast.metrics.parameter_error(res, net).V < 1e-6


def test_rank_deficient_U_is_still_rank_deficient():
    rng = np.random.default_rng(3)
    V = rng.standard_normal((3, 8))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    U = rng.standard_normal((4, 2)) @ rng.standard_normal((2, 3))  # rank 2 < k = 3
    X = rng.standard_normal((12_000, 8))
    Y = PlantedNetwork(U=U, V=V, b=np.zeros(3), c=np.zeros(4)).predict(X)
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, Y, n_hidden=3, method="bjw19-gaussian", random_state=0)
    assert res.status == "rank_deficient"
    assert "numerical rank 2 < n_hidden = 3 over all 12000 samples" in res.message


def test_sparse_noise_error_names_the_method_called():
    net = two_layer(9, 3, 4, random_state=5)
    X, Y = net.sample(12, random_state=6)
    with pytest.raises(ValueError, match="bjw19-sparse-noise needs at least") as info:
        relufast.recover(X, Y, n_hidden=3, method="bjw19-sparse-noise")
    assert "bjw19-gaussian" not in str(info.value)


def test_float16_message_quotes_the_residual_of_the_result():
    net = two_layer(7, 3, 5, random_state=51)
    X, Y = net.sample(16_000, random_state=52)
    res = relufast.recover(X, Y.astype(np.float16), n_hidden=3, method="bjw19-gaussian", random_state=0)
    assert res.status == "exact"
    assert f"relative residual {res.residual:.2e}" in res.message


def test_fpt_on_float16_outputs_claims_no_dependent_columns():
    net = two_layer(8, 3, 4, random_state=53)
    X, Y = net.sample(16_000, random_state=54)
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, Y.astype(np.float16), n_hidden=3, method="bjw19-fpt", random_state=0)
    assert res.status != "non_identifiable", res.message
    assert "pairwise independent" not in res.message


@pytest.mark.parametrize("seed", [1, 3])
def test_offset_inputs_blame_the_offset_not_the_moment(seed, capfd):
    net = two_layer(10, 2, 3, random_state=seed)
    X = np.random.default_rng(seed + 10).standard_normal((20_000, 10)) + 3.0
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, net.predict(X), n_hidden=2, method="bjw19-gaussian", random_state=0)
    assert res.status == "failed"
    assert "X is not centred" in res.message and "atv21" in res.message
    assert "the moment estimate is too crude" not in res.message
    assert "DLASCL" not in "".join(capfd.readouterr())


@pytest.mark.parametrize("sigma", [1e-11, 3e-11])
def test_bjw19_noisy_is_exact_on_noise_below_tol(sigma):
    net = two_layer(9, 3, 5, random_state=61)
    X, Y = net.sample(16_000, random_state=62)
    Y = Y + sigma * np.random.default_rng(63).standard_normal(Y.shape)
    res = relufast.recover(X, Y, n_hidden=3, method="bjw19-noisy", random_state=0)
    assert res.status == "exact", res.message
    assert relufast.metrics.parameter_error(res, net).V < 1e-9


def test_bjw19_noisy_small_noise_reaches_the_noise_level():
    net = two_layer(9, 3, 5, random_state=64)
    X, Y = net.sample(16_000, random_state=65)
    E = 1e-7 * np.random.default_rng(66).standard_normal(Y.shape)
    res = relufast.recover(X, Y + E, n_hidden=3, method="bjw19-noisy", random_state=0)
    assert res.status == "approximate"
    noise = np.linalg.norm(E) / np.linalg.norm(Y + E)
    assert res.residual < 1.5 * noise, (res.residual, noise, res.message)
    assert relufast.metrics.parameter_error(res, net).V < 1e-5


@pytest.mark.parametrize("method", ["bjw19-gaussian", "bjw19-ica", "bjw19-fpt"])
def test_weak_unit_is_not_called_dead(plain, method):
    net, X, _ = plain
    Y = _scaled(net, X, 1e-8, 1)
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, Y, n_hidden=3, method=method, random_state=0)
    assert "never active" not in res.message, res.message


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_atv21_general_residual_is_that_of_a_fitted_network(seed):
    """Item 12: without fit, atv21-general divided T_2 by phi(b_i) and kept arbitrary signs: a
    unit with b = 5 gave |U| up to 1.7e8 and residuals up to 3.8e7 (``failed``, "no better
    than the mean"). The signs now follow the least-squares linear term and U, c are fitted:
    a residual below 1 that is the result's own, status ``approximate``."""
    rng = np.random.default_rng(seed)
    V = rng.standard_normal((3, 6))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    net = PlantedNetwork(U=rng.standard_normal((2, 3)), V=V, b=np.array([0.3, -0.5, 5.0]), c=rng.standard_normal(2))
    X = rng.standard_normal((40_000, 6))
    Y = net.predict(X)
    with pytest.warns(relufast.RelufastWarning):
        res = relufast.recover(X, Y, n_hidden=3, method="atv21-general", random_state=0)
    assert res.status == "approximate", res.message
    assert 0 < res.residual < 1
    assert res.residual == pytest.approx(np.linalg.norm(res.predict(X) - Y) / np.linalg.norm(Y), rel=1e-6)
    assert f"relative residual {res.residual:.2e}" in res.message
    assert np.abs(res.U).max() < 100
