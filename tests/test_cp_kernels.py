"""The CP-ALS contraction kernels (C++ ``slice_column_sums`` / ``slice_weighted_sum``) and
the BLAS thread lift around CP-ALS's products."""

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from relufast._blas import blas_threads, cores, single_threaded_blas, thread_budget, thread_map
from relufast._native import core
from relufast.stages.tensor import _dgemm, cp_als


@pytest.mark.parametrize("gemm", ["dgemm", "eigen"])
@pytest.mark.parametrize("m,k,k2,r", [(1, 1, 1, 1), (3, 5, 4, 2), (7, 70, 3, 9), (128, 40, 40, 33), (2, 3, 5, 0)])
def test_kernels_match_numpy_and_do_not_depend_on_threads(m, k, k2, r, gemm):
    rng = np.random.default_rng(m * 100 + k)
    P = rng.standard_normal((m * k, k2))
    C = rng.standard_normal((k2, r))
    W = rng.standard_normal((k, r))
    A = rng.standard_normal((m, r))
    dgemm = _dgemm() if gemm == "dgemm" else None
    with single_threaded_blas():
        Q, T = core.slice_products(P, k, C, W, dgemm, 1)
        Q0, T0 = core.slice_products(P, k, C, None, dgemm, 1)
        S = core.slice_weighted_sum(Q, A, 1)
        assert Q.shape == (m * k, r) and T.shape == (m, r) and S.shape == (k, r) and T0.shape == (0, r)
        np.testing.assert_allclose(Q, P @ C, rtol=1e-13, atol=1e-13)
        assert np.array_equal(Q0, Q)
        np.testing.assert_allclose(T, np.einsum("ipr,pr->ir", Q.reshape(m, k, r), W), rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(S, np.einsum("ipr,ir->pr", Q.reshape(m, k, r), A), rtol=1e-13, atol=1e-13)
        for threads in (2, 3, 0):  # bit for bit the same on any number of threads
            Qt, Tt = core.slice_products(P, k, C, W, dgemm, threads)
            assert np.array_equal(Qt, Q) and np.array_equal(Tt, T)
            assert np.array_equal(core.slice_weighted_sum(Q, A, threads), S)


def test_kernels_reject_shapes_that_do_not_fit():
    P = np.zeros((10, 3))
    with pytest.raises(ValueError, match=r"multiple of k1 >= 1 rows; got P 10 x 3, k1 = 4"):
        core.slice_products(P, 4, np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"C must have P.shape\[1\] rows; got P 10 x 3, C 2 x 2"):
        core.slice_products(P, 5, np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"W must be k1 x C.shape\[1\]; got W 5 x 3, k1 = 5, C 3 x 2"):
        core.slice_products(P, 5, np.zeros((3, 2)), np.zeros((5, 3)))
    with pytest.raises(ValueError, match=r"\(m k\) x r for A \(m x r\).*got S 10 x 3, A 3 x 3"):
        core.slice_weighted_sum(P, np.zeros((3, 3)))
    with pytest.raises(ValueError, match=r"m >= 1"):
        core.slice_weighted_sum(np.zeros((0, 3)), np.zeros((0, 3)))


def _blas_threads_now():
    return {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


def test_blas_threads_lifts_the_single_thread_limit_to_the_budget_and_restores_it():
    if not _blas_threads_now():
        pytest.skip("no BLAS library that threadpoolctl controls")
    want = min(2, cores())
    with single_threaded_blas():
        assert set(_blas_threads_now().values()) == {1}
        with thread_budget(want), blas_threads():
            assert set(_blas_threads_now().values()) == {want}
        assert set(_blas_threads_now().values()) == {1}
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"), thread_budget(want), blas_threads():
        # outside relufast's limit (a user's own): left as it is
        assert set(_blas_threads_now().values()) == {1}


def test_thread_budget_resolves_n_jobs_and_thread_map_keeps_order():
    from relufast._blas import kernel_threads

    assert kernel_threads() == 0  # outside a method: every core
    with thread_budget(3):
        assert kernel_threads() == 3
        assert thread_map(lambda x: x * x, range(20)) == [x * x for x in range(20)]
        with thread_budget("junk"):  # left for the method's own check: the budget stays
            assert kernel_threads() == 3
    with thread_budget(None):
        assert kernel_threads() == 0

    def boom(x):
        if x == 7:
            raise RuntimeError("item 7")
        return x

    with thread_budget(4), pytest.raises(RuntimeError, match="item 7"):
        thread_map(boom, range(10))


def test_cp_als_is_the_same_on_one_thread_and_on_several():
    rng = np.random.default_rng(5)
    m, k = 40, 30
    A = rng.standard_normal((m, k))
    Z = rng.standard_normal((k, k))
    Z /= np.linalg.norm(Z, axis=0)
    P = np.einsum("ir,jr,kr->ijk", A, Z, Z) + 1e-3 * rng.standard_normal((m, k, k))
    B0 = Z + 0.1 * rng.standard_normal(Z.shape)
    with single_threaded_blas(), thread_budget(1):
        one = cp_als(P, B0, n_iter=30)
    with single_threaded_blas(), thread_budget(2):
        two = cp_als(P, B0, n_iter=30)
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    # and a fit: every column of Z found again, up to sign, to the noise level
    assert np.all(np.abs(one[1].T @ Z).max(axis=0) > 1 - 1e-4)


@pytest.mark.parametrize("n", [10, 5000, 20000])
def test_blocked_products_match_numpy_on_any_number_of_threads(n):
    from relufast._blas import crossprod, matmul

    rng = np.random.default_rng(n)
    A, B, C = rng.standard_normal((n, 300)), rng.standard_normal((300, 40)), rng.standard_normal((n, 30))
    with thread_budget(1):
        one = matmul(A, B), crossprod(A, C)
    np.testing.assert_allclose(one[0], A @ B, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(one[1], A.T @ C, rtol=1e-12, atol=1e-9)
    with thread_budget(3):
        three = matmul(A, B), crossprod(A, C)
    assert np.array_equal(one[0], three[0]) and np.array_equal(one[1], three[1])


def test_row_gathers_match_numpy_on_any_number_of_threads():
    from relufast._blas import take_rows

    rng = np.random.default_rng(7)
    X = rng.standard_normal((30000, 300))  # 72 MB: gathered by blocks on the threads
    idx = rng.permutation(30000)[:20000]
    for threads in (1, 3):
        with thread_budget(threads):
            assert np.array_equal(take_rows(X, idx), X[idx])
            assert np.array_equal(take_rows(X, None, 100, 25000), X[100:25000])
            got = take_rows(X.astype(np.float32), idx[:50])
            assert got.dtype == np.float64 and np.array_equal(got, X.astype(np.float32)[idx[:50]])
            assert np.array_equal(take_rows(X[:, 0], idx), X[idx, 0])  # one-dimensional


def test_tall_factorisations_match_lapack_and_do_not_depend_on_threads():
    import scipy.linalg

    from relufast._blas import tall_lstsq, tall_svd

    rng = np.random.default_rng(8)
    Y = rng.standard_normal((20000, 40)) @ rng.standard_normal((40, 60))  # rank 40 of 60
    F = np.maximum(rng.standard_normal((60000, 41)), 0.0)
    F[:, -1] = 1.0
    T = F @ rng.standard_normal((41, 5))
    out = {}
    for threads in (1, 3):
        with thread_budget(threads):
            out[threads] = tall_svd(Y, 40), tall_lstsq(F, T)
    (U, s, Vt), (Xs, sf) = out[1]
    s0 = np.linalg.svd(Y, compute_uv=False)
    np.testing.assert_allclose(s, s0, rtol=0, atol=1e-13 * s0[0])
    assert s[40] < 1e-14 * s[0]  # the rank is seen as LAPACK sees it
    np.testing.assert_allclose(U.T @ U, np.eye(40), atol=1e-13)
    np.testing.assert_allclose((U * s[:40]) @ Vt[:40], Y, atol=1e-12 * np.abs(Y).max())
    np.testing.assert_allclose(Xs, scipy.linalg.lstsq(F, T)[0], rtol=1e-11, atol=1e-12)
    assert abs(sf[0] / sf[-1] - np.linalg.cond(F)) < 1e-8 * np.linalg.cond(F)
    for a, b in zip(out[1][0] + out[1][1], out[3][0] + out[3][1]):
        assert np.array_equal(a, b)
    F[:, 3] = F[:, 4]  # rank-deficient: left to the caller's pivoted QR
    assert tall_lstsq(F, T) is None
    U, s, _ = tall_svd(Y[:, :30], 40)  # more asked than there are columns: all of them
    assert U.shape == (20000, 30) and s.shape == (30,)


def test_null_space_test_by_the_gram_matrix():
    from relufast.stages.diagnostics import _surely_full_rank, input_null_space

    rng = np.random.default_rng(9)
    X = rng.standard_normal((4000, 100))
    assert _surely_full_rank(X[:400]) and input_null_space(X).shape == (0, 100)
    X[:, 7] = X[:, 8]  # one direction unseen: the SVD decides, and finds it
    assert not _surely_full_rank(X[:400])
    N = input_null_space(X)
    assert N.shape == (1, 100) and abs(abs(N[0, 7]) - np.sqrt(0.5)) < 1e-12


def test_recovery_is_the_same_on_one_thread_and_on_two():
    """End to end through the blocked products (n x d x k above 2^24) and CP-ALS's kernels:
    n_jobs changes the threads, not the numbers."""
    import relufast as rf

    net = rf.planted.two_layer(40, 8, 8, random_state=3)
    X, Y = net.sample(60000, random_state=4)
    one = rf.recover(X, Y, n_hidden=8, method="bjw19-gaussian", n_jobs=1, random_state=0)
    two = rf.recover(X, Y, n_hidden=8, method="bjw19-gaussian", n_jobs=2, random_state=0)
    assert one.status == "exact" and two.status == "exact"
    assert np.array_equal(one.U, two.U) and np.array_equal(one.V, two.V)
    assert rf.metrics.parameter_error(one, net).V < 1e-10
