"""Networks at size: bjw19-gaussian's random-start draws with completion rounds, and atv21's
route for m >= k on the affine lift (no third or fourth Hermite moment)."""

import warnings

import numpy as np
import pytest

import relufast as rf
from relufast.algorithms.atv21 import at_size
from relufast.stages.candidates import OVERCOMPLETE_MIN_K
from relufast.stages.tensor import cp_als

#: Exact recovery: weights to rounding after matching (the solve reads d + d/4 + 20 rows, and
#: 2d + 20 where that does not certify).
EXACT_TOL = 1e-12


def _quiet(*args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        return rf.recover(*args, **kw)


def test_gaussian_at_size_draws_from_a_random_start_and_is_exact():
    net = rf.planted.two_layer(d=60, k=24, m=24, random_state=3)
    X, Y = net.sample(60_000, random_state=4)
    res = _quiet(X, Y, n_hidden=24, method="bjw19-gaussian", random_state=0)
    assert res.status == "exact", res.message
    err = rf.metrics.parameter_error(res, net)
    assert max(err.U, err.V) < EXACT_TOL
    assert 24 >= OVERCOMPLETE_MIN_K and np.isnan(res.diagnostics["jennrich_gaps"]).all()
    # Candidates near certified rows are not refined again: far fewer than a pass of the
    # whole pool per draw.
    assert res.counts["candidates"] < 3 * 24


def test_atv21_at_size_is_exact_on_the_affine_lift():
    net = rf.planted.two_layer(d=40, k=20, m=24, random_state=5, bias="random", offset="random")
    X, Y = net.sample(100_000, random_state=6)
    assert at_size.applies(40, 20, 24, True, None)
    res = _quiet(X, Y, n_hidden=20, method="atv21", random_state=0)
    assert res.status == "exact", res.message
    assert res.diagnostics["directions_from"] == "at-size"
    assert "affine lift" in res.message
    err = rf.metrics.parameter_error(res, net)
    assert max(err.U, err.V, err.b, err.c) < EXACT_TOL
    # Only an estimation sample is read by the moments; every sample by the certificate.
    assert res.counts["n_estimate"] < res.counts["n_certify"] == 100_000


def test_atv21_at_size_applies_only_at_size():
    assert not at_size.applies(40, 20, 19, True, None)  # m < k
    assert not at_size.applies(40, 20, 20, False, None)  # no refinement asked for
    assert not at_size.applies(20, 10, 10, True, None)  # small: ATV21's own pipeline
    assert not at_size.applies(40, 20, 20, True, "all")


def test_atv21_falls_back_when_the_lift_does_not_apply():
    # Two outputs that are copies: [Y, 1] has rank <= k on every sample, so the lift cannot
    # hold each unit's vector; ATV21's pipeline takes over and still certifies (or says why).
    net = rf.planted.two_layer(d=40, k=20, m=20, random_state=7, bias="random", offset="random")
    X, Y = net.sample(20_000, random_state=8)
    Y = np.column_stack([Y[:, :19], Y[:, 0]])
    res = _quiet(X, Y, n_hidden=20, method="atv21", random_state=0, n_restarts=1, time_limit=60)
    assert res.diagnostics.get("directions_from") != "at-size"
    assert res.diagnostics["at_size"].startswith("no certified network")
    assert res.status != "exact" or rf.metrics.parameter_error(res, net).V < EXACT_TOL


def test_cp_als_with_fixed_components_finds_the_missing_ones():
    rng = np.random.default_rng(0)
    k = 12
    Z = rng.standard_normal((k, k))
    Z /= np.linalg.norm(Z, axis=0)
    A = rng.standard_normal((k, k))
    P = np.einsum("ir,pr,qr->ipq", A, Z, Z)
    fixed = Z[:, :8]
    _, B, C = cp_als(P, rng.standard_normal((k, 4)), fixed=fixed, n_iter=500)
    found = np.abs((B / np.linalg.norm(B, axis=0)).T @ Z[:, 8:]).max(axis=1)
    assert np.all(found > 1 - 1e-8)


def test_cp_als_stops_once_the_units_settle_while_noise_components_still_move(monkeypatch):
    # A noisy rank-k tensor (orthogonal factors, as after whitening) and k + 4 free
    # components from a random start: waiting for every column to settle takes 49 sweeps;
    # counting k columns stops at 39, with every unit still within the exact refinement's
    # basin (0.3 rad), as at the end of the long run.
    from relufast.stages import tensor

    rng = np.random.default_rng(8)
    k, extra = 20, 4
    Z = np.linalg.qr(rng.standard_normal((k, k)))[0]
    P = np.einsum("ir,pr,qr->ipq", 1 + rng.random((2 * k, k)), Z, Z) + 1e-4 * rng.standard_normal((2 * k, k, k))
    start = rng.standard_normal((k, k + extra))
    start /= np.linalg.norm(start, axis=0)
    sweeps = []
    real = tensor._slices
    monkeypatch.setattr(tensor, "_slices", lambda *a, **kw: sweeps.append(1) or real(*a, **kw))
    runs = []
    for settle in (None, k):
        sweeps.clear()
        _, B, C = cp_als(P, start, factor_tol=1e-4, settle=settle)
        runs.append((len(sweeps), np.abs(tensor.merge_symmetric_factors(B, C).T @ Z).max(axis=0)))
    (n_all, f_all), (n_k, f_k) = runs
    assert n_k < 0.9 * n_all
    assert np.all(f_k > np.cos(0.3)) and np.all(f_all > np.cos(0.3))


@pytest.mark.parametrize("scale", [1e-150, 1.0, 1e150])
def test_cp_als_is_scale_equivariant(scale):
    rng = np.random.default_rng(1)
    Z = rng.standard_normal((5, 5))
    P = np.einsum("ir,pr,qr->ipq", rng.standard_normal((5, 5)), Z, Z)
    start = Z + 0.05 * rng.standard_normal((5, 5))
    A1, B1, _ = cp_als(P, start)
    A2, B2, _ = cp_als(P * scale, start)
    np.testing.assert_allclose(B2, B1, atol=1e-10)
    np.testing.assert_allclose(A2 / scale, A1, rtol=1e-8, atol=1e-10 * np.abs(A1).max())


def test_span_check_at_large_d_uses_the_condition_estimate_and_still_finds_rank_loss():
    from relufast.units import SPAN_GRAM_MIN, _spans

    rng = np.random.default_rng(2)
    d = SPAN_GRAM_MIN + 22
    X = rng.standard_normal((4 * d, d))
    active = rng.random(4 * d) < 0.5
    assert _spans(X, active, d)
    X[:, -1] = X[:, 0]  # rank d - 1: the estimate cannot pass it; the SVD says so
    assert not _spans(X, active, d)
    X[:, -1] += 1e-8 * rng.standard_normal(4 * d)  # full rank at the 1e-10 tolerance
    assert _spans(X, active, d)


def test_whitening_screen_at_large_n_and_d():
    # Random rows decide first when n d^2 is large; a covariance off the identity still
    # gets the full pass and its whitener.
    from relufast._units import WHITEN_SCREEN_MIN_D, WHITEN_SCREEN_ROWS, whiten_inputs

    rng = np.random.default_rng(3)
    X = rng.standard_normal((4 * WHITEN_SCREEN_ROWS + 1000, WHITEN_SCREEN_MIN_D))
    assert whiten_inputs(X, {}) is None
    Xw, (mu, W) = whiten_inputs(1.5 * X + 0.2, {})
    np.testing.assert_allclose(Xw.mean(axis=0), 0, atol=1e-10)
    np.testing.assert_allclose(np.cov(Xw.T, bias=True), np.eye(WHITEN_SCREEN_MIN_D), atol=1e-8)


def test_lift_margins_cover_a_unit_active_on_97_percent_of_samples():
    # Each candidate enters the lift as (v, 0): the margin must pass the unit's bias. This
    # teacher has a unit with b = 1.87 ||v||, beyond the default schedule (up to 1.6).
    from relufast.stages.refine import DEFAULT_MARGINS, output_basis, refine_rows

    net = rf.planted.two_layer(d=60, k=30, m=30, random_state=11, bias="random", offset="random")
    nv = np.linalg.norm(net.V, axis=1)
    j = int(np.argmax(net.b / nv))
    assert net.b[j] / nv[j] > 1.8
    ell = at_size._refinement_rows(60, 30)
    X, Y = net.sample(ell, random_state=21)
    B = output_basis(np.column_stack([Y, np.ones(ell)]), 31)[0]
    X1 = np.column_stack([X, np.ones(ell)])
    cand = np.append(net.V[j] / nv[j], 0.0)[None, :]
    assert not refine_rows(B, X1, cand, margins=DEFAULT_MARGINS)["certified"][0]
    out = refine_rows(B, X1, cand, margins=at_size.LIFT_MARGINS)
    assert out["certified"][0] and out["margin"][0] > max(DEFAULT_MARGINS)
    row = out["rows"][0] * np.sign(out["rows"][0][:60] @ net.V[j])
    np.testing.assert_allclose(row / np.linalg.norm(row[:60]), np.append(net.V[j], net.b[j]) / nv[j], atol=1e-10)
