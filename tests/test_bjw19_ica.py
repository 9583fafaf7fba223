"""BJW19 Algorithm 3 (Thm 4): orthonormal V via ICA (test oracle 6 of docs/bjw19.md)."""

import warnings

import numpy as np
import pytest

import relufast as rf
from relufast.algorithms.bjw19 import fastica

from .conftest import EXACT_TOL


@pytest.mark.parametrize("m,k,d,n", [(6, 3, 5, 20000), (10, 5, 8, 50000)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ica_path_exact(m, k, d, n, seed):
    net = rf.planted.two_layer(d=d, k=k, m=m, random_state=seed, orthonormal_V=True)
    np.testing.assert_allclose(net.V @ net.V.T, np.eye(k), atol=1e-12)
    X, Y = net.sample(n, random_state=seed + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rf.RelufastWarning)
        res = rf.recover(X, Y, n_hidden=k, method="bjw19-ica", random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.U < EXACT_TOL and err.V < EXACT_TOL


@pytest.mark.parametrize("seed", range(10))
def test_fastica_recovers_rectified_sources_with_positive_skew(seed):
    rng = np.random.default_rng(seed)
    n, k = 20000, 3 + seed % 3
    F = np.maximum(rng.standard_normal((n, k)), 0)  # rectified Gaussian sources
    Z = F @ rng.standard_normal((k, k))
    unmix, iters, converged = fastica(Z, rng)
    S = Z @ unmix
    Sc = S - S.mean(axis=0)
    S *= np.sign(np.mean(Sc**3, axis=0))  # the skewness sign rule of the pipeline
    C = np.corrcoef(S.T, F.T)[:k, k:]
    assert converged
    assert np.all(C.max(axis=1) >= 0.999)  # spec: correlations >= 0.999


def test_ica_reports_failure_for_non_orthonormal_V():
    net = rf.planted.two_layer(d=5, k=3, m=6, random_state=4, condition=20.0)
    X, Y = net.sample(20000, random_state=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        res = rf.recover(X, Y, n_hidden=3, method="bjw19-ica", random_state=0, n_restarts=2)
    if res.exact:  # certified rows are exact whatever ICA did
        assert rf.metrics.parameter_error(res, net).V < EXACT_TOL
    else:
        assert res.status == "failed"


#: Weight error from float32 outputs: their rounding (6e-8) limits it; 1e-6 leaves 20x margin.
F32_WEIGHT_TOL = 1e-6


@pytest.mark.parametrize("as_keyword", [False, True])
def test_float32_outputs_exact_at_float32(as_keyword):
    """Float32 outputs (or precision="float32") are certified at float32, never failed."""
    from relufast.stages.precision import FLOOR_FACTOR, UNIT_ROUNDOFF

    d, k, m = 8, 5, 10
    net = rf.planted.two_layer(d=d, k=k, m=m, random_state=1, orthonormal_V=True)
    X, Y = net.sample(50000, random_state=2)
    Y32 = Y.astype(np.float32)
    kw = {"precision": "float32"} if as_keyword else {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", rf.RelufastWarning)
        res = rf.recover(
            X, Y32.astype(np.float64) if as_keyword else Y32, n_hidden=k, method="bjw19-ica", random_state=0, **kw
        )
    assert res.status == "exact" and res.exact and res.precision == "float32", res.message
    assert res.residual <= FLOOR_FACTOR * UNIT_ROUNDOFF["float32"] * np.sqrt(d + k)
    assert "float32 precision" in res.message
    err = rf.metrics.parameter_error(res, net)
    assert err.V < F32_WEIGHT_TOL and err.U < F32_WEIGHT_TOL


def test_float64_outputs_keep_float64_thresholds():
    net = rf.planted.two_layer(d=5, k=3, m=6, random_state=0, orthonormal_V=True)
    X, Y = net.sample(20000, random_state=1)
    res = rf.recover(X, Y, n_hidden=3, method="bjw19-ica", random_state=0)
    assert res.exact and res.precision == "float64" and res.residual <= EXACT_TOL
