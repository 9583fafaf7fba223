"""BJW19 Section 8: principal component pursuit and exact recovery under sparse noise."""

import numpy as np
import pytest

import relufast as rf
from relufast.stages.robust_pca import principal_component_pursuit

from .conftest import EXACT_TOL


def _instance(seed, m=100, n=2000, k=3, d=5, fraction=0.05):
    net = rf.planted.two_layer(d=d, k=k, m=m, random_state=seed, orthonormal_U=True)
    X, Y0 = net.sample(n, random_state=seed + 1)
    Y, support = rf.planted.sparse_corruption(Y0, fraction, random_state=seed + 2)
    return net, X, Y0, Y, support


@pytest.mark.parametrize("seed", [0, 1])
def test_pcp_separates_low_rank_and_sparse(seed):
    # Spec oracle 13: relative error <= 1e-7 (prototype 2.8e-9) and the exact support.
    net, X, Y0, Y, support = _instance(seed)
    r = principal_component_pursuit(Y)
    assert r.converged and r.rank == 3
    assert np.linalg.norm(r.L - Y0) / np.linalg.norm(Y0) < 1e-7
    np.testing.assert_array_equal(np.abs(r.S) > 1e-7 * np.abs(Y).max(), support)


@pytest.mark.parametrize("seed", [0, 1])
def test_sparse_noise_pipeline_is_exact(seed):
    net, X, Y0, Y, support = _instance(seed)
    res = rf.recover(X, Y, n_hidden=3, method="bjw19-sparse-noise", random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.status == "exact" and res.exact
    assert err.U < 1e-8 and err.V < 1e-8  # target 1e-8; measured ~1e-16
    assert err.U < EXACT_TOL and err.V < EXACT_TOL
    np.testing.assert_array_equal(res.diagnostics["corrupted"], support)


def test_ten_percent_corruption_is_exact():
    # The issue asks for 5-10%; at (m, n, k, d) = (200, 3000, 5, 8) 10% is exact.
    net, X, Y0, Y, support = _instance(4, m=200, n=3000, k=5, d=8, fraction=0.10)
    res = rf.recover(X, Y, n_hidden=5, method="bjw19-sparse-noise", random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.U < EXACT_TOL and err.V < EXACT_TOL
    np.testing.assert_array_equal(res.diagnostics["corrupted"], support)


def test_pcp_partial_svd_path_agrees():
    rng = np.random.default_rng(0)
    L0 = rng.standard_normal((600, 3)) @ rng.standard_normal((3, 300))
    S0 = np.where(rng.random(L0.shape) < 0.03, rng.uniform(-10, 10, L0.shape), 0.0)
    r = principal_component_pursuit(L0 + S0)  # min dimension 300 > 200: randomised SVD
    assert r.converged and r.rank == 3
    assert np.linalg.norm(r.L - L0) / np.linalg.norm(L0) < 1e-7


def test_too_dense_corruption_is_reported():
    net, X, Y0, Y, support = _instance(3, m=20, n=500, fraction=0.45)
    with pytest.warns(rf.RelufastWarning):
        res = rf.recover(X, Y, n_hidden=3, method="bjw19-sparse-noise")
    assert not res.exact
