"""GKLW19 made exact on noiseless data (activation-region refinement, beyond the paper) and
certified at the outputs' precision (float32)."""

import warnings

import numpy as np
import pytest

import relufast as rf

#: Noiseless float64 data after refinement: machine precision times the conditioning of the
#: fit (measured 3e-16 at d = k = 6).
EXACT_TOL = 1e-12
#: Float32 outputs: weights no worse than the outputs' rounding, eps32 = 6e-8 (measured 7e-10
#: after the float64 polish, which averages the rounding over the samples).
FLOAT32_TOL = 1e-7
#: The paper's estimate on unsymmetrised Gaussian samples is off by ~0.1 (docs/gklw19.md).
APPROX_FLOOR = 1e-4


def _recover(X, Y, k, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", rf.RelufastWarning)
        return rf.recover(X, Y, n_hidden=k, method="gklw19", random_state=0, **kw)


@pytest.fixture(scope="module")
def noiseless():
    """Unsymmetrised Gaussian samples: the paper's estimate is only approximate on them."""
    net = rf.planted.gklw19_network(6, random_state=3)
    X, Y = net.sample(20000, random_state=4)
    return net, X, Y


def test_noiseless_data_end_exact_after_region_refinement(noiseless):
    net, X, Y = noiseless
    plain = _recover(X, Y, 6, refine=False)
    err0 = rf.metrics.parameter_error(plain, net)
    assert plain.status == "approximate" and err0.V > APPROX_FLOOR
    res = _recover(X, Y, 6)
    err = rf.metrics.parameter_error(res, net)
    assert res.status == "exact" and res.exact
    assert err.U < EXACT_TOL and err.V < EXACT_TOL
    assert res.residual < EXACT_TOL  # the certificate over all samples
    assert res.counts["certified_rows"] == 6 and res.counts["region_rounds"] >= 1
    assert np.all(res.b == 0) and np.all(res.c == 0)  # the model has no biases
    assert "activation-region refinement" in res.message and res.precision == "float64"


def test_noisy_data_stay_approximate_and_unchanged():
    net = rf.planted.gklw19_network(6, random_state=5)
    X, Y = net.sample(20000, random_state=6, noise=0.05)
    plain = _recover(X, Y, 6, refine=False)
    res = _recover(X, Y, 6)
    assert res.status == "approximate" and not res.exact
    # The refinement ran, found the data noisy and left the paper's estimate as it was.
    assert res.diagnostics["region_refine_residual"] > 1e-3
    np.testing.assert_array_equal(res.V, plain.V)
    np.testing.assert_array_equal(res.U, plain.U)
    assert res.residual == plain.residual
    assert "not noiseless" in res.message
    # The stated accuracy of the estimate: the residual is the noise level, not more than 2x.
    noise_ratio = 0.05 * np.sqrt(Y.size) / np.linalg.norm(Y)
    assert noise_ratio < res.residual < 2 * noise_ratio


@pytest.mark.parametrize("case", ["biases", "offset", "missing unit", "tiny noise"])
def test_never_exact_on_a_wrong_network(case):
    rng = np.random.default_rng(7)
    net = rf.planted.gklw19_network(6, random_state=8)
    X = rng.standard_normal((20000, 6))
    k = 6
    if case == "biases":  # outside GKLW19's model: a bias-free network cannot reproduce it
        Y = np.maximum(X @ net.V.T + 0.3, 0.0) @ net.U.T
    elif case == "offset":
        Y = net(X) + 0.5
    elif case == "missing unit":  # six units, asked for five (m = 6 >= k = 5)
        Y, k = net(X), 5
    else:
        Y = net(X) + 1e-7 * rng.standard_normal((20000, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        res = rf.recover(X, Y, n_hidden=k, method="gklw19", random_state=0)
    assert not res.exact and res.status != "exact"
    assert res.residual > 1e-9


def test_symmetrised_float32_outputs_are_exact_at_float32():
    net = rf.planted.gklw19_network(6, random_state=1)
    X, Y = net.sample(20000, random_state=2, symmetrize=True)
    res = _recover(X, Y.astype(np.float32), 6)
    err = rf.metrics.parameter_error(res, net)
    assert res.status == "exact" and res.precision == "float32"
    assert err.U < FLOAT32_TOL and err.V < FLOAT32_TOL
    assert "float32" in res.message


def test_unsymmetrised_float32_outputs_are_made_exact_at_float32(noiseless):
    net, X, Y = noiseless
    res = _recover(X, Y.astype(np.float32), 6)
    err = rf.metrics.parameter_error(res, net)
    assert res.status == "exact" and res.precision == "float32"
    assert err.U < FLOAT32_TOL and err.V < FLOAT32_TOL


def test_precision_argument_and_float64_default(noiseless):
    net, X, Y = noiseless
    Y32 = Y.astype(np.float32).astype(np.float64)  # float32 values handed over as float64
    strict = _recover(X, Y32, 6, refine=False)
    assert strict.precision == "float64" and not strict.exact
    res = _recover(X, Y32, 6, precision="float32")
    assert res.exact and res.precision == "float32"
    assert rf.metrics.parameter_error(res, net).V < FLOAT32_TOL


def test_bad_options_say_what_was_expected(noiseless):
    _, X, Y = noiseless
    with pytest.raises(TypeError, match="refine must be True or False; got str"):
        rf.recover(X, Y, n_hidden=6, method="gklw19", refine="yes")
    with pytest.raises(ValueError, match="tol must be a positive number; got -1"):
        rf.recover(X, Y, n_hidden=6, method="gklw19", tol=-1.0)
    with pytest.raises(ValueError, match="precision must be None, one of"):
        rf.recover(X, Y, n_hidden=6, method="gklw19", precision="float8")


def test_dask_inputs_are_refined_on_the_probe_and_certified_on_every_block(noiseless):
    da = pytest.importorskip("dask.array")
    net, X, Y = noiseless
    res = _recover(da.from_array(X, chunks=5000), da.from_array(Y, chunks=5000), 6)
    assert res.exact and res.residual < EXACT_TOL
    assert rf.metrics.parameter_error(res, net).V < EXACT_TOL
