"""The batches of chosen queries: points built in place (the same numbers as the plain
expressions), and finite-difference work shared between threads without changing the
model's calls."""

import numpy as np
import pytest

import relufast as rf
from relufast._blas import thread_budget
from relufast.chosen import hyperplanes as H
from relufast.chosen.deep import downstream_basis
from relufast.chosen.lines import find_kinks, line_points
from relufast.chosen.net import pre_activations
from relufast.chosen.oracle import Oracle


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_line_points_are_the_numbers_of_the_expression(dtype):
    rng = np.random.default_rng(0)
    base, dirs = rng.standard_normal((5, 7)).astype(dtype), rng.standard_normal((5, 7))
    t = np.linspace(-1.3, 2.1, 9)
    assert np.array_equal(line_points(base, t, dirs), base[:, None, :] + t[None, :, None] * dirs[:, None, :])
    T = rng.standard_normal((5, 3))  # a parameter per line
    assert np.array_equal(line_points(base, T, dirs), base[:, None, :] + T[:, :, None] * dirs[:, None, :])
    assert line_points(base, t, dirs).dtype == np.float64


def test_stencil_is_the_numbers_of_the_expression():
    rng = np.random.default_rng(1)
    x, h = rng.standard_normal((4, 6)), rng.uniform(0.1, 1, (4, 1, 1))
    B = np.linalg.qr(rng.standard_normal((4, 6, 3)))[0]
    want = np.concatenate([x[:, None, :], x[:, None, :] + h * np.swapaxes(B, 1, 2)], axis=1)
    assert np.array_equal(H._stencil(x, h, B, np.empty((4, 4, 6))), want)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_normals_on_any_number_of_threads_are_the_same(dtype, monkeypatch):
    # The bases in pieces, the affine fits' sides side by side: the model calls and their
    # batches are the same on one thread and two, and so are the normals, bit for bit.
    d, widths, m = 40, (16, 8), 3
    hidden, out = rf.planted.deep_relu(d, list(widths), m, random_state=2)
    rng = np.random.default_rng(0)
    probe = Oracle(rf.planted.relu_function(hidden, out, dtype), d)
    kinks = find_kinks(probe, 0.5 * rng.standard_normal((6, d)), rng.standard_normal((6, d)), np.linspace(-3, 3, 2048))
    Z, _ = pre_activations(hidden, kinks.x)
    deep = np.abs(Z[0]).min(axis=1) > 1e-3  # kinks of the second layer
    sub = kinks._replace(**{f: getattr(kinks, f)[deep] for f in ("line", "t", "x", "u", "slope_jump")})
    assert len(sub.t) >= H.BASIS_PARTS
    fits, affine = [], H._affine_normals
    monkeypatch.setattr(H, "_affine_normals", lambda *a, **k: fits.append(len(a[1])) or affine(*a, **k))
    runs = []
    for n_jobs in (1, 2):
        oracle = Oracle(rf.planted.relu_function(hidden, out, dtype), d)
        with thread_budget(n_jobs):
            nrm = H.jump_normals(oracle, sub, np.random.default_rng(3), downstream_basis(hidden[:1]))
        runs.append((nrm, oracle.n_calls, oracle.n_queries))
    (a, calls, queries), (b, calls2, queries2) = runs
    assert (calls, queries) == (calls2, queries2)
    assert np.array_equal(a.keep, b.keep) and np.array_equal(a.n, b.n)
    assert len(a.keep) >= 0.8 * len(sub.t)
    assert bool(fits) == (dtype == np.float32)  # the affine fits at low precision only


def test_restricted_rows_side_by_side_and_cached(monkeypatch):
    # Kinks' restricted rows in pieces on the method's threads: the same rows on one thread
    # and two; the cache then answers every kink seen before without an SVD.
    from relufast.chosen import cluster as C

    rng = np.random.default_rng(4)
    K, k = 11, 6
    v = rng.standard_normal(k + 1)  # one null vector for every kink's equations
    E = rng.standard_normal((K, k + 2, k + 1))
    E -= (E @ v)[:, :, None] * v / (v @ v)
    S = np.ones((K, k), dtype=bool)
    rows = []
    for n_jobs in (1, 2):
        with thread_budget(n_jobs):
            rows.append(C._restrictions(E, S, 1e-10))
    assert np.array_equal(rows[0], rows[1], equal_nan=True)
    assert np.allclose(np.abs(rows[0] @ v) / np.linalg.norm(v), 1.0)
    cache: dict = {}
    with thread_budget(2):
        first = C._restrictions(E, S, 1e-10, cache=cache)
        calls = []
        monkeypatch.setattr(C, "_restriction", lambda *a: calls.append(1) or a[0][0] * np.nan)
        again = C._restrictions(E, S, 1e-10, cache=cache)
    assert len(cache) == K and not calls and np.array_equal(first, again) and np.array_equal(first, rows[0])


