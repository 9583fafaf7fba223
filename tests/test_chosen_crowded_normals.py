"""Normals of deeper kinks close to a known boundary, at low precision
(:func:`relufast.chosen.hyperplanes._affine_refine` with the known layers given).

A rarely active unit's kinks lie within 0.005-0.04 of other units' boundaries (a trained
float32 784-64-64-10); the affine fits' boxes (offsets 0.008-0.05 from the kink) crossed
them, and the normal stayed at its first estimate. With the known layers, the offsets
and the box points stay clear of their boundaries.
"""

import numpy as np

import relufast as rf
from relufast.chosen.hyperplanes import _affine_refine
from relufast.chosen.oracle import Oracle
from relufast.chosen.walk import downstream_basis


def _kink_beside_a_boundary(hidden, u, gap, rng):
    """A point on unit u's (second-layer) boundary at distance ``gap`` from the nearest
    first-layer boundary along it, and the unit's normal there."""
    (W1, b1), (W2, b2) = hidden
    d = W1.shape[1]

    def onto(x):
        for _ in range(20):  # Newton steps onto z2_u = 0 (exact within a linear region)
            g = (W2[u] * (x @ W1.T + b1 > 0)) @ W1
            x = x - (np.maximum(x @ W1.T + b1, 0) @ W2[u] + b2[u]) * g / (g @ g)
        return x, g / np.linalg.norm(g)

    x, n = onto(rng.standard_normal(d))
    z1 = x @ W1.T + b1
    T = W1 - np.outer(W1 @ n, n)  # first-layer normals within u's boundary
    dist = np.abs(z1) / np.linalg.norm(T, axis=1)
    j = int(np.argmin(dist))
    return onto(x - np.sign(z1[j]) * (dist[j] - gap) * T[j] / np.linalg.norm(T[j]))


def _kink_and_estimate(hidden, spans, u, angle, rng):
    """A kink of second-layer unit u 0.05 from a first-layer boundary, its normal, its
    span's dimension, and a first estimate of the normal ``angle`` off in a random direction."""
    x, n = _kink_beside_a_boundary(hidden, u, 0.05, rng)
    p = rng.standard_normal(len(n))
    p -= (p @ n) * n
    return x, n, int(spans.dims(x[None])[0]), np.cos(angle) * n + np.sin(angle) * p / np.linalg.norm(p)


def _crowded_network(seed):
    """A planted float32 100-32-16-5 behind its known first layer: (d, hidden, oracle, rng,
    layers, spans)."""
    d = 100
    hidden, out = rf.planted.deep_relu(d, [32, 16], 5, random_state=3)
    oracle = Oracle(rf.planted.relu_function(hidden, out, dtype=np.float32), d)
    rng = np.random.default_rng(seed)
    oracle(rng.standard_normal((2, d)))
    layers = hidden[:1]
    return d, hidden, oracle, rng, layers, downstream_basis(layers)


def test_normals_beside_known_boundaries_are_refined():
    d, hidden, oracle, rng, layers, spans = _crowded_network(0)
    errors = {True: [], False: []}
    for trial in range(20):
        x, n = _kink_beside_a_boundary(hidden, trial % 16, 0.004, rng)
        r = int(spans.dims(x[None])[0])
        p = rng.standard_normal(d)
        p -= (p @ n) * n
        first = n + 0.03 * p / np.linalg.norm(p)  # a first estimate 0.03 rad off
        first /= np.linalg.norm(first)
        for given in (False, True):
            n2 = _affine_refine(
                oracle,
                x[None],
                first[None],
                np.random.default_rng(trial),
                lambda X, r=r: spans.basis(X, r),
                layers if given else None,
            )[0]
            errors[given].append(np.arccos(min(1.0, abs(n2 @ n))))
    # Measured: all 20 within 2.1e-4 with the layers; 12 of 20 left at 0.03 without them.
    assert max(errors[True]) < 1e-3, errors[True]
    assert sum(e > 1e-2 for e in errors[False]) >= 5, errors[False]


def test_a_fit_that_holds_against_a_coarse_estimate_is_checked_along_itself(monkeypatch):
    # A first estimate 0.3 rad off (beyond AFFINE_AGREE): the first fit that holds ends the
    # kink's offsets and is checked by boxes along its own normal; the kink is not measured
    # again along the coarse estimate (agree=inf), and the normal comes out refined.
    from relufast.chosen import hyperplanes as H

    d, hidden, oracle, rng, layers, spans = _crowded_network(1)
    calls, affine = [], H._affine_normals
    monkeypatch.setattr(H, "_affine_normals", lambda *a, **k: calls.append(k.get("agree")) or affine(*a, **k))
    errors = []
    for trial in range(8):
        x, n, r, first = _kink_and_estimate(hidden, spans, trial, 0.3, rng)
        calls.clear()
        n2 = H._affine_refine(
            oracle, x[None], first[None], np.random.default_rng(trial), lambda X, r=r: spans.basis(X, r), layers
        )[0]
        errors.append(np.arccos(min(1.0, abs(n2 @ n))))
        if errors[-1] < 1e-3:
            assert np.inf not in calls and H.AFFINE_SELF in calls, calls
    # Measured: 4 of 8 within 6e-5; of the others, two held no fit at any offset, and two held
    # only at the smallest, whose check at the larger offset crossed a boundary.
    assert sum(e < 1e-3 for e in errors) >= 3, errors


