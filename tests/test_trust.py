"""Trustworthy results under real use: one test per fault class.

False certificates (clean data in the sparse-noise pipeline, residual overflow, exact but
non-unique fits, NaN parameters), units, numerical breakdowns, ``auto`` on any valid data,
and messages that name the cause.
"""

import time
import warnings

import numpy as np
import pytest

import relufast as rf
from relufast.activations import RELU
from relufast.stages.fit import local_rank_deficiency, relative_residual, scaled_norm

from .conftest import EXACT_TOL, planted

#: Relative error of predictions of a recovered exact network, in the caller's units.
PREDICT_TOL = 1e-9
#: A fit with one grossly wrong sample has a relative residual of order one.
GROSS_RESIDUAL = 0.1


def _quiet(fn, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        return fn(*a, **kw)


# ----------------------------------------------------------------- false certificates
def test_sparse_noise_on_clean_outputs_is_exact_and_right():
    # The instance: PCP flags 13% of real entries on these clean outputs.
    net = planted(10, 3, 20, 0, orthonormal_U=True)
    X, Y = net.sample(4000, random_state=1)
    res = rf.recover(X, Y, n_hidden=3, method="bjw19-sparse-noise", random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and res.status == "exact"
    assert err.U < EXACT_TOL and err.V < EXACT_TOL
    assert not res.diagnostics["corrupted"].any()


def test_sparse_noise_certifies_only_a_determined_network():
    # Two corrupted entries: PCP alone flags thousands; the L1 refit and the flags of the
    # polished network find exactly the two, and the rest determines the network.
    net = planted(10, 3, 20, 0, orthonormal_U=True)
    X, Y = net.sample(4000, random_state=1)
    Y = Y.copy()
    Y[5, 3] += 10.0
    Y[100, 7] -= 5.0
    res = rf.recover(X, Y, n_hidden=3, method="bjw19-sparse-noise", random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.U < EXACT_TOL and err.V < EXACT_TOL
    assert set(zip(*np.nonzero(res.diagnostics["corrupted"]))) == {(5, 3), (100, 7)}
    assert res.diagnostics["flat_directions"] == 0


def test_masked_fit_that_hides_a_unit_is_not_determined():
    # The certificate's check: hide every sample where unit 0 fires and the masked fit
    # cannot see v_0 (a flat direction), while the full mask has none beyond rescalings.
    net = planted(6, 2, 4, 3)
    X, _ = net.sample(600, random_state=4)
    full = np.ones((600, 4))
    assert local_rank_deficiency(X, net.U, net.V, full) == 0
    hide = full * (X @ net.V[0] <= 0)[:, None]
    assert local_rank_deficiency(X, net.U, net.V, hide) > 0


@pytest.mark.parametrize("scale", [1e160, 1e-170])
def test_residual_is_scaled_and_never_overflows(scale):
    net = planted(6, 2, 3, 0)
    X, Y = net.sample(2000, random_state=1)
    U = np.ascontiguousarray(net.U * scale)
    Ys = np.ascontiguousarray(Y * scale)
    assert relative_residual(X, Ys, net.V, U, 1, RELU) < EXACT_TOL
    bad = Ys.copy()
    bad[0] *= 1e3  # one bad sample dominates: never a certificate
    assert relative_residual(X, bad, net.V, U, 1, RELU) > GROSS_RESIDUAL
    assert np.isnan(relative_residual(X, np.zeros_like(Y), net.V, U, 1, RELU))
    assert scaled_norm(np.full(4, 1e300)) == pytest.approx(2e300)
    assert np.isnan(scaled_norm(np.array([1.0, np.nan])))


def test_gaussian_with_huge_outputs_and_one_bad_sample_is_not_exact():
    net = planted(8, 3, 5, 0)
    X, Y = net.sample(3000, random_state=1)
    Y = Y * 1e150
    Y[7] *= 1e10
    res = _quiet(rf.algorithms.bjw19.gaussian, X, Y, 3, random_state=0)  # direct call
    assert not res.exact and res.status != "exact"
    res = _quiet(rf.recover, X, Y, n_hidden=3, method="bjw19-gaussian", random_state=0)
    assert not res.exact and res.residual > GROSS_RESIDUAL


def test_enumeration_with_fewer_samples_than_dimensions_is_non_identifiable():
    net = planted(10, 3, 5, 0)
    X, Y = net.sample(8, random_state=1)
    with pytest.warns(rf.RelufastWarning, match="not unique"):
        res = rf.recover(X, Y, n_hidden=3, method="bjw19-enumeration", random_state=0)
    assert res.status == "non_identifiable" and not res.exact and not res.success
    N = res.diagnostics["input_null_space"]
    assert N.shape == (2, 10)
    assert np.allclose(X @ N.T, 0.0, atol=1e-12)
    assert np.abs(res.V @ N.T).max() < 1e-12  # minimum-norm representative
    assert np.linalg.norm(res.predict(X) - Y) <= 1e-9 * np.linalg.norm(Y)  # still fits


def test_inputs_in_a_subspace_are_non_identifiable():
    # A constant-zero input coordinate (like blank pixels): rows of V are free along it.
    net = planted(8, 3, 5, 2)
    X, _ = net.sample(4000, random_state=3)
    X[:, 5] = 0.0
    Y = net.predict(X)
    res = _quiet(rf.recover, X, Y, n_hidden=3, method="bjw19-enumeration", random_state=0, time_limit=30)
    assert res.status == "non_identifiable" and not res.exact
    N = res.diagnostics["input_null_space"]
    assert N.shape == (1, 8) and abs(abs(N[0, 5]) - 1.0) < 1e-12
    assert np.abs(res.V[:, 5]).max() < 1e-12


def test_gklw19_zero_outputs_and_singular_inputs_are_statuses():
    X = np.random.default_rng(0).standard_normal((2000, 5))
    res = _quiet(rf.recover, X, np.zeros((2000, 3)), n_hidden=3, method="gklw19")
    assert res.status == "non_identifiable" and not res.success and "all zero" in res.message
    assert res.U is None or res.has_finite_parameters
    net = planted(5, 2, 3, 1)
    for make in (lambda A: np.hstack([A, A[:, :1]]), lambda A: np.hstack([A, np.zeros((len(A), 1))])):
        Xb = make(X)
        Y = net.predict(X)
        res = _quiet(rf.recover, Xb, Y, n_hidden=2, method="gklw19")
        assert res.status == "non_identifiable" and "subspace" in res.message
        assert res.diagnostics["input_null_space"].shape == (1, 6)


def test_no_linalg_error_reaches_the_user(monkeypatch):
    from relufast._protocol import recovery_method
    from relufast.methods import _spec

    @recovery_method("broken")
    def broken(X, Y, n_hidden, *, tol=1e-10, random_state=None, n_jobs=None):
        raise np.linalg.LinAlgError("SVD did not converge")

    monkeypatch.setitem(rf.METHODS, "broken", _spec(broken, "test"))
    with pytest.warns(rf.RelufastWarning, match="linear-algebra step broke down"):
        X = np.random.default_rng(0).standard_normal((10, 2))
        res = rf.recover(X, np.arange(10.0)[:, None], n_hidden=1, method="broken")
    assert res.status == "failed" and not res.success


# ----------------------------------------------------------------- units
@pytest.mark.parametrize("method", ["bjw19-gaussian", "bjw19-enumeration"])
@pytest.mark.parametrize("sx, sy", [(1e-9, 1.0), (1e120, 1e120), (1.0, 1e-200)])
def test_units_do_not_matter(method, sx, sy, capfd):
    net = planted(8, 3, 5, 0)
    X, Y = net.sample(3000, random_state=1)
    Xs, Ys = X * sx, Y * sy
    opts = {"time_limit": 30} if method == "bjw19-enumeration" else {}
    res = rf.recover(Xs, Ys, n_hidden=3, method=method, random_state=0, **opts)
    assert res.exact, res.message
    direct = rf.METHODS[method].function(Xs, Ys, 3, random_state=0, **opts)  # the paper's function
    assert direct.exact and scaled_norm(direct.predict(Xs) - Ys) <= PREDICT_TOL * scaled_norm(Ys)
    assert capfd.readouterr().err == ""  # no LAPACK complaints on stderr
    assert rf.metrics.parameter_error(res, net).V < EXACT_TOL
    assert scaled_norm(res.predict(Xs) - Ys) <= PREDICT_TOL * scaled_norm(Ys)


# ----------------------------------------------------------------- auto
def test_auto_on_non_gaussian_inputs_certifies_and_records_attempts():
    # Uniform inputs at n = 16000: enumeration alone would raise (subsets > 2^62); the
    # Gaussian pipeline's certificate holds for any input law.
    net = planted(20, 5, 8, 0)
    X = np.random.default_rng(0).uniform(-1.7, 1.7, (16000, 20))
    Y = net.predict(X)
    res = rf.recover(X, Y, n_hidden=5, random_state=0)
    assert res.exact and rf.metrics.parameter_error(res, net).V < EXACT_TOL
    attempts = res.diagnostics["auto_attempts"]
    assert attempts[0]["method"] == "bjw19-gaussian" and attempts[-1]["status"] == "exact"
    assert "standard Gaussian" not in res.diagnostics["auto"]


def test_auto_is_bounded_on_data_no_network_fits():
    rng = np.random.default_rng(1)
    X = rng.laplace(size=(3000, 6))
    Y = rng.standard_normal((3000, 2)) @ rng.standard_normal((2, 4))  # rank 2, not ReLU
    t = time.perf_counter()
    with pytest.warns(rf.RelufastWarning):
        res = rf.recover(X, Y, n_hidden=2, random_state=0, time_limit=6)
    assert time.perf_counter() - t < 30  # budget 6 s (measured 6.2 s in all)
    assert not res.exact
    tried = [a["method"] for a in res.diagnostics["auto_attempts"]]
    assert "bjw19-gaussian" in tried and "bjw19-enumeration" in tried


def test_auto_does_not_call_shifted_gaussian_standard():
    net = planted(8, 3, 5, 0)
    X, _ = net.sample(5000, random_state=1)
    X = X + 1.0
    res = _quiet(rf.recover, X, net.predict(X), n_hidden=3, random_state=0)
    facts = res.diagnostics["auto_facts"]
    assert not facts["centred"] and not facts["standard_gaussian"]
    notes = [a["note"] for a in res.diagnostics["auto_attempts"]]
    assert "not centred" in notes[0] and not any("standard Gaussian" in t for t in notes)


# ----------------------------------------------------------------- messages
def test_messages_name_the_cause():
    net = planted(10, 3, 6, 0)
    X, Y = net.sample(5000, random_state=1)
    gauss = dict(method="bjw19-gaussian", random_state=0)
    res = _quiet(rf.recover, X, Y, n_hidden=4, **gauss)
    assert "rank 3 < n_hidden = 4" in res.message and "add samples" not in res.message
    res = _quiet(rf.recover, X, Y, n_hidden=4, random_state=0)  # auto: every attempt says why
    assert res.status == "rank_deficient" and "rank(Y) = 3 < n_hidden = 4" in res.message
    res = _quiet(rf.recover, X, Y, n_hidden=2, **gauss)
    assert "try n_hidden = 3" in res.message
    res = _quiet(rf.recover, X.astype(np.float32), Y.astype(np.float32), n_hidden=3, **gauss)
    # float32 outputs are certified at float32 precision and the message says so.
    assert res.precision == "float32" and "float32" in res.message
    for kw in ({"offset": "random"}, {"bias": "random"}):
        netb = planted(10, 3, 6, 0, **kw)
        Xb, Yb = netb.sample(5000, random_state=1)
        res = _quiet(rf.recover, Xb, Yb, n_hidden=3, **gauss)
        assert not res.exact and "atv21" in res.message
    noisy = Y + 1e-9 * np.random.default_rng(0).standard_normal(Y.shape)
    res = _quiet(rf.recover, X, noisy, n_hidden=3, **gauss)
    assert res.status == "approximate" and res.success


def test_misspelled_options_list_the_valid_ones():
    X, Y = np.ones((30, 3)), np.ones((30, 2))
    with pytest.raises(TypeError, match=r"'tool' \(did you mean 'tol'\?\).*n_restarts"):
        rf.recover(X, Y, n_hidden=1, method="bjw19-gaussian", tool=1e-9)
    with pytest.raises(TypeError, match="'n_restart' .*did you mean 'n_restarts'"):
        rf.recover(X, Y, n_hidden=1, n_restart=3)


def test_enumeration_row_seen_by_too_few_samples_is_non_identifiable():
    # X has rank d, but unit 0 fires on 2 < d samples: v_0 is free along the directions
    # those samples do not see, so the exact fit is not unique.
    rng = np.random.default_rng(5)
    X = rng.standard_normal((14, 4))
    while True:
        v0 = rng.standard_normal(4)
        if int(np.sum(X @ v0 > 0)) == 2:
            break
    V = np.array([v0 / np.linalg.norm(v0), [0.5, 0.5, 0.5, 0.5]])
    U = rng.standard_normal((3, 2))
    Y = np.maximum(X @ V.T, 0.0) @ U.T
    res = _quiet(rf.recover, X, Y, n_hidden=2, method="bjw19-enumeration", random_state=0)
    assert res.status == "non_identifiable" and not res.exact
    assert "input_null_space" not in res.diagnostics  # X itself has rank d
    loose = res.diagnostics["undetermined_rows"]
    free = res.diagnostics["undetermined_directions"]
    assert loose and all(free[i].shape[0] == 4 - int(np.sum(X @ res.V[i] > 1e-9)) for i in loose)
    assert scaled_norm(res.predict(X) - Y) <= PREDICT_TOL * scaled_norm(Y)


def test_a_non_finite_residual_is_never_exact():
    run = rf._result.Run("test")
    with pytest.warns(rf.RelufastWarning, match="not a certificate"):
        res = run.result("exact", "fit", U=np.ones((1, 1)), V=np.ones((1, 1)), exact=True, residual=float("nan"))
    assert res.status == "failed" and not res.exact and not res.success
