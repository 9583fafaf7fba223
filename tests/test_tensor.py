import numpy as np
import pytest

from relufast.stages.tensor import cp_als, input_span, jennrich, merge_symmetric_factors, project


def _cp(rng, m, k):
    A = rng.standard_normal((m, k))
    Z = rng.standard_normal((k, k))
    Z /= np.linalg.norm(Z, axis=0)
    return np.einsum("ir,jr,kr->ijk", A, Z, Z), A, Z


def _match_abs(Z_est, Z):
    C = np.abs(Z_est.T @ Z)
    return C.max(axis=0)


def test_jennrich_recovers_exact_factors():
    rng = np.random.default_rng(0)
    P, A, Z = _cp(rng, 6, 4)
    Z_est, gap = jennrich(P, np.random.default_rng(1))
    assert gap > 1e-3
    assert np.all(_match_abs(Z_est, Z) > 1 - 1e-10)


def test_cp_als_polishes_a_perturbed_start():
    rng = np.random.default_rng(2)
    A = rng.standard_normal((5, 3))
    Z = np.linalg.qr(rng.standard_normal((3, 3)))[0]  # well-conditioned factors
    P = np.einsum("ir,jr,kr->ijk", A, Z, Z)
    start = Z + 0.1 * rng.standard_normal(Z.shape)
    start /= np.linalg.norm(start, axis=0)
    _, Bf, Cf = cp_als(P, start, n_iter=500)
    Zm = merge_symmetric_factors(Bf, Cf)
    assert np.all(_match_abs(Zm, Z) > 1 - 1e-8)
    assert np.all(_match_abs(start, Z) < 1 - 1e-4)


def test_input_span_and_projection():
    rng = np.random.default_rng(3)
    d, k, m = 7, 3, 4
    V = rng.standard_normal((k, d))
    U = rng.standard_normal((m, k))
    T = np.einsum("ij,ja,jb->iab", U, V, V)
    W, ev = input_span(T, k)
    # Rows of V lie in span(W); eigenvalues beyond k vanish.
    assert np.linalg.norm(V - (V @ W) @ W.T) < 1e-12 * np.linalg.norm(V)
    assert ev[k] < 1e-12 * ev[0]
    P = project(T, W)
    assert P.shape == (m, k, k)
    np.testing.assert_allclose(np.einsum("ipq,ap,bq->iab", P, W, W), T, atol=1e-12)


def _sym(weights, V, order):
    T = 0
    for w, v in zip(weights, V):
        o = v
        for _ in range(order - 1):
            o = np.multiply.outer(o, v)
        T = T + w * o
    return T


@pytest.mark.parametrize("order", [3, 4])
def test_power_iteration_recovers_orthogonal_components(order):
    from relufast.stages.tensor import power_iteration

    rng = np.random.default_rng(order)
    k = 5
    V = np.linalg.qr(rng.standard_normal((k, k)))[0].T
    w = np.array([2.0, -1.5, 1.0, 0.7, -0.4])
    lam, U = power_iteration(_sym(w, V, order), k, np.random.default_rng(0))
    for wj, vj in zip(w, V):
        i = int(np.argmax(np.abs(U @ vj)))
        assert abs(abs(U[i] @ vj) - 1) < 1e-10
        if order == 4:
            assert abs(lam[i] - wj) < 1e-10
        else:  # order 3: sign moved into the vector
            assert abs(lam[i] - abs(wj)) < 1e-10 and np.sign(U[i] @ vj) == np.sign(wj)


def test_fourth_order_jennrich_through_the_third_order_view():
    from relufast.stages.tensor import as_third_order, jennrich

    rng = np.random.default_rng(3)
    k = 4
    V = rng.standard_normal((k, k))
    V /= np.linalg.norm(V, axis=1, keepdims=True)  # not orthogonal: Jennrich needs only independence
    T4 = _sym(rng.uniform(0.5, 2.0, k), V, 4)
    Z, gap = jennrich(as_third_order(T4), np.random.default_rng(1))
    assert gap > 0
    for v in V:
        assert np.max(np.abs(Z.T @ v)) > 1 - 1e-9
    with pytest.raises(ValueError, match="order 3 or 4; got order 2"):
        as_third_order(np.eye(3))
