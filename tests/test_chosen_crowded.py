"""Kinks two grid cells apart (chosen queries): the grid loses both, and the first layer's
lines search such stretches again (:func:`relufast.chosen.first_layer.random_lines`)."""

import numpy as np

import relufast as rf
from relufast.chosen.first_layer import random_lines
from relufast.chosen.lines import find_kinks
from relufast.chosen.oracle import Oracle


def _two_close_kinks(t1, t2):
    """A one-hidden-layer model whose two units switch at t1 and t2 on the line x = t e_0."""
    W = np.array([[1.0, 0.3, 0.0], [1.0, -0.2, 0.5]])
    b = -np.array([t1, t2])
    U = np.array([[1.0, -2.0]])

    def f(X):
        return np.maximum(X @ W.T + b, 0) @ U.T

    return f


def test_stretch_reported_where_two_kinks_share_cells():
    grid = np.linspace(-3.0, 3.0, 4096)
    step = grid[1] - grid[0]
    t1, t2 = 0.1003, 0.1003 + 1.3 * step
    crowded: list = []
    kinks = find_kinks(Oracle(_two_close_kinks(t1, t2), 3), np.zeros((1, 3)), np.eye(3)[:1], grid, crowded)
    assert len(kinks.t) == 0  # neither is isolated on the grid
    assert len(crowded) == 1
    line, a, b = crowded[0]
    assert line == 0 and a < t1 < t2 < b and b - a < 8 * step
    # The same stretch on a finer grid holds both.
    fine = find_kinks(
        Oracle(_two_close_kinks(t1, t2), 3), np.array([[a, 0, 0]]), np.array([[b - a, 0, 0]]), np.linspace(0, 1, 48)
    )
    assert np.allclose(np.sort(a + fine.t * (b - a)), [t1, t2], atol=1e-9)


def test_first_layer_lines_find_kinks_the_capped_grid_loses():
    """200 units (the grid capped at 4,096 points, 20 a unit): the stretches searched again add
    first-layer kinks of units the grid lost, as exactly located as the grid's (a few kinks
    of either are off every hyperplane: two kinks in a cell that pass its checks; the
    normals and the hyperplane test drop them)."""
    d = 10
    hidden, out = rf.planted.deep_relu(d, (200,), 1, random_state=4)
    ((W, b),) = hidden
    oracle = Oracle(rf.planted.relu_function(hidden, out), d)
    parts = random_lines(oracle, 3, (200,), np.random.default_rng(0))
    assert len(parts) == 2
    dist = [np.min(np.abs(p.x @ W.T + b) / np.linalg.norm(W, axis=1), axis=1) for p in parts]
    assert all(np.mean(dd < 1e-8) >= 0.95 for dd in dist)
    units = [set(np.argmin(np.abs(p.x @ W.T + b), axis=1)[dd < 1e-8]) for p, dd in zip(parts, dist)]
    assert len(units[1] - units[0]) >= 5
