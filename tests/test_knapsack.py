"""LLL (``_core.lll_reduce``) and the 0/1 combinations it finds (:mod:`relufast._knapsack`)."""

from __future__ import annotations

import numpy as np
import pytest

from relufast._knapsack import binary_combination, sign_flips
from relufast._native import core


def _gso_norms(B):
    """|b*_i|^2 of the rows of B (Gram-Schmidt by QR, exact enough for small lattices)."""
    R = np.linalg.qr(B.T.astype(float), mode="r")
    return np.diag(R) ** 2


def test_lll_keeps_the_lattice_and_meets_the_lovasz_condition():
    rng = np.random.default_rng(0)
    B0 = rng.integers(-1000, 1000, size=(12, 15)).astype(float)
    B = (np.eye(12) + np.triu(rng.integers(-50, 51, size=(12, 12)), 1)) @ B0  # skewed basis, same lattice
    res = core.lll_reduce(B, 0.99)
    R = res["basis"]
    assert res["complete"]
    # Same lattice: each basis is an integer unimodular combination of the other.
    T = np.linalg.lstsq(B0.T, R.T, rcond=None)[0].T
    assert np.allclose(T, np.round(T), atol=1e-6)
    assert abs(abs(np.linalg.det(np.round(T))) - 1) < 1e-6
    # Reduced: size-reduced and the Lovasz condition between neighbours.
    Q, Rf = np.linalg.qr(R.T)
    mu = (Rf / np.diag(Rf)[:, None]).T
    assert np.all(np.abs(np.tril(mu, -1)) <= 0.5 + 1e-9)
    bb = np.diag(Rf) ** 2
    assert np.all(bb[1:] >= (0.99 - np.diag(mu, -1) ** 2) * bb[:-1] - 1e-6 * bb[:-1])
    # Back to vectors as short as the unskewed basis's, from a skewed one.
    assert np.linalg.norm(R[0]) <= np.linalg.norm(B0, axis=1).min() < np.linalg.norm(B, axis=1).min()


def test_lll_finds_a_planted_short_vector():
    rng = np.random.default_rng(1)
    n = 20
    short = np.zeros(n)
    short[:3] = [1, -1, 1]
    U = np.eye(n) + np.triu(rng.integers(-3, 4, size=(n, n)), 1)  # unimodular
    B = np.vstack([short, 1000 * np.eye(n)[1:] + rng.integers(-500, 500, size=(n - 1, n))])
    B = U @ B
    R = core.lll_reduce(B)["basis"]
    assert np.linalg.norm(R[0]) <= np.sqrt(3) + 1e-9


@pytest.mark.parametrize(
    "B, match",
    [
        (np.array([[1.5, 0.0], [0.0, 1.0]]), "integers"),
        (np.array([[1.0, 2.0], [2.0, 4.0]]), "dependent"),
        (np.array([[2.0**53, 0.0], [0.0, 1.0]]), "2\\^52"),
        (np.array([[np.nan, 0.0], [0.0, 1.0]]), "integers"),
    ],
)
def test_lll_rejects_what_it_cannot_reduce(B, match):
    with pytest.raises(ValueError, match=match):
        core.lll_reduce(B)


def test_lll_stops_at_max_swaps_with_a_basis():
    rng = np.random.default_rng(2)
    B = rng.integers(-(10**6), 10**6, size=(30, 30)).astype(float)
    res = core.lll_reduce(B, 0.99, 5)
    assert not res["complete"] and res["swaps"] == 5
    T = np.linalg.solve(B.T, res["basis"].T).T
    assert np.allclose(T, np.round(T), atol=1e-6)


@pytest.mark.parametrize("k, r, seed", [(7, 3, 0), (30, 5, 1), (100, 10, 2), (100, 10, 3), (100, 30, 4)])
def test_binary_combination_finds_the_planted_subset(k, r, seed):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((r, k))
    delta = rng.random(k) < 0.5
    A_seen = A * (1 + 1e-13 * rng.standard_normal(A.shape))  # the accuracy of fitted terms
    found = binary_combination(A_seen, A @ delta, tol=1e-9 * np.linalg.norm(A))
    assert found is not None
    assert np.array_equal(found[0], delta)
    assert found[1] <= 1e-9 * np.linalg.norm(A)


def test_binary_combination_zero_columns_are_left_at_zero():
    rng = np.random.default_rng(5)
    A = rng.standard_normal((4, 12))
    A[:, [2, 7]] = 0.0
    delta = rng.random(12) < 0.5
    delta[[2, 7]] = False
    found = binary_combination(A, A @ delta, tol=1e-9)
    assert found is not None and np.array_equal(found[0], delta)


def test_binary_combination_says_none_when_no_subset_fits():
    rng = np.random.default_rng(6)
    A = rng.standard_normal((5, 20))
    t = A @ (rng.random(20) < 0.5) + 0.3  # off every 0/1 combination
    assert binary_combination(A, t, tol=1e-9) is None


@pytest.mark.parametrize("q, k, k_prev", [(6, 5, 10), (1, 60, 10), (2, 40, 4)])
def test_sign_flips_from_the_next_linear_term(q, k, k_prev):
    """beta = -sum_j delta_j v_j w~_j: least squares when the equations outnumber the signs,
    the subset sum when they do not (1 x 10 equations for 60 signs)."""
    rng = np.random.default_rng(k)
    W = rng.standard_normal((k, k_prev))
    coef = rng.standard_normal((q, k))
    delta = rng.random(k) < 0.5
    beta = -(coef[:, delta] @ W[delta])
    flip, ok = sign_flips(W, coef, beta)
    assert ok and np.array_equal(flip, delta)
    if q * k_prev < k:  # no 0/1 combination leaves a residual of 0.1 (the loose least-squares test
        # above, kept for deeper layers' rougher terms, applies only with more equations than signs)
        flip, ok = sign_flips(W, coef, beta + 0.1 * rng.standard_normal(beta.shape))
        assert not ok
