"""The low-precision affine fits' linear algebra (:mod:`relufast.chosen.hyperplanes`): the
boxes' least squares by QR against the pseudo-inverse, and the distances to known
boundaries from a box's centre along its points' directions against one point at a time."""

import numpy as np
import pytest

from relufast.chosen import hyperplanes as H


def test_box_fit_matches_the_pseudo_inverse():
    rng = np.random.default_rng(0)
    K, M, r, m = 6, 130, 64, 10
    C = 0.01 * rng.uniform(-1.0, 1.0, (K, M, r)) * rng.uniform(0.0, 1.0, (K, M, 1))  # points drawn in
    C[1, :, 5] = 0.0  # a box flat in one coordinate: its factor is singular (the pseudo-inverse's route)
    Y = rng.standard_normal((K, M, m))
    coef, A = H._box_fit(C, Y)
    assert A.shape == (K, M, r + 1) and np.all(A[:, :, -1] == 1.0)
    ref = np.linalg.pinv(A) @ Y
    assert np.abs(coef - ref).max() <= 1e-10 * np.abs(ref).max()
    assert np.all(coef[1, 5] == ref[1, 5])  # the minimum-norm solution where the box is flat


def _crossing_reference(layers, X, D):
    """One point and direction at a time: the first s > 0 where a unit switches on X + s D."""
    out = np.full(len(X), np.inf)
    for p, (x, u) in enumerate(zip(X, D)):
        h, dh = x, u
        for W, b in layers:
            z, dz = W @ h + b, W @ dh
            with np.errstate(divide="ignore", invalid="ignore"):
                t = -z / dz
            out[p] = min(out[p], np.min(np.where(t > 0, t, np.inf)))
            h, dh = np.maximum(z, 0.0), dz * (z > 0)
    return out


@pytest.mark.parametrize("shared", [False, True])
def test_crossing_fan_matches_point_by_point(shared):
    """The fan (pre-activations once a centre, the first layer along ``R W^T``) and the
    single-direction form built on it against a point-by-point reference."""
    rng = np.random.default_rng(1)
    K, M, r, d = 5, 40, 12, 30
    layers = [
        (rng.standard_normal((16, d)), rng.standard_normal(16)),
        (rng.standard_normal((8, 16)), rng.standard_normal(8)),
    ]
    X0 = rng.standard_normal((K, d))
    Q = np.linalg.qr(rng.standard_normal((K, d, r)))[0]
    R = np.broadcast_to(Q[0].T, (K, r, d)) if shared else np.swapaxes(Q, 1, 2)
    C = rng.uniform(-1.0, 1.0, (K, M, r))
    got = H._crossing_fan(layers, X0, C, R)
    want = _crossing_reference(layers, np.repeat(X0, M, axis=0), (C @ R).reshape(K * M, d)).reshape(K, M)
    assert got.shape == (K, M) and np.isfinite(want).any()
    assert np.array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-10)
    one = H._crossing(layers, X0, (C @ R)[:, 0])
    np.testing.assert_allclose(one[np.isfinite(one)], want[:, 0][np.isfinite(one)], rtol=1e-10)
    assert np.array_equal(np.isinf(one), np.isinf(want[:, 0]))


def test_far_verification_sees_a_unit_beside_a_close_boundary(monkeypatch):
    """A first-layer unit whose boundary runs 0.012 from another's (1.5 cells of the float32
    window): the far verification's fine window first finds its kink isolated (the trained
    float32 784-64-64-10 had such neighbours at a quarter of its boundary points, and true
    rows failed the test); with windows of one unit only it is not."""
    from relufast.chosen import first_layer as FL
    from relufast.chosen.oracle import Oracle
    from relufast.planted import relu_function

    rng = np.random.default_rng(0)
    d, k = 20, 6
    W = rng.standard_normal((k, d))
    b = 0.1 * rng.standard_normal(k)
    W[1], b[1] = W[0], b[0] - 0.012 * np.linalg.norm(W[0])  # parallel, 0.012 away
    f = relu_function([(W, b)], (rng.standard_normal((3, k)), np.zeros(3)), np.float32)
    oracle = Oracle(f, d, None, "float32")
    oracle(np.zeros((1, d)))
    u, c = W[0] / np.linalg.norm(W[0]), b[0] / np.linalg.norm(W[0])
    x = 0.5 * rng.standard_normal((8, d))
    x -= np.outer(x @ u + c, u)
    args = (np.repeat(u[None], 8, axis=0), np.repeat(c, 8), x)
    fine = FL._verify_far(oracle, *args, np.random.default_rng(1))
    monkeypatch.setattr(FL, "VERIFY_FINE", 1.0)
    coarse = FL._verify_far(oracle, *args, np.random.default_rng(1))
    assert fine.mean() >= FL.VERIFY_HITS and coarse.mean() < 1.0, (fine, coarse)
