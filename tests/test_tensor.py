import numpy as np

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
