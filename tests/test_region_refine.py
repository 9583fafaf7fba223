"""Activation-region refinement (relufast's exact step for biased networks): the C++ region
pass against its NumPy reference, exact recovery from perturbed estimates, rank check."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relufast._native import core
from relufast.stages.refine import region_refine, region_systems_reference

#: Exact recovery: machine precision times the conditioning of the region systems.
EXACT_TOL = 1e-10
#: C++ and NumPy sums of the same products in different orders.
SUM_TOL = 1e-11


def network(d, k, m, seed, b=None, c=None):
    r = np.random.default_rng(seed)
    V = r.standard_normal((k, d))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    U = r.choice([-1.0, 1.0], size=(m, k)) * r.uniform(0.5, 1.5, (m, k))
    b = r.uniform(-1, 1, k) if b is None else np.asarray(b, float)
    c = r.standard_normal(m) if c is None else np.asarray(c, float)
    return U, V, b, c


def outputs(X, U, V, b, c):
    return np.maximum(X @ V.T + b, 0.0) @ U.T + c


def perturb(V, b, theta, rng):
    """Rotate each row by theta radians in a random direction and shift b by ~theta."""
    E = rng.standard_normal(V.shape)
    E -= np.sum(E * V, axis=1, keepdims=True) * V
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    return np.cos(theta) * V + np.sin(theta) * E, b + theta * rng.standard_normal(len(b))


def matched_errors(out, V, b):
    perm = np.argmax(out.V @ V.T, axis=1)
    return np.abs(out.V - V[perm]).max(), np.abs(out.b - b[perm]).max()


def test_region_pass_matches_reference():
    rng = np.random.default_rng(0)
    U, V, b, c = network(4, 3, 2, 0)
    X = rng.standard_normal((700, 4))
    Y = outputs(X, U, V, b, c)
    Vp, bp = perturb(V, b, 0.2, rng)
    mask = rng.random(700) > 0.1
    for msk in (None, mask):
        got = core.region_systems(X, Y, Vp, bp, U, c, np.full(3, 0.1), msk, 1000, 2, 64)
        ref = region_systems_reference(X, Y, Vp, bp, U, c, 0.1, msk)
        np.testing.assert_array_equal(got["keys"], ref["keys"])
        for key in (
            "counts",
            "gram",
            "cross",
            "sq_res",
            "fgram",
            "fcross",
            "sq_residual",
            "sq_norm",
            "n_certain",
            "count",
        ):
            np.testing.assert_allclose(got[key], ref[key], rtol=SUM_TOL, atol=SUM_TOL, err_msg=key)


def test_region_residuals_match_reference():
    rng = np.random.default_rng(1)
    U, V, b, c = network(5, 3, 2, 1)
    X = rng.standard_normal((400, 5))
    Y = outputs(X, U, V, b, c)
    dC = rng.standard_normal((3, 6 * 2))
    dc = rng.standard_normal(2)
    got = core.region_residuals(X, Y, V, b, U * 0.9, c, np.full(3, 0.2), dC, dc, 2, 50)
    P = X @ V.T + b
    R = Y - np.maximum(P, 0) @ (0.9 * U).T - c - dc
    Xt = np.column_stack([X, np.ones(400)])
    for i in range(3):
        R -= (P[:, i] > 0)[:, None] * (Xt @ dC[i].reshape(6, 2))
    want = np.where(np.all(np.abs(P) > 0.2, axis=1), np.linalg.norm(R, axis=1), np.nan)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("theta", [0.1, 0.3])
def test_exact_from_a_perturbed_estimate_single_output(theta):
    rng = np.random.default_rng(2)
    U, V, b, c = network(20, 6, 1, 2)
    X = rng.standard_normal((60000, 20))
    Y = outputs(X, U, V, b, c)
    Vp, bp = perturb(V, b, theta, rng)
    out = region_refine(X, Y, Vp, bp)
    ev, eb = matched_errors(out, V, b)
    assert out.residual <= EXACT_TOL and max(ev, eb) <= EXACT_TOL
    assert abs(out.c[0] - c[0]) <= EXACT_TOL and not out.undetermined
    assert out.history[0] > 1e-3 and 1 <= out.rounds <= 8


def test_exact_with_many_outputs_and_given_output_layer():
    rng = np.random.default_rng(3)
    U, V, b, c = network(10, 4, 3, 3)
    X = rng.standard_normal((30000, 10))
    Y = outputs(X, U, V, b, c)
    Vp, bp = perturb(V, b, 0.2, rng)
    out = region_refine(X, Y, 2.0 * Vp, 2.0 * bp, U=0.5 * U, c=c, n_jobs=1)  # any row scale
    ev, eb = matched_errors(out, V, b)
    assert out.residual <= EXACT_TOL and max(ev, eb) <= EXACT_TOL
    np.testing.assert_allclose(out.c, c, atol=EXACT_TOL)
    np.testing.assert_allclose(np.linalg.norm(out.V, axis=1), 1.0, atol=1e-14)


def test_always_active_unit_is_reported_undetermined():
    # b = 9: unit 2 is active on every sample, so it is indistinguishable from an affine
    # map: the region system has rank < k and names it.
    rng = np.random.default_rng(4)
    U, V, b, c = network(6, 3, 1, 4, b=[0.2, -0.3, 9.0])
    X = rng.standard_normal((20000, 6))
    Y = outputs(X, U, V, b, c)
    Vp, bp = perturb(V, b, 0.05, rng)
    out = region_refine(X, Y, Vp, bp)
    assert 2 in out.undetermined


def test_far_estimate_is_not_certified():
    rng = np.random.default_rng(5)
    U, V, b, c = network(8, 4, 1, 5)
    X = rng.standard_normal((20000, 8))
    Y = outputs(X, U, V, b, c)
    Vr = rng.standard_normal((4, 8))
    out = region_refine(X, Y, Vr, np.zeros(4))
    assert out.residual > 1e-3


def test_validation():
    X = np.zeros((50, 3))
    Y = np.zeros(50)
    V = np.eye(3)[:2]
    with pytest.raises(ValueError, match=r"V must have shape \(k, d\) with d = 3"):
        region_refine(X, Y, np.eye(4), np.zeros(4))
    with pytest.raises(ValueError, match=r"b must have shape \(2,\)"):
        region_refine(X, Y, V, np.zeros(3))
    with pytest.raises(ValueError, match="margin must be a number >= 0"):
        region_refine(X, Y, V, np.zeros(2), margin=-1)
    with pytest.raises(ValueError, match="trim must be None or a number > 1"):
        region_refine(X, Y, V, np.zeros(2), trim=0.5)
    with pytest.raises(ValueError, match="V and b must be finite"):
        region_refine(X, Y, V, np.array([np.nan, 0.0]))
    with pytest.raises(ValueError, match="max_regions"):
        rng = np.random.default_rng(0)
        Xr = rng.standard_normal((2000, 8))
        region_refine(Xr, Xr[:, 0], rng.standard_normal((8, 8)), np.zeros(8), max_regions=4, max_rounds=1)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 60),
    d=st.integers(1, 4),
    k=st.integers(1, 4),
    m=st.integers(1, 3),
    margin=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**31 - 1),
    block=st.integers(1, 17),
)
def test_region_pass_property(n, d, k, m, margin, seed, block):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    Y = rng.standard_normal((n, m))
    V, b = rng.standard_normal((k, d)), rng.standard_normal(k)
    U, c = rng.standard_normal((m, k)), rng.standard_normal(m)
    got = core.region_systems(X, Y, V, b, U, c, np.full(k, margin), None, 10**6, 2, block)
    ref = region_systems_reference(X, Y, V, b, U, c, margin)
    np.testing.assert_array_equal(got["keys"], ref["keys"])
    for key in ("counts", "gram", "cross", "fgram", "fcross", "sq_residual", "n_certain"):
        np.testing.assert_allclose(got[key], ref[key], rtol=SUM_TOL, atol=SUM_TOL, err_msg=key)


def test_too_many_regions_in_refine_if_noiseless_keeps_the_estimate(monkeypatch):
    # More populated regions than the region pass allows: no refinement (None, NaN), the
    # caller keeps its estimate; never an error out of a pipeline.
    from relufast.stages import refine as R

    original = R.region_refine
    monkeypatch.setattr(R, "region_refine", lambda *a, **kw: original(*a, max_regions=3, **kw))
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2000, 6))
    V, U = rng.standard_normal((4, 6)), rng.standard_normal((2, 4))
    Y = np.maximum(X @ V.T, 0.0) @ U.T
    rr, residual = R.refine_if_noiseless(X, Y, U, V, tol=1e-10, bias=False, offset=False)
    assert rr is None and np.isnan(residual)
