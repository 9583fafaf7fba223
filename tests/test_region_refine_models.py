"""Activation-region refinement for the bias-free models (``bias=False, offset=False``) and
the "keep it only when the data prove noiseless" helper used after approximate methods."""

import numpy as np
import pytest

from relufast.stages.refine import refine_if_noiseless, region_refine

from .test_region_refine import matched_errors, network, outputs, perturb

#: Exact recovery: machine precision times the conditioning of the region systems.
EXACT_TOL = 1e-10
#: The noiseless threshold handed to the helper (gklw19's default ``tol``).
NOISELESS_TOL = 1e-9


def _bias_free(d, k, m, seed, n):
    rng = np.random.default_rng(seed)
    U, V, _, _ = network(d, k, m, seed, b=np.zeros(k), c=np.zeros(m))
    X = rng.standard_normal((n, d))
    return rng, X, U, V


def test_bias_free_refinement_is_exact_and_keeps_b_and_c_zero():
    rng, X, U, V = _bias_free(10, 5, 3, 11, 20000)
    Y = outputs(X, U, V, 0.0, 0.0)
    Vp, _ = perturb(V, np.zeros(5), 0.15, rng)
    out = region_refine(X, Y, Vp, None, bias=False, offset=False)
    ev, _ = matched_errors(out, V, np.zeros(5))
    assert out.residual <= EXACT_TOL and ev <= EXACT_TOL and not out.undetermined
    assert np.all(out.b == 0) and np.all(out.c == 0)  # held, not merely small


def test_the_biased_default_is_unchanged_by_the_new_options():
    rng = np.random.default_rng(12)
    U, V, b, c = network(8, 4, 2, 12)
    X = rng.standard_normal((20000, 8))
    Y = outputs(X, U, V, b, c)
    Vp, bp = perturb(V, b, 0.1, rng)
    a = region_refine(X, Y, Vp, bp)
    bb = region_refine(X, Y, Vp, bp, bias=True, offset=True)
    np.testing.assert_array_equal(a.V, bb.V)
    assert a.history == bb.history and a.residual <= EXACT_TOL


def test_bias_free_model_cannot_fake_a_biased_network():
    # Data with hidden biases: held at zero, the refinement cannot reproduce them.
    rng = np.random.default_rng(13)
    U, V, b, c = network(8, 4, 2, 13, c=np.zeros(2))
    X = rng.standard_normal((20000, 8))
    Y = outputs(X, U, V, b, c)
    Vp, _ = perturb(V, b, 0.05, rng)
    kept, residual = refine_if_noiseless(X, Y, U, Vp, tol=NOISELESS_TOL, bias=False, offset=False)
    assert kept is None and residual > 1e-3


def test_refine_if_noiseless_keeps_only_noiseless_fits():
    rng, X, U, V = _bias_free(8, 4, 4, 14, 20000)
    Y = outputs(X, U, V, 0.0, 0.0)
    Vp, _ = perturb(V, np.zeros(4), 0.1, rng)
    kept, residual = refine_if_noiseless(X, Y, U, Vp, tol=NOISELESS_TOL, bias=False, offset=False)
    assert kept is not None and residual == kept.residual <= EXACT_TOL
    noisy = Y + 0.01 * rng.standard_normal(Y.shape)
    kept, residual = refine_if_noiseless(X, noisy, U, Vp, tol=NOISELESS_TOL, bias=False, offset=False)
    assert kept is None and 1e-3 < residual < 0.1


def test_bias_free_options_refuse_nonzero_biases():
    X = np.random.default_rng(0).standard_normal((100, 3))
    Y = X[:, :2]
    V = np.eye(3)[:2]
    with pytest.raises(ValueError, match="bias=False holds the hidden biases at zero; got b with 1 nonzero"):
        region_refine(X, Y, V, np.array([0.0, 0.5]), bias=False)
    with pytest.raises(ValueError, match="offset=False holds the output offset at zero; got c with 2 nonzero"):
        region_refine(X, Y, V, None, c=np.ones(2), offset=False)
