"""BJW19 exact algorithms for any input (Alg. 1-2) and rank-deficient U (Alg. 7)."""

import warnings

import numpy as np
import pytest

import relufast as rf

from .conftest import EXACT_TOL, planted


def _quiet(method, X, Y, k, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", rf.RelufastWarning)
        return rf.recover(X, Y, n_hidden=k, method=method, **kw)


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("law", ["laplace", "uniform", "rademacher"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_enumeration_exact_on_non_gaussian_inputs(k, law, seed):
    net = planted(4, k, 3, seed, max_cos=0.9)
    X, Y = net.sample(200, random_state=seed + 10, input=law)
    if law == "rademacher":
        X = X + 0.05 * np.random.default_rng(seed).standard_normal(X.shape)  # general position
        Y = net(X)
    res = _quiet("bjw19-enumeration", X, Y, k, random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.status == "exact" and res.exact and res.residual < 1e-12
    assert err.U < EXACT_TOL and err.V < EXACT_TOL
    assert all(res.diagnostics["determined"])
    assert res.counts["patterns_tried"] >= k


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_enumeration_small_n_uses_lps_and_fits_exactly(seed):
    # Spec oracle 8: (m, k, d, n) = (3, 2, 3, 12). The fit is exact; the rows need not be
    # the planted ones when their support is too small to determine them.
    net = planted(3, 2, 3, seed)
    X, Y = net.sample(12, random_state=seed + 1)
    res = rf.recover(X, Y, n_hidden=2, method="bjw19-enumeration", random_state=0)
    assert res.exact and res.residual < 1e-9
    assert np.allclose(res.predict(X), Y, atol=1e-9 * np.abs(Y).max())
    assert "does not by itself make the network unique" in res.message
    if all(res.diagnostics["determined"]):
        assert rf.metrics.parameter_error(res, net).V < 1e-8


def test_enumeration_with_enough_samples_recovers_planted_rows():
    # Spec oracle 8, second part: (3, 2, 3, 40) -> V* up to permutation to 1e-8.
    for seed in range(3):
        net = planted(3, 2, 3, seed)
        X, Y = net.sample(40, random_state=seed + 1)
        res = _quiet("bjw19-enumeration", X, Y, 2)
        assert rf.metrics.parameter_error(res, net).V < 1e-8


def test_enumeration_result_independent_of_threads():
    net = planted(3, 3, 3, 5)
    X, Y = net.sample(15, random_state=6, input="laplace")
    a = rf.recover(X, Y, n_hidden=3, method="bjw19-enumeration", n_jobs=1, random_state=0)
    b = rf.recover(X, Y, n_hidden=3, method="bjw19-enumeration", n_jobs=2, random_state=0)
    np.testing.assert_array_equal(a.V, b.V)
    assert a.counts["patterns_tried"] == b.counts["patterns_tried"]


def test_enumeration_rank_deficient_outputs():
    net = planted(4, 3, 3, 0)
    U = net.U.copy()
    U[:, 2] = 2 * U[:, 0]
    X = np.random.default_rng(1).laplace(size=(100, 4))
    Y = np.maximum(X @ net.V.T, 0) @ U.T
    with pytest.warns(rf.RelufastWarning, match=r"rank 2 < n_hidden = 3.*NP-hard"):
        res = rf.recover(X, Y, n_hidden=3, method="bjw19-enumeration")
    assert res.status == "rank_deficient" and res.V is None


def test_enumeration_too_high_rank_is_not_realizable():
    net = planted(4, 2, 3, 0)
    X, Y = net.sample(100, random_state=1, noise=0.01)
    with pytest.warns(rf.RelufastWarning, match="rank 3 > n_hidden = 2"):
        res = rf.recover(X, Y, n_hidden=2, method="bjw19-enumeration")
    assert res.status == "failed"


def test_enumeration_limits():
    net = planted(3, 3, 3, 2)
    X, Y = net.sample(12, random_state=3)
    with pytest.warns(rf.RelufastWarning, match="stopped by max_patterns"):
        res = rf.recover(X, Y, n_hidden=3, method="bjw19-enumeration", max_patterns=1)
    assert res.status == "failed" and res.diagnostics["stopped_by"] == "max_patterns"
    with pytest.raises(ValueError, match="time_limit must be a positive number"):
        rf.recover(X, Y, n_hidden=3, method="bjw19-enumeration", time_limit=-1)


def test_iterative_lp_finds_a_row_and_respects_independence():
    from relufast.algorithms.bjw19 import iterative_lp

    net = planted(3, 2, 3, 4)
    X, Y = net.sample(30, random_state=5)
    B = np.linalg.svd(Y, full_matrices=False)[0][:, :2].T
    F = np.maximum(X @ net.V.T, 0)
    S = F[:, 0] > 0
    rng = np.random.default_rng(0)
    w, lps = iterative_lp(X, S, B, [], rng=rng)
    assert w is not None and lps == 1
    np.testing.assert_array_equal(X @ w > 1e-9, S)
    # Asking for a row independent of the one already found, on the same pattern: infeasible
    # (the only rectified vector with this support is that row), after both LPs.
    w2, lps2 = iterative_lp(X, S, B, [F[:, 0]], rng=rng)
    assert w2 is None and lps2 == 2


@pytest.mark.parametrize("m,k,d,n", [(2, 4, 5, 5000), (3, 5, 5, 20000), (2, 6, 8, 20000)])
def test_fpt_exact_with_fewer_outputs_than_units(m, k, d, n):
    net = planted(d, k, m, 3)
    X, Y = net.sample(n, random_state=4)
    res = _quiet("bjw19-fpt", X, Y, k)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.U < EXACT_TOL and err.V < EXACT_TOL
    assert res.counts["classes"] == k


def test_fpt_refuses_antiparallel_columns():
    rng = np.random.default_rng(0)
    V = rng.standard_normal((2, 3))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    u = np.array([1.0, 0.5])
    X = rng.standard_normal((2000, 3))
    Y = np.maximum(X @ V.T, 0) @ np.stack([u, -u], 1).T
    with pytest.warns(rf.RelufastWarning, match="antiparallel"):
        res = rf.recover(X, Y, n_hidden=2, method="bjw19-fpt")
    assert res.status == "non_identifiable" and res.V is None and not res.exact


def test_fpt_refuses_a_single_output():
    net = planted(3, 2, 1, 0)
    X, Y = net.sample(2000, random_state=1)
    with pytest.warns(rf.RelufastWarning, match="at least 2 outputs"):
        res = rf.recover(X, Y, n_hidden=2, method="bjw19-fpt")
    assert res.status == "unsupported"


def test_fpt_too_few_samples():
    net = planted(5, 4, 2, 3)
    X, Y = net.sample(30, random_state=4)
    with pytest.warns(rf.RelufastWarning, match="add samples"):
        res = rf.recover(X, Y, n_hidden=4, method="bjw19-fpt")
    assert res.status == "insufficient_samples"


def test_lemma16_pair_agree_on_most_samples_and_no_method_claims_a_wrong_network():
    n1, n2 = rf.planted.lemma16_pair(1e-3)
    X = np.random.default_rng(0).standard_normal((100, 2))
    assert np.mean(np.isclose(n1(X), n2(X), rtol=0, atol=1e-14)) > 0.9
    Y = n1(X)
    for method in ("bjw19-gaussian", "bjw19-enumeration", "bjw19-fpt"):
        with pytest.warns(rf.RelufastWarning):
            res = rf.recover(X, Y, n_hidden=2, method=method)
        assert not res.exact  # m = 1 < k: every method refuses


@pytest.mark.parametrize("seed", range(6))
def test_lemma16_variant_with_three_outputs_fits_exactly_without_claiming_uniqueness(seed):
    # Spec oracle 11 variant: m = 3, generic U; both rows of relu(V X) often have the same
    # support, so the data do not determine the network. Algorithm 2 must still return an
    # exact factorization (one pattern may serve two rows) and must not claim uniqueness.
    n1, _ = rf.planted.lemma16_pair(1e-3, m=3, random_state=seed)
    X = np.random.default_rng(seed + 1).standard_normal((100, 2))
    Y = n1(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        res = rf.recover(X, Y, n_hidden=2, method="bjw19-enumeration")
    assert res.exact
    np.testing.assert_allclose(res.predict(X), Y, atol=1e-9 * np.abs(Y).max())
    assert "does not by itself make the network unique" in res.message


def test_relu_separability_instance():
    X, Y = rf.planted.relu_separability_instance([[1, -2, 3, 4, -5, 6], [-1, 2, -3, -4, 5, -6]], 6)
    assert X.shape == (2 + 17, 8) and Y.shape == (19, 1)
    # A satisfying assignment (all true) gives a network with alpha = [1, 1] that fits.
    v1 = np.r_[np.ones(6), 1.0, -0.5]
    v2 = np.r_[-np.ones(6), -0.5, 1.0]
    np.testing.assert_allclose(np.maximum(X @ v1, 0) + np.maximum(X @ v2, 0), Y[:, 0])
    # The outputs have rank 1 < k = 2: the enumeration refuses (NP-hard regime, Thm 2).
    with pytest.warns(rf.RelufastWarning, match="NP-hard"):
        res = rf.recover(X, Y, n_hidden=2, method="bjw19-enumeration")
    assert res.status == "rank_deficient"
    with pytest.raises(ValueError, match="nonempty list of literals"):
        rf.planted.relu_separability_instance([[0, 1]], 3)
