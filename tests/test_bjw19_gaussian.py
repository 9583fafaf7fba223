"""Planted recovery with the BJW19 Gaussian pipeline (Thm 7; Alg. 4 + 5)."""

import dataclasses
import warnings

import numpy as np
import pytest

import relufast as rf

from .conftest import EXACT_TOL, planted

#: (m, k, d, n) from the BJW19 oracle sizes plus the issue's cases: m > k, m = k, k = d, k close to d.
SHAPES = [
    (4, 3, 5, 5000),
    (6, 4, 8, 50000),
    (10, 5, 20, 100000),
    (3, 3, 3, 20000),  # m = k = d
    (8, 2, 4, 5000),
    (5, 5, 6, 40000),  # m = k, k close to d
]


def _recover_quiet(X, Y, k, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", rf.RelufastWarning)
        return rf.recover(X, Y, n_hidden=k, method="bjw19-gaussian", **kw)


@pytest.mark.parametrize("m,k,d,n", SHAPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_recovery(m, k, d, n, seed):
    net = planted(d, k, m, seed, max_cos=0.7, max_condition=3.0, max_output_condition=10.0)
    X, Y = net.sample(n, random_state=seed + 1000)
    res = _recover_quiet(X, Y, k, random_state=seed)
    err = rf.metrics.parameter_error(res, net)
    assert res.status == "exact" and res.exact
    assert err.U < EXACT_TOL and err.V < EXACT_TOL
    assert res.residual < 1e-12
    assert res.U.shape == (m, k) and res.V.shape == (k, d)
    np.testing.assert_allclose(np.linalg.norm(res.V, axis=1), 1.0, rtol=1e-14)
    assert res.counts["certified_rows"] == k
    for stage in ("moments", "tensor", "refine", "fit", "total"):
        assert res.seconds[stage] >= 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_recovery_plain_gaussian_network(seed):
    # No rejection sampling: the default planted network of the README.
    net = rf.planted.two_layer(d=20, k=5, m=8, random_state=seed)
    X, Y = net.sample(20000, random_state=seed + 1)
    res = _recover_quiet(X, Y, 5)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.U < EXACT_TOL and err.V < EXACT_TOL


@pytest.mark.parametrize("condition", [3.0, 10.0])
def test_exact_recovery_conditioned_V(condition):
    net = planted(10, 4, 6, 5, condition=condition)
    X, Y = net.sample(200000, random_state=6)
    res = _recover_quiet(X, Y, 4, random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.U < EXACT_TOL and err.V < EXACT_TOL


def test_unnormalised_rows_are_recovered_up_to_scaling():
    net = planted(8, 3, 5, 11)
    scale = np.array([0.3, 2.0, 7.0])
    X = np.random.default_rng(12).standard_normal((20000, 8))
    Y = np.maximum(X @ (scale[:, None] * net.V).T, 0) @ net.U.T
    res = _recover_quiet(X, Y, 3)
    err = rf.metrics.parameter_error(res, (net.U * scale, net.V))
    assert res.exact and err.U < EXACT_TOL and err.V < EXACT_TOL


def test_noise_is_graceful_and_error_shrinks_with_noise():
    net = planted(20, 5, 8, 3, max_cos=0.7)
    errors = []
    for sigma in (1e-1, 1e-2, 1e-3, 1e-4):
        X, Y = net.sample(50000, random_state=4, noise=sigma)
        with pytest.warns(rf.RelufastWarning, match="not exactly realizable"):
            res = rf.recover(X, Y, n_hidden=5, method="bjw19-gaussian", random_state=0)
        assert res.status == "approximate" and not res.exact
        errors.append(rf.metrics.parameter_error(res, net).V)
    # Measured: error ~ sigma (0.07, 6e-3, 2e-4, 2e-5 on this seed); require monotone
    # decrease by at least 3x per decade and a small error at the smallest noise.
    assert all(b < a / 3 for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 1e-3


def test_rank_deficient_outputs_give_a_status():
    net = planted(6, 3, 4, 0)
    U = net.U.copy()
    U[:, 2] = U[:, 1]  # two equal columns: rank(Y) = 2 < k
    X = np.random.default_rng(1).standard_normal((5000, 6))
    Y = np.maximum(X @ net.V.T, 0) @ U.T
    with pytest.warns(rf.RelufastWarning, match="numerical rank 2 < n_hidden = 3"):
        res = rf.recover(X, Y, n_hidden=3, method="bjw19-gaussian")
    assert res.status == "rank_deficient" and not res.exact and res.V is None


def test_fewer_outputs_than_hidden_units_are_unsupported_and_name_atv21():
    # m < k is outside Thm 7 (rank(U) = k); atv21 handles it (and auto routes it there).
    net = rf.planted.PlantedNetwork(U=np.array([[1.0, -0.8, 1.2]]), V=planted(6, 3, 2, 0).V)
    X, Y = net.sample(100000, random_state=1)
    with pytest.warns(rf.RelufastWarning, match="m >= k.*atv21"):
        res = rf.recover(X, Y[:, 0], n_hidden=3, method="bjw19-gaussian", random_state=0)
    assert res.status == "unsupported" and not res.exact
    res = rf.recover(X, Y[:, 0], n_hidden=3, method="atv21", random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.U < EXACT_TOL and err.V < EXACT_TOL
    assert np.max(np.abs(res.b)) < 1e-8 and np.max(np.abs(res.c)) < 1e-8


def test_non_gaussian_input_warns_and_never_claims_false_exactness():
    net = planted(8, 3, 5, 2, max_cos=0.7)
    X, Y = net.sample(40000, random_state=3, input="laplace")
    with pytest.warns(rf.RelufastWarning, match="does not look like standard Gaussian"):
        res = rf.recover(X, Y, n_hidden=3, method="bjw19-gaussian", random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.diagnostics["gaussian_ok"] is False
    # Certified rows are exact whatever X is; an 'exact' claim must be true.
    if res.exact:
        assert err.U < EXACT_TOL and err.V < EXACT_TOL
    else:
        assert res.status in ("failed", "approximate")


def test_gaussian_input_passes_the_diagnostic():
    net = planted(8, 3, 5, 2)
    X, Y = net.sample(20000, random_state=3)
    res = _recover_quiet(X, Y, 3)
    assert res.diagnostics["gaussian_ok"] is True


def test_determinism_with_random_state():
    net = planted(10, 4, 6, 8)
    X, Y = net.sample(20000, random_state=9, noise=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        a = rf.recover(X, Y, n_hidden=4, random_state=42)
        b = rf.recover(X, Y, n_hidden=4, random_state=42)
    np.testing.assert_array_equal(a.U, b.U)
    np.testing.assert_array_equal(a.V, b.V)


def test_result_is_frozen():
    net = planted(6, 2, 3, 0)
    X, Y = net.sample(3000, random_state=1)
    res = _recover_quiet(X, Y, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.status = "failed"
    with pytest.raises(ValueError):
        res.V[0, 0] = 1.0
    with pytest.raises(TypeError):
        res.seconds["total"] = 0.0
    np.testing.assert_allclose(res.predict(X), Y, atol=1e-12 * np.abs(Y).max())


def test_auto_method_says_why():
    net = planted(6, 2, 3, 0)
    X, Y = net.sample(3000, random_state=1)
    res = rf.recover(X, Y, n_hidden=2)
    assert res.method == "bjw19-gaussian" and "chose bjw19-gaussian" in res.diagnostics["auto"]
    assert res.exact
    X, Y = net.sample(300, random_state=1, input="laplace")
    res = rf.recover(X, Y, n_hidden=2)
    # auto tries the Gaussian pipeline first whatever X is: its certificate holds for any law
    assert res.exact and res.diagnostics["auto_attempts"][0]["method"] == "bjw19-gaussian"
    assert "does not look Gaussian" in res.diagnostics["auto"]
    net = planted(5, 4, 2, 3)
    X, Y = net.sample(5000, random_state=4)
    res = rf.recover(X, Y, n_hidden=4)
    assert res.method == "bjw19-fpt" and "Alg. 7" in res.diagnostics["auto"] and res.exact


def test_unknown_method_lists_valid_ones():
    with pytest.raises(
        ValueError,
        match="valid methods are 'auto', 'atv21', 'atv21-general', 'bjw19-enumeration', 'bjw19-fpt', 'bjw19-gaussian'",
    ):
        rf.recover(np.zeros((10, 2)), np.zeros((10, 2)), n_hidden=1, method="sgd")


def test_single_hidden_unit_and_1d_outputs():
    net = planted(5, 1, 1, 4)
    X, Y = net.sample(3000, random_state=5)
    res = _recover_quiet(X, Y[:, 0], 1)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.V < EXACT_TOL and err.U < EXACT_TOL


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_non_identity_covariance_is_whitened(seed):
    # Spec oracle 5 (BJW19 Remark 3): (m, k, d, n) = (6, 4, 8, 5e4), Sigma = R diag(1..4) R^T.
    rng = np.random.default_rng(100 + seed)
    R = np.linalg.qr(rng.standard_normal((8, 8)))[0]
    L = np.linalg.cholesky(R @ np.diag(np.linspace(1, 4, 8)) @ R.T)
    net = planted(8, 4, 6, seed, max_cos=0.7, max_condition=3.0)
    X = rng.standard_normal((50000, 8)) @ L.T
    Y = net(X)
    res = _recover_quiet(X, Y, 4, random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.U < EXACT_TOL and err.V < EXACT_TOL
    assert res.diagnostics["whitened"] and res.diagnostics["gaussian_ok"]
    assert rf.recover(X, Y, n_hidden=4).method == "bjw19-gaussian"  # auto sees Gaussian input


def test_singular_input_covariance_is_reported():
    net = planted(6, 2, 3, 0)
    X, _ = net.sample(5000, random_state=1)
    X[:, 5] = X[:, 4]  # inputs in a 5-dimensional subspace
    # The method runs on the row space of X (relufast.subspace): an exact fit there, not unique.
    with pytest.warns(rf.RelufastWarning, match="span only 5 of 6 dimensions"):
        res = rf.recover(X, net(X), n_hidden=2, method="bjw19-gaussian")
    assert res.status == "non_identifiable" and not res.exact and res.residual < 1e-10
    assert res.diagnostics["input_null_space"].shape == (1, 6)
    with pytest.raises(ValueError, match="whiten must be 'auto', True or False"):
        rf.recover(X, net(X), n_hidden=2, method="bjw19-gaussian", whiten="yes")
