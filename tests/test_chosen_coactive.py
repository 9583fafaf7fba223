"""The certificate's co-activity probes (``relufast.chosen.probes._co_active``): a deeper
unit's coefficient on a unit of the layer before it acts only where both are active, a
region random and boundary probes can miss (a float32 10-15-15-1 was called `exact` with a
second-layer row 2e-4 off; its function differed on 0.2-0.5% of Gaussian points at scales
3-30)."""

import numpy as np

from relufast import planted as P
from relufast.chosen import probes
from relufast.chosen.fit import cert_tolerance, certify
from relufast.chosen.net import pre_activations
from relufast.chosen.oracle import Oracle


def test_co_active_points_have_both_units_active():
    """Every point returned has its pair active in the network, and most pairs get one."""
    hidden, _ = P.deep_relu(7, (6, 5, 4), 1, random_state=3)
    rng = np.random.default_rng(0)
    pts, grp = probes._co_active(hidden, np.array([1.0, 3.16, 10.0]), rng)
    assert len(pts) == 4  # layers 2 and 3, starts at scales 1 and 10
    for li, X in zip((1, 1, 2, 2), pts):
        Z = pre_activations(hidden, X)[0]
        k, kp = hidden[li][0].shape[0], hidden[li - 1][0].shape[0]
        # each point is co-active for some pair (u, j) of this layer and the one before
        both = (Z[li][:, :, None] > 0) & (Z[li - 1][:, None, :] > 0)
        assert both.reshape(len(X), -1).any(axis=1).all()
        assert len(X) >= 0.5 * k * kp
    assert [int(g[0]) for g in grp] == [0, 2, 0, 2]


def _rarest_pair(hidden, d):
    """(u, j): the second-layer unit and first-layer unit least often active together on
    Gaussian points at scales 1-30 (but active together somewhere)."""
    X = np.vstack([s * np.random.default_rng(5).standard_normal((20000, d)) for s in (1.0, 3.0, 10.0, 30.0)])
    Z = pre_activations(hidden, X)[0]
    frac = ((Z[1][:, :, None] > 0) & (Z[0][:, None, :] > 0)).mean(axis=0)
    frac[frac == 0] = np.inf
    return np.unravel_index(np.argmin(frac), frac.shape), float(frac.min())


def test_certificate_sees_a_coefficient_wrong_where_its_units_are_rarely_both_active():
    d = 10
    hidden, out = P.deep_relu(d, (15, 15), 1, random_state=3)
    (u, j), frac = _rarest_pair(hidden, d)
    assert frac < 0.01
    W2 = hidden[1][0].copy()
    W2[u, j] += 1e-6 * np.abs(W2[u]).max()
    wrong = [hidden[0], (W2, hidden[1][1])]
    oracle = Oracle(P.relu_function(hidden, out), d)
    cert = certify(oracle, wrong, out, np.random.default_rng(0))
    tol = cert_tolerance(np.finfo(np.float64).eps, (d, 15, 15))
    assert cert["by_family"]["co-active"] > 10 * tol
    assert cert["error"] > tol
    # the same network unchanged stays within the tolerance on these probes too
    cert = certify(oracle, hidden, out, np.random.default_rng(0))
    assert cert["by_family"]["co-active"] <= tol
