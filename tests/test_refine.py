import numpy as np
import pytest

from relufast.stages.fit import fit_output_layer, relu_stats
from relufast.stages.refine import output_basis, refine_rows, refine_rows_reference

from .conftest import planted


def _instance(seed, m=6, k=4, d=8, ell=400, perturb=0.05):
    """Spec oracle 3: rows perturbed by 0.05 N(0, I), random sign flips, held-out samples."""
    net = planted(d, k, m, seed, max_cos=0.7, max_condition=3.0)
    rng = np.random.default_rng(seed + 100)
    X, Y = net.sample(ell, random_state=rng)
    B, _, _ = output_basis(Y, k)
    signs = rng.choice([-1.0, 1.0], size=k)
    Vhat = signs[:, None] * (net.V + perturb * rng.standard_normal(net.V.shape))
    Vhat /= np.linalg.norm(Vhat, axis=1, keepdims=True)
    return net, X, Y, B, Vhat, signs


@pytest.mark.parametrize("seed", range(5))
def test_refine_recovers_perturbed_rows_exactly(seed):
    net, X, Y, B, Vhat, signs = _instance(seed)
    out = refine_rows(B, X, Vhat)
    assert out["certified"].all()
    np.testing.assert_array_equal(out["sign"], signs.astype(int))
    assert np.max(np.abs(out["rows"] - net.V)) < 1e-12
    # The wrong sign has no null space (spec: ratio >= 1e-3).
    assert np.all(out["other_ratio"] > 1e-3)
    U, _ = fit_output_layer(X, Y, out["rows"])
    assert np.linalg.norm(U - net.U) / np.linalg.norm(net.U) < 1e-12


@pytest.mark.parametrize("seed", range(3))
def test_kernel_agrees_with_reference(seed):
    net, X, Y, B, Vhat, signs = _instance(seed, m=5, k=3, d=6, ell=300)
    # Add candidates that must fail: random directions.
    rng = np.random.default_rng(seed)
    cand = np.vstack([Vhat, rng.standard_normal((3, 6))])
    out = refine_rows(B, X, cand)
    rows, cert, sign = refine_rows_reference(B, X, cand)
    np.testing.assert_array_equal(out["certified"], cert)
    np.testing.assert_array_equal(out["sign"][cert], sign[cert])
    np.testing.assert_allclose(out["rows"][cert], rows[cert], atol=1e-12)
    assert cert[:3].all()
    _assert_certified_rows_are_true_rows(out, net.V)


def _assert_certified_rows_are_true_rows(out, V):
    # A certificate means the row is exact: whatever direction a candidate started from,
    # a certified row must be one of the true rows (with its sign).
    for row in out["rows"][out["certified"]]:
        assert np.min(np.linalg.norm(V - row, axis=1)) < 1e-12


def test_random_directions_certify_only_true_rows():
    net, X, Y, B, _, _ = _instance(7)
    rng = np.random.default_rng(0)
    out = refine_rows(B, X, rng.standard_normal((40, X.shape[1])))
    assert not out["certified"].all()
    _assert_certified_rows_are_true_rows(out, net.V)


def test_result_does_not_depend_on_threads():
    net, X, Y, B, Vhat, _ = _instance(3)
    a = refine_rows(B, X, Vhat, n_jobs=1)
    b = refine_rows(B, X, Vhat, n_jobs=2)
    np.testing.assert_array_equal(a["rows"], b["rows"])


def test_relu_stats_matches_numpy():
    net, X, Y, B, Vhat, _ = _instance(1)
    st = relu_stats(X, Y, net.V, net.U * 1.5, n_jobs=2, block_size=37)
    F = np.maximum(X @ net.V.T, 0)
    np.testing.assert_allclose(st["gram"], F.T @ F, rtol=1e-12)
    np.testing.assert_allclose(st["cross"], F.T @ Y, rtol=1e-12)
    np.testing.assert_allclose(st["sq_residual"], np.sum((Y - F @ (1.5 * net.U).T) ** 2), rtol=1e-12)
    np.testing.assert_allclose(st["sq_norm"], np.sum(Y**2), rtol=1e-12)


def test_refine_rejects_bad_shapes():
    B = np.eye(2, 10)
    with pytest.raises(ValueError, match="B has 10 columns but X has 9 rows"):
        refine_rows(B, np.zeros((9, 3)), np.ones((1, 3)))
    with pytest.raises(ValueError, match="expected d = 3"):
        refine_rows(B, np.zeros((10, 3)), np.ones((1, 4)))


def test_refinement_tolerates_angle_errors_of_03_rad():
    # The README says the margin form tolerates ~0.3 rad: rotate every row
    # by exactly 0.3 rad; measured 39 of 40 rows certified over 10 instances.
    certified = total = 0
    for seed in range(10):
        net = planted(8, 4, 6, seed, max_cos=0.7, max_condition=3.0)
        X, Y = net.sample(1000, random_state=seed + 1)
        B, _, _ = output_basis(Y, 4)
        rng = np.random.default_rng(seed + 1000)  # not the planted network's stream
        rows = []
        for v in net.V:
            u = rng.standard_normal(8)
            u -= (u @ v) * v
            u /= np.linalg.norm(u)
            rows.append(np.cos(0.3) * v + np.sin(0.3) * u)
        out = refine_rows(B, X, np.array(rows))
        certified += int(out["certified"].sum())
        total += 4
        _assert_certified_rows_are_true_rows(out, net.V)
    assert certified >= 0.9 * total