def _first_layer_kinks(d, dtype=np.float32, n=4, seed=0):
    """Kinks of a planted d-16-1 network's first-layer unit 0, its normal, and the oracle."""
    hidden, out = rf.planted.deep_relu(d, [16], 1, random_state=seed)
    oracle = Oracle(rf.planted.relu_function(hidden, out, dtype=dtype), d)
    rng = np.random.default_rng(seed)
    oracle(rng.standard_normal((2, d)))
    W, b = hidden[0]
    w = W[0] / np.linalg.norm(W[0])
    X = rng.standard_normal((n, d))
    X -= ((X @ W[0] + b[0]) / (W[0] @ W[0]))[:, None] * W[0]
    return oracle, X, w, rng


def test_affine_pass_spends_no_queries_where_its_boxes_cannot_fit():
    # 64 box points for d + 1 = 101 unknowns interpolate any answers: no normal is ever
    # taken there (0 of 1,608 on a trained float32 784-64-64-10), so none is asked.
    oracle, X, w, rng = _first_layer_kinks(100)
    Q = np.linalg.qr(rng.standard_normal((100, 100)))[0]
    first = np.tile(w, (len(X), 1))
    before = oracle.n_queries
    got = _affine_refine(oracle, X, first, rng, lambda x: np.broadcast_to(Q, (len(x), 100, 100)))
    assert oracle.n_queries == before
    np.testing.assert_array_equal(got, first)
    # Where the boxes have more points than unknowns (d = 20), the pass runs and refines.
    oracle, X, w, rng = _first_layer_kinks(20)
    Q = np.linalg.qr(rng.standard_normal((20, 20)))[0]
    p = rng.standard_normal(20)
    p -= (p @ w) * w
    first = np.tile(w + 0.03 * p / np.linalg.norm(p), (len(X), 1))
    first /= np.linalg.norm(first, axis=1, keepdims=True)
    before = oracle.n_queries
    got = _affine_refine(oracle, X, first, rng, lambda x: np.broadcast_to(Q, (len(x), 20, 20)))
    assert oracle.n_queries > before
    # Measured: 3 of 4 refined from 0.03 rad to within 2e-4 (one box met another boundary).
    assert (np.abs(got @ w) > 1.0 - 1e-6).sum() >= 3


def test_derivatives_back_to_inputs_by_blas_match_the_einsum():
    from relufast.chosen.hyperplanes import _directions, _to_inputs

    rng = np.random.default_rng(1)
    Q = np.linalg.qr(rng.standard_normal((30, 30)))[0]
    for B in (np.broadcast_to(Q, (5, 30, 30)), rng.standard_normal((5, 30, 12))):
        X = rng.standard_normal((5, B.shape[2], 3))
        np.testing.assert_allclose(_to_inputs(B, X), np.einsum("kir,krm->kmi", B, X), atol=1e-13)
        np.testing.assert_array_equal(_directions(B), np.swapaxes(B, 1, 2))


def test_boxes_stay_within_the_offsets_and_a_kink_no_box_fitted_is_tried_at_the_smallest(monkeypatch):
    # A first estimate 1.2 rad off: boxes along it straddle the boundary and no fit holds,
    # so the kink is measured again (agree=inf), at the smallest offset (fits there hold
    # three times as often as at the middle one of the earlier (0.05, 0.02, 0.008), in the
    # second layer of a trained float32 784-128-128-10); no box lies beyond the first offset.
    from relufast.chosen import hyperplanes as H

    d, hidden, oracle, rng, layers, spans = _crowded_network(2)
    calls, affine = [], H._affine_normals
    monkeypatch.setattr(
        H, "_affine_normals", lambda *a, **k: calls.append((k.get("agree"), float(np.max(a[3])))) or affine(*a, **k)
    )
    retried = 0
    for trial in range(6):
        x, n, r, first = _kink_and_estimate(hidden, spans, trial, 1.2, rng)
        calls.clear()
        H._affine_refine(
            oracle, x[None], first[None], np.random.default_rng(trial), lambda X, r=r: spans.basis(X, r), layers
        )
        assert calls and max(off for _, off in calls) <= H.AFFINE_OFFSETS[0]
        again = [off for agree, off in calls if agree == np.inf]
        retried += bool(again)
        assert all(off <= H.AFFINE_OFFSETS[-1] for off in again), calls
    assert retried >= 1


def test_widest_boxes_only_up_to_wide_dims(monkeypatch):
    # Above WIDE_DIMS inputs boundaries are dense and boxes at the first offset seldom hold
    # (18% at 0.05 in the second layer of a trained float32 784-128-128-10): the kinks start
    # at the second offset; up to it (64% held in a planted float32 64-32-32-10) at the first.
    from relufast.chosen import hyperplanes as H

    d, hidden, oracle, rng, layers, spans = _crowded_network(3)
    x, n = _kink_beside_a_boundary(hidden, 0, 0.05, rng)
    r = int(spans.dims(x[None])[0])
    offsets, affine = [], H._affine_normals
    monkeypatch.setattr(H, "_affine_normals", lambda *a, **k: offsets.append(float(np.max(a[3]))) or affine(*a, **k))

    def first_offset():
        offsets.clear()
        H._affine_refine(oracle, x[None], n[None], np.random.default_rng(0), lambda X: spans.basis(X, r), layers)
        return offsets[0]

    assert d <= H.WIDE_DIMS and first_offset() == H.AFFINE_OFFSETS[0]
    monkeypatch.setattr(H, "WIDE_DIMS", d - 1)
    assert first_offset() == H.AFFINE_OFFSETS[1]