def test_partial_row_at_low_precision_takes_its_own_direction_above_the_tolerance():
    # A component's equations: exact null directions for the units it never saw active, and
    # its own row's direction from measured normals, a little above the tolerance. At low
    # precision the row is taken where the next direction stands PARTIAL_GAP times above it
    # (a float32 784-128-128-10's last second-layer unit: 2.06e-4 against 1.67e-4, next
    # 2.4e-2; in another run 3.3e-4, next 1.07e-2).
    from relufast.chosen import cluster as C

    rng = np.random.default_rng(5)
    cols, missing, tol = 8, np.array([4, 5]), 1e-4
    theta = rng.standard_normal(cols)
    theta[missing] = 0.0
    theta /= np.linalg.norm(theta)
    null = np.stack([np.eye(cols)[4], np.eye(cols)[5], theta])
    rest = np.linalg.svd(null, full_matrices=True)[2][3:]  # an orthonormal complement

    def equations(own, nxt):
        s = np.array([1.0, 0.6, 0.4, 0.2, nxt, own])  # (rest's five, then theta's)
        V = np.vstack([rest, theta])
        U = np.linalg.qr(rng.standard_normal((12, 6)))[0]
        return ((U * s) @ V)[None]

    E = equations(2.0 * tol, 0.03)
    assert C._partial_row(E, missing, tol) is None  # strictly: two null directions, not three
    row = C._partial_row(E, missing, tol, ratio=True)
    assert row is not None and abs(abs(row @ theta) - 1.0) < 1e-12
    other_run = equations(3.3e-4 / 1.67e-4 * tol, 1.07e-2 / 1.67e-4 * tol)  # 32 times above
    assert C._partial_row(other_run, missing, tol, ratio=True) is not None
    assert C._partial_row(equations(2.0 * tol, 0.0015), missing, tol, ratio=True) is None  # no gap
    assert C._partial_row(equations(20.0 * tol, 0.9), missing, tol, ratio=True) is None  # beyond LOOSE


def test_null_row_at_low_precision_takes_a_gap_of_row_gap_low():
    # A component of a weak unit whose kinks' normals are 1e-3 off: the row's singular value
    # within the tolerance, the next 68 times the tolerance above it (a float32
    # 784-128-128-10's last second-layer unit). Float64 keeps GAP; without a gap, no row.
    from relufast.chosen import cluster as C

    rng = np.random.default_rng(7)
    cols, tol = 9, 1e-4
    V = np.linalg.qr(rng.standard_normal((cols, cols)))[0].T

    def equations(own, nxt):
        s = np.concatenate([np.linspace(1.0, 0.2, cols - 2), [nxt, own]])
        U = np.linalg.qr(rng.standard_normal((20, cols)))[0]
        return ((U * s) @ V)[None]

    E = equations(0.87 * tol, 68.0 * tol)
    assert C._null_row(E, tol) is None  # float64: GAP times the tolerance
    row = C._null_row(E, tol, ratio=True)
    assert row is not None and abs(abs(row @ V[-1]) - 1.0) < 1e-12
    assert C._null_row(equations(0.87 * tol, 20.0 * tol), tol, ratio=True) is None


def test_bases_in_pieces_are_the_bases_of_one_call():
    rng = np.random.default_rng(6)
    W = rng.standard_normal((5, 9))

    def basis(x):
        return np.linalg.qr(np.broadcast_to(W.T, (len(x), 9, 5)) * (x[:, None, :5] > 0))[0]

    x = rng.standard_normal((7, 9))
    with thread_budget(2):
        assert np.array_equal(H._bases(basis, x), basis(x))
        assert H._bases(basis, x[:0]).shape == (0, 9, 5)
    Q = np.linalg.qr(rng.standard_normal((9, 9)))[0]
    shared = H._bases(lambda x: np.broadcast_to(Q, (len(x), 9, 9)), x)
    assert shared.strides[0] == 0 and np.array_equal(shared[3], Q)  # one basis stays one
