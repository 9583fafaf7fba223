"""Adaptive estimation and the one certifying pass in bjw19-gaussian."""

import warnings

import numpy as np
import pytest

import relufast as rf
from relufast._native import core
from relufast.algorithms.bjw19.gaussian import start_size
from relufast.stages.fit import certify
from relufast.stages.reduce import Samples, SampleStream

from .conftest import EXACT_TOL, planted

#: Sums of the fused kernel vs NumPy: rounding of sums over a few thousand samples.
SUM_RTOL = 1e-12


def _quiet(X, Y, k, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", rf.RelufastWarning)
        return rf.recover(X, Y, n_hidden=k, method="bjw19-gaussian", **kw)


def test_certify_kernel_matches_numpy(rng):
    X = rng.standard_normal((3001, 7))
    Y = rng.standard_normal((3001, 4))
    V = rng.standard_normal((3, 7))
    U = rng.standard_normal((4, 3))
    st = core.certify(X, Y, V, U, 2, 128, 1.0)
    F = np.maximum(X @ V.T, 0.0)
    np.testing.assert_allclose(st["gram"], F.T @ F, rtol=SUM_RTOL)
    np.testing.assert_allclose(st["cross"], F.T @ Y, rtol=SUM_RTOL)
    np.testing.assert_allclose(st["sq_residual"], np.sum((Y - F @ U.T) ** 2), rtol=SUM_RTOL)
    np.testing.assert_allclose(st["sq_norm"], np.sum(Y * Y), rtol=SUM_RTOL)
    assert st["count"] == 3001 and st["nonfinite"] == 0
    X[5, 2], Y[7, 0], Y[9, 1] = np.nan, np.inf, -np.inf
    assert core.certify(X, Y, V, U, 2, 128, 1.0)["nonfinite"] == 3
    assert core.count_nonfinite(X, 2, 100) == 1


def test_certify_kernel_rejects_bad_shapes(rng):
    X, Y = rng.standard_normal((10, 3)), rng.standard_normal((10, 2))
    with pytest.raises(ValueError, match="V has 4 columns, expected d = 3"):
        core.certify(X, Y, np.ones((2, 4)), None, 1, 8, 1.0)
    with pytest.raises(ValueError, match="U must have shape"):
        core.certify(X, Y, np.ones((2, 3)), np.ones((3, 3)), 1, 8, 1.0)


def test_sample_stream_nested_and_without_repeats():
    s = SampleStream(1000, np.random.default_rng(0))
    a = s.grow(100)
    b = s.grow(300)
    c = s.grow(1000)
    allidx = np.concatenate([a, b, c])
    assert len(a) == 100 and len(b) == 200 and len(c) == 700
    assert np.array_equal(np.sort(allidx), np.arange(1000))
    again = SampleStream(1000, np.random.default_rng(0))
    assert np.array_equal(again.grow(100), a)  # same generator: same draws (every MPI rank)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_adaptive_and_all_give_the_same_exact_network(seed):
    d, k, m, n = 20, 5, 8, 200000
    net = planted(d, k, m, seed, max_cos=0.7, max_condition=3.0, max_output_condition=10.0)
    X, Y = net.sample(n, random_state=seed + 10)
    ada = _quiet(X, Y, k, random_state=seed)
    full = _quiet(X, Y, k, random_state=seed, n_estimate="all")
    for res in (ada, full):
        err = rf.metrics.parameter_error(res, net)
        assert res.exact and err.U < EXACT_TOL and err.V < EXACT_TOL
    err = rf.metrics.parameter_error(ada, rf.network.Network(full.U, full.V))
    assert err.U < EXACT_TOL and err.V < EXACT_TOL
    assert ada.counts["n_estimate"] == start_size(d, k) < n
    assert full.counts["n_estimate"] == n
    assert ada.counts["certify_passes"] == 1 and ada.counts["n_certify"] == n


def test_forced_size_is_used():
    net = planted(10, 3, 5, 4, max_cos=0.7)
    X, Y = net.sample(50000, random_state=5)
    res = _quiet(X, Y, 3, random_state=0, n_estimate=8000)
    assert res.exact and res.counts["n_estimate"] == 8000 and res.counts["doublings"] == 0


@pytest.mark.parametrize("d,k,condition,n_start", [(20, 5, 30.0, 400), (12, 10, 30.0, 800), (10, 9, 10.0, 200)])
def test_hard_instances_end_exact_with_consistent_counts(d, k, condition, n_start):
    # Conditioned V and k close to d from a small first sample: whether the first size
    # certifies depends on the CPU's rounding (BLAS kernels), so only what the result
    # guarantees is asserted: exact, and counts that agree with each other.
    net = planted(d, k, k + 2, 5, condition=condition)
    n = 200000
    X, Y = net.sample(n, random_state=6)
    res = _hard(X, Y, k, n_start)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.U < EXACT_TOL and err.V < EXACT_TOL
    assert res.counts["doublings"] >= 0
    assert res.counts["n_estimate"] == min(n, n_start * 2 ** res.counts["doublings"])


def _hard(X, Y, k, n_start):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        return rf.recover(
            X,
            Y,
            n_hidden=k,
            method="bjw19-gaussian",
            random_state=0,
            n_estimate=n_start,
            n_refine=n_start,
            n_restarts=3,
        )


@pytest.mark.parametrize("misses", [1, 2])
def test_escalation_path_forced_ends_exact(monkeypatch, misses):
    # The doubling path, forced: the first ``misses`` candidate stages certify no row (as
    # a too crude first moment does), so the sample must double that often and still end
    # exact, with the estimation size in the counts.
    import importlib

    g = importlib.import_module("relufast.algorithms.bjw19.gaussian")
    from relufast.stages.pool import RowPool

    real, calls = g._candidates, []

    def crude_first(run, s, *args):
        calls.append(1)
        pool, approx_rows, min_null = real(run, s, *args)
        return (RowPool(s.k), approx_rows, min_null) if len(calls) <= misses else (pool, approx_rows, min_null)

    monkeypatch.setattr(g, "_candidates", crude_first)
    net = planted(20, 5, 7, 5, condition=30.0)
    X, Y = net.sample(200000, random_state=6)
    res = _hard(X, Y, 5, 400)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.U < EXACT_TOL and err.V < EXACT_TOL
    assert res.counts["doublings"] >= misses
    assert res.counts["n_estimate"] == 400 * 2 ** res.counts["doublings"]


def test_certificate_failure_escalates_and_is_never_exact():
    # Rows are certified on the refinement sample, but a few corrupted outputs elsewhere
    # make the fit over all samples fail: more samples are tried, and the status says so.
    net = planted(10, 3, 5, 7, max_cos=0.7)
    X, Y = net.sample(100000, random_state=8)
    Y = Y.copy()
    # Corrupt 3 samples outside the gathered sample (its first 20,000 draws with this seed).
    seen = SampleStream(100000, np.random.default_rng(0)).grow(20000)
    bad = np.setdiff1d(np.arange(100000), seen)[[5, 500, 5000]]
    Y[bad] += 5.0
    with pytest.warns(rf.RelufastWarning, match="not exactly those of one network"):
        res = rf.recover(X, Y, n_hidden=3, method="bjw19-gaussian", random_state=0)
    assert not res.exact and res.status == "approximate"  # an estimate; the data are not exactly realizable
    assert res.counts["escalations"] >= 1 and res.counts["certify_passes"] >= 2


@pytest.mark.parametrize("bad", ["some", -3, 0, 1.5, [10]])
def test_n_estimate_validation(bad):
    net = planted(5, 2, 3, 0)
    X, Y = net.sample(2000, random_state=1)
    with pytest.raises((ValueError, TypeError), match="n_estimate"):
        rf.recover(X, Y, n_hidden=2, method="bjw19-gaussian", n_estimate=bad)


def test_nan_found_by_the_certificate_pass():
    # Adaptive mode defers the finiteness check to the certificate pass: still an error.
    net = planted(6, 2, 3, 0)
    X, Y = net.sample(60000, random_state=1)
    X = X.copy()
    X[-1, 0] = np.nan
    with pytest.raises(ValueError, match="finite values; found 1 NaN"):
        rf.recover(X, Y, n_hidden=2, method="bjw19-gaussian", random_state=0)
    with pytest.raises(ValueError, match="finite values; found 1 NaN"):
        rf.recover(X, Y, n_hidden=2, method="bjw19-gaussian", random_state=0, n_estimate="all")


def test_certify_stage_reduces_like_one_pass(rng):
    X = rng.standard_normal((500, 4))
    Y = rng.standard_normal((500, 3))
    V, U = rng.standard_normal((2, 4)), rng.standard_normal((3, 2))
    one = certify(Samples(X, Y), V, U)
    F = np.maximum(X @ V.T, 0.0)
    np.testing.assert_allclose(one["sq_residual"], np.sum((Y - F @ U.T) ** 2), rtol=SUM_RTOL)


def test_fpt_adaptive_matches_all_and_reads_a_sample():
    net = planted(6, 3, 2, 3, max_cos=0.7)  # m = 2 < k = 3: Alg. 7
    X, Y = net.sample(200000, random_state=4)
    ada = _quiet_fpt(X, Y, 3)
    full = _quiet_fpt(X, Y, 3, n_estimate="all")
    for res in (ada, full):
        err = rf.metrics.parameter_error(res, net)
        assert res.exact and err.U < EXACT_TOL and err.V < EXACT_TOL
    assert ada.counts["n_estimate"] < 200000 == full.counts["n_estimate"]
    assert ada.counts["n_certify"] == 200000


def _quiet_fpt(X, Y, k, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", rf.RelufastWarning)
        return rf.recover(X, Y, n_hidden=k, method="bjw19-fpt", random_state=0, **kw)


@pytest.mark.parametrize("block", [7, 64, 4096])
def test_certify_kernel_does_not_depend_on_threads(rng, block):
    # Fixed-order reductions (cpp/kernels/parallel.hpp): the same bits for any n_jobs.
    X = rng.standard_normal((5003, 6))
    Y = rng.standard_normal((5003, 3))
    V, U = rng.standard_normal((2, 6)), rng.standard_normal((3, 2))
    one = core.certify(X, Y, V, U, 1, block, 1.0)
    two = core.certify(X, Y, V, U, 2, block, 1.0)
    for key in one:
        assert np.array_equal(one[key], two[key]), key


# ATV21 (biases and an offset): the same adaptive scheme, moments on a growing sample.


def _quiet_atv21(X, Y, k, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        return rf.recover(X, Y, n_hidden=k, method="atv21", **kw)


def _biased(d, k, m, seed):
    return rf.planted.two_layer(d, k, m, bias="random", offset="random", random_state=seed)


@pytest.mark.parametrize("seed", [1, 2])
def test_atv21_adaptive_and_all_give_the_same_exact_network(seed):
    from relufast.algorithms.atv21 import start_size as atv21_start

    d, k, m, n = 6, 3, 2, 200000
    net = _biased(d, k, m, seed)
    X, Y = net.sample(n, random_state=seed + 10)
    ada = _quiet_atv21(X, Y, k, random_state=seed)
    full = _quiet_atv21(X, Y, k, random_state=seed, n_estimate="all")
    for res in (ada, full):
        err = rf.metrics.parameter_error(res, net)
        assert res.exact and err.V < EXACT_TOL and err.b < EXACT_TOL and err.c < EXACT_TOL
    # The moments of the adaptive run read a random sample, the certificate every sample.
    assert atv21_start(d, k) <= ada.counts["n_estimate"] < n == full.counts["n_estimate"]
    assert ada.counts["n_estimate"] == atv21_start(d, k) * 2 ** ada.counts["doublings"]
    assert ada.counts["n_certify"] == n and ada.counts["certify_passes"] >= 1
    assert full.counts["doublings"] == 0


def test_atv21_too_small_a_start_escalates_and_ends_exact():
    # 200 samples do not give the order-4 moments within the refinement's basin: the sample
    # doubles (visible in counts) until the estimate is good enough, and ends exact.
    net = _biased(6, 3, 2, 3)
    X, Y = net.sample(400000, random_state=4)
    res = _quiet_atv21(X, Y, 3, random_state=0, n_estimate=200, n_refine=4000)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.V < EXACT_TOL and err.b < EXACT_TOL
    assert res.counts["doublings"] >= 1 and res.counts["restarts"] > 2
    assert res.counts["n_estimate"] == 200 * 2 ** res.counts["doublings"] < 400000


def test_atv21_noisy_outputs_use_every_sample():
    # refine=False (noisy outputs): the statistics need every sample, no adaptive sample.
    net = _biased(5, 2, 1, 0)
    X, Y = net.sample(60000, random_state=1)
    res = _quiet_atv21(X, Y, 2, random_state=0, refine=False)
    assert res.counts["n_estimate"] == 60000 and res.counts["doublings"] == 0


@pytest.mark.parametrize("bad", ["half", -1, 10, 2.5])
def test_atv21_n_estimate_validation(bad):
    net = _biased(5, 2, 1, 0)
    X, Y = net.sample(3000, random_state=1)
    with pytest.raises((ValueError, TypeError), match="n_estimate"):
        rf.recover(X, Y, n_hidden=2, method="atv21", n_estimate=bad)
