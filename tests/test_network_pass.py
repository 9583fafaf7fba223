"""The one C++ network pass behind ``core.certify`` and ``core.relu_stats``: both
Python-facing kernels agree with NumPy references and with each other, with and without
biases and the intercept column."""

import numpy as np
import pytest

from relufast._native import core
from relufast.stages.fit import certify, relu_stats
from relufast.stages.reduce import Samples

#: Relative error of blocked, threaded sums against NumPy's (a few ulps per block sum).
SUM_RTOL = 1e-12


def _reference(X, Y, V, U, power, b, intercept):
    F = np.maximum(X @ V.T + (0.0 if b is None else b), 0.0) ** power
    if intercept:
        F = np.column_stack([F, np.ones(len(F))])
    out = {"gram": F.T @ F, "cross": F.T @ Y, "count": float(len(X))}
    if U is not None:
        out["sq_residual"] = float(np.sum((Y - F @ U.T) ** 2))
        out["sq_norm"] = float(np.sum(Y * Y))
    return out


def _data(seed, n=1503, d=6, m=4, k=3):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((n, d)),
        rng.standard_normal((n, m)),
        rng.standard_normal((k, d)),
        rng.standard_normal(k),
    )


@pytest.mark.parametrize("power", [1.0, 2.0])
@pytest.mark.parametrize("biased", [False, True])
@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("with_U", [False, True])
def test_certify_and_relu_stats_match_numpy_and_each_other(power, biased, intercept, with_U):
    X, Y, V, b = _data(0)
    bb = b if biased else None
    kf = V.shape[0] + int(intercept)
    U = np.random.default_rng(1).standard_normal((Y.shape[1], kf)) if with_U else None
    ref = _reference(X, Y, V, U, power, bb, intercept)
    cert = core.certify(X, Y, V, U, 2, 128, power, True, bb, intercept)
    stats = core.relu_stats(X, Y, V, U, 2, 128, power, bb, intercept)
    for key, want in ref.items():
        np.testing.assert_allclose(cert[key], want, rtol=SUM_RTOL, atol=1e-9)
        assert np.array_equal(np.asarray(cert[key]), np.asarray(stats[key]))  # one kernel: identical
    assert cert["nonfinite"] == 0 and "nonfinite" not in stats


def test_residual_only_pass_skips_the_normal_equations():
    X, Y, V, b = _data(2)
    U = np.random.default_rng(3).standard_normal((Y.shape[1], V.shape[0] + 1))
    st = core.certify(X, Y, V, U, 2, 100, 1.0, False, b, True)
    ref = _reference(X, Y, V, U, 1.0, b, True)
    np.testing.assert_allclose(st["sq_residual"], ref["sq_residual"], rtol=SUM_RTOL)
    assert not np.any(st["gram"]) and not np.any(st["cross"])


def test_biased_certificate_counts_nonfinite_entries():
    X, Y, V, b = _data(4)
    X[3, 1], Y[10, 2] = np.nan, np.inf
    assert core.certify(X, Y, V, None, 2, 64, 1.0, True, b, True)["nonfinite"] == 2
    with pytest.raises(ValueError, match="found 2 NaN or infinite entries"):
        certify(Samples(X, Y, n_jobs=2), V, b=b, c=np.zeros(Y.shape[1]))


def test_stage_certify_with_offset_matches_relu_stats():
    X, Y, V, b = _data(5)
    U = np.random.default_rng(6).standard_normal((Y.shape[1], V.shape[0]))
    c = np.random.default_rng(7).standard_normal(Y.shape[1])
    st = certify(Samples(X, Y, n_jobs=2), V, U, b=b, c=c)
    ref = relu_stats(X, Y, V, np.column_stack([U, c]), n_jobs=1, b=b, intercept=True)
    np.testing.assert_allclose(st["sq_residual"], ref["sq_residual"], rtol=SUM_RTOL)
    np.testing.assert_allclose(st["sq_norm"], ref["sq_norm"], rtol=SUM_RTOL)


def test_shape_errors_name_the_kernel():
    X, Y, V, b = _data(8, n=20)
    with pytest.raises(ValueError, match="relu_stats: b must have k entries"):
        core.relu_stats(X, Y, V, None, 1, 8, 1.0, np.ones(5), False)
    with pytest.raises(ValueError, match=r"certify: U must have shape \(m, k\) = \(4, 4\), the last column being c"):
        core.certify(X, Y, V, np.ones((4, 3)), 1, 8, 1.0, True, b, True)
    with pytest.raises(ValueError, match="certify: X has 20 rows and Y 19"):
        core.certify(X, Y[:19], V, None, 1, 8, 1.0)
