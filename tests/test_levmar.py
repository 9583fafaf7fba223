"""The Levenberg-Marquardt stage and the atv21 path it opens: fewer outputs than units (m < k)."""

import warnings

import numpy as np
import pytest

import relufast as rf
from relufast.stages.levmar import levenberg_marquardt, lm_rows


def _teacher(d, k, m, seed):
    """Hidden biases, an offset and output weights |U| in [0.5, 2] of random sign."""
    r = np.random.default_rng(seed)
    V = r.standard_normal((k, d))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    U = r.choice([-1.0, 1.0], (m, k)) * r.uniform(0.5, 2.0, (m, k))
    return rf.planted.PlantedNetwork(U=U, V=V, b=0.5 * r.standard_normal(k), c=r.standard_normal(m))


def _tilted(V, angle, rng):
    E = rng.standard_normal(V.shape)
    E -= np.sum(E * V, axis=1, keepdims=True) * V
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    return np.cos(angle) * V + np.sin(angle) * E


@pytest.mark.parametrize("d,k,m", [(12, 6, 1), (10, 8, 2)])
@pytest.mark.parametrize("angle", [0.1, 0.3])
def test_converges_to_the_network_from_an_estimate_off_by_a_few_tenths(d, k, m, angle):
    net = _teacher(d, k, m, 3)
    rng = np.random.default_rng(4)
    X, Y = net.sample(lm_rows(d, k, m), random_state=5)
    out = levenberg_marquardt(X, Y, _tilted(net.V, angle, rng), net.b + angle * rng.standard_normal(k))
    assert out.history[-1] < 1e-14 and out.history[0] > 1e-2
    res = rf.RecoveryResult(U=out.U, V=out.V, b=out.b, c=out.c, status="exact", message="", method="lm")
    err = rf.metrics.parameter_error(res, net)
    assert max(err.U, err.V) < 1e-10


def test_a_start_outside_the_basin_is_reported_by_its_residual():
    net = _teacher(8, 4, 1, 0)
    X, Y = net.sample(4000, random_state=1)
    V0 = np.random.default_rng(2).standard_normal((4, 8))
    out = levenberg_marquardt(X, Y, V0 / np.linalg.norm(V0, axis=1, keepdims=True), np.zeros(4), max_steps=5)
    assert out.steps <= 5 and len(out.history) >= 1 and np.all(np.diff(out.history) <= 0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_atv21_exact_with_one_output_and_more_units(seed):
    # m = 1 < k, biases and an offset: the affine lift does not apply (it needs m >= k), so
    # the Levenberg-Marquardt stage takes the paper's estimate, then the certificate.
    net = _teacher(12, 8, 1, seed)
    X, Y = net.sample(400_000, random_state=seed + 50)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rf.RelufastWarning)
        res = rf.recover(X, Y[:, 0], n_hidden=8, method="atv21", random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and max(err.U, err.V) < 1e-8, res.message
