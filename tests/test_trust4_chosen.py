"""Issue 31, items 1-4 and 7: what ``exact`` from chosen queries guarantees, and the statuses.

Each test builds a variant of the issue's model (other seeds, sizes and scales) that the old
certificate (256 fresh queries at scale 1 and 256 at scale 10) called ``exact`` or blamed
wrongly, and checks the new behaviour: the certificate probes scales up to 1e4 and beyond
every extracted unit's switching scale, both sides of every extracted boundary and the wedges
between nearly parallel ones (:mod:`relufast.chosen.probes`); the oracle refuses a model
whose outputs change shape or dtype; messages name in-class causes.
"""

import warnings

import numpy as np
import pytest

import relufast
from relufast.chosen.probes import MIN_TOP_SCALE

P = relufast.planted


def chosen(f, d, widths, seed=0, **kw):
    return relufast.extract(f, n_features=d, n_hidden=widths, queries="chosen", random_state=seed, **kw)


def fresh_error(res, f, d, scale, n=2000, seed=99):
    """Largest error on fresh Gaussian inputs at ``scale``, relative to the largest output."""
    X = scale * np.random.default_rng(seed).standard_normal((n, d))
    Y = np.asarray(f(X), dtype=np.float64).reshape(n, -1)
    return float(np.abs(res.predict(X) - Y).max() / np.abs(Y).max())


def not_exact(f, d, widths, **kw):
    """The result, checked to be non-exact and to warn with its message."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = chosen(f, d, widths, **kw)
    assert not res.exact and res.status != "exact", res.message
    assert [w for w in seen if issubclass(w.category, relufast.RelufastWarning) and "chosen queries" in str(w.message)]
    return res


@pytest.mark.parametrize("clip", ["hidden", "outputs"])
def test_item1_clipping_is_not_exact(clip):
    """Item 1: a 12-6-2 network whose ReLU is capped at 60, or whose outputs are clipped to
    +-80, agrees with a ReLU network near the origin (the old certificate: exact at rounding)
    and is wrong by O(1) at scale 1000. The certificate sees it at the large scales and says
    that the model differs only there."""
    d, k = 12, 6
    hidden, out = P.deep_relu(d, (k,), 2, random_state=5)
    if clip == "hidden":
        f = P.relu_function(hidden, out, activation=lambda z: np.clip(z, 0.0, 60.0))
    else:
        g = P.relu_function(hidden, out)
        f = lambda X: np.clip(g(X), -80.0, 80.0)
    res = not_exact(f, d, k)
    assert fresh_error(res, f, d, 1.0) < 1e-12 < 0.1 < fresh_error(res, f, d, 1e3)  # the model's own shape
    assert "differs only beyond scale" in res.message
    assert max(res.diagnostics["certificate_scales"]) >= MIN_TOP_SCALE


def test_item2_one_unit_short_switching_far_out():
    """Item 2: 8-7-1 with a seventh unit of bias -80 (it switches only at |x| ~ 80),
    extracted with n_hidden = 6: the old certificate said exact; the network is wrong by a
    few percent at scales 100-1000."""
    d = 8
    hidden, out = P.deep_relu(d, (7,), 1, random_state=11)
    W, b = hidden[0]
    b = b.copy()
    b[-1] = -80.0
    f = P.relu_function([(W, b)], out)
    res = not_exact(f, d, 6)
    assert fresh_error(res, f, d, 1.0) < 1e-12 < 1e-3 < fresh_error(res, f, d, 1e3)
    assert res.diagnostics["certificate_scales"][1.0] < 1e-12  # it agrees near the origin


def test_item2_three_layers_one_unit_short_in_layer_2():
    """Item 2, deep: 8-6-5-1 whose fifth layer-2 unit has bias -250, extracted as (6, 4)."""
    d = 8
    hidden, out = P.deep_relu(d, (6, 5), 1, random_state=2)
    W2, b2 = hidden[1]
    b2 = b2.copy()
    b2[-1] = -250.0
    f = P.relu_function([hidden[0], (W2, b2)], out)
    res = not_exact(f, d, (6, 4))
    assert fresh_error(res, f, d, 1e3) > 1e-3


def test_item2_in_class_with_biases_stays_exact_at_every_scale():
    """The counterpart: an in-class network with a large bias is exact, the certificate's
    scales reach past 1e4 and past 10 times its largest switching scale |b| / ||w|| (the old
    one stopped at scale 10 and recorded no scales), every first-layer boundary is probed, and
    the network is right on fresh points at scale 1e4 (errors relative to the outputs' scale).
    All of it costs at most a quarter of the extraction's queries (the smallest networks; a
    eighteenth at 40-20-20)."""
    d, k = 10, 5
    hidden, out = P.deep_relu(d, (k,), 3, random_state=21)
    W, b = hidden[0]
    b = b.copy()
    b[0] = 2.5  # |b| / ||w|| = 2.5: switches within the lines' reach (|t| <= 3)
    f = P.relu_function([(W, b)], out)
    res = chosen(f, d, k)
    assert res.exact, res.message
    scales = res.diagnostics["certificate_scales"]
    assert max(scales) >= max(MIN_TOP_SCALE, 25.0) and max(scales.values()) <= res.diagnostics["certificate_tolerance"]
    assert fresh_error(res, f, d, 1e4) < 1e-12
    dg = res.diagnostics
    assert dg["certificate_probes"]["boundaries"] >= 2 * k
    assert dg["certificate_queries"] <= 0.25 * dg["extraction_queries"]
    assert dg["certificate_queries"] + dg["extraction_queries"] == res.counts["queries"]


def near_parallel_pair(seed, d=10, k=4, gap=1e-3, cos=0.999999, weight=-0.003):
    """A d-(k+1)-1 network whose extra unit is at ``cos`` to unit 0 with a bias ``gap`` away
    (and output weight ``weight`` times unit 0's): with n_hidden = k the extraction takes the
    pair as one unit, wrong only in the thin wedge between their boundaries."""
    hidden, out = P.deep_relu(d, (k,), 1, random_state=seed)
    W, b = hidden[0]
    rng = np.random.default_rng(seed)
    p = rng.standard_normal(d)
    p -= (p @ W[0]) * W[0]
    p /= np.linalg.norm(p)
    w = cos * W[0] + np.sqrt(1 - cos**2) * p
    W2, b2 = np.vstack([W, w]), np.append(b, b[0] + gap)
    U2 = np.hstack([out[0], weight * out[0][:, :1]])
    return P.relu_function([(W2, b2)], (U2, out[1]))


def test_item3_near_parallel_pair_one_short():
    """Item 3: two first-layer units at cos 0.999999, biases 1e-3 apart, n_hidden one short.
    The old certificate said exact (3e-16 against 6.9e-15) while 4,000 fresh points at scale
    1 show an error of 5e-8. The probes beside the extracted boundary land in the wedge."""
    d = 10
    f = near_parallel_pair(seed=5)
    res = not_exact(f, d, 4)
    assert fresh_error(res, f, d, 1.0, n=4000, seed=5) > 1e-9  # wrong in the wedge
    assert res.diagnostics["certificate_errors"]["boundaries"] > res.diagnostics["certificate_tolerance"]
    assert "misses the model" in res.message


def test_item4_number_of_outputs_changes_between_calls():
    """Item 4: a model that answers with 3 outputs, then 1: the old oracle kept the first
    width and certified the network exact; now the call that changes raises, naming both."""
    hidden, out = P.deep_relu(9, (4,), 3, random_state=6)
    g = P.relu_function(hidden, out)
    calls = [0]

    def f(X):
        calls[0] += 1
        Y = g(X)
        return Y if calls[0] < 3 else Y[:, :1]

    with pytest.raises(ValueError, match=r"returned shape \(\d+, 1\) .*earlier calls returned 3"):
        chosen(f, 9, 4)


def test_item4_output_dtype_changes_between_calls():
    """Item 4, dtype: float64 answers, then float32 ones (a model that switches precision)."""
    hidden, out = P.deep_relu(9, (4,), 2, random_state=7)
    g = P.relu_function(hidden, out)
    calls = [0]

    def f(X):
        calls[0] += 1
        return g(X) if calls[0] < 2 else g(X).astype(np.float32)

    with pytest.raises(ValueError, match=r"dtype float64 .* got 2 of dtype float32"):
        chosen(f, 9, 4)


@pytest.mark.parametrize("d,k,seed", [(3, 7, 7), (4, 9, 9), (3, 7, 1), (10, 100, 0), (30, 100, 1)])
def test_more_units_than_d_m_signs_by_subset_sum(d, k, seed):
    """Item 7 / issue 30: one hidden layer with k > d m: the output layer's linear term has
    d m equations for k signs; its 0/1 solution is found by lattice reduction (before: signs
    unresolved, and 3-7-1 of seed 1 passed a wrong least-squares flip the certificate caught)."""
    f = P.relu_function(*P.deep_relu(d, (k,), 1, random_state=seed))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = chosen(f, d, k)
    assert res.exact and res.status == "exact"
    assert res.diagnostics["signs_resolved"] is True and "signs_underdetermined_layers" not in res.diagnostics


@pytest.mark.parametrize("d,k", [(2, 80)])
def test_item7_subset_sum_too_dense_says_signs_unresolved(d, k):
    """Item 7: where lattice reduction finds no 0/1 solution (80 signs against 2 equations of
    about 46 bits: density 0.87), the message says signs unresolved and does not blame the model."""
    f = P.relu_function(*P.deep_relu(d, (k,), 1, random_state=0))
    res = not_exact(f, d, k)
    assert "signs unresolved" in res.message
    assert "not a ReLU network" not in res.message and "outside the class" not in res.message
    assert res.diagnostics["signs_resolved"] is False and res.diagnostics["signs_underdetermined_layers"] == (1,)


@pytest.mark.parametrize("scale", [3e5, 4e-7, 2.0**20])
def test_item7_scaled_outputs_are_exact(scale):
    """Item 7: 10-5-1 with outputs times 3e5 or 4e-7 is in the class and is exact like the
    unscaled network (the rows refitted through precise kinks need no polish, whose ridge
    was not scale-invariant)."""
    hidden, out = P.deep_relu(10, (5,), 1, random_state=13)
    f = P.relu_function(hidden, (scale * out[0], scale * out[1]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = chosen(f, 10, 5)
    assert res.exact and res.status == "exact"
    assert res.residual <= res.diagnostics["certificate_tolerance"]


def test_item7_float16_named():
    """Item 7: float16 outputs: nothing is found, and the message names float16 as the cause."""
    f = P.relu_function(*P.deep_relu(8, (4,), 1, random_state=2), np.float16)
    res = not_exact(f, 8, 4, max_queries=60000)
    assert "float16" in res.message and "float32 or float64" in res.message


def test_probes_straddle_every_extracted_boundary():
    """The boundary probes of the certificate: each first-layer pair lies on both sides of its
    unit's hyperplane within 1e-1 of it (times the scale), and most deeper pairs (found by
    Newton steps on the network) on both sides of a bent boundary of their layer; the old
    certificate had no such probes."""
    from relufast.chosen import probes
    from relufast.chosen.net import pre_activations

    hidden, _ = P.deep_relu(7, (6, 5, 4), 1, random_state=3)
    rng = np.random.default_rng(0)
    scales = np.array([1.0, 100.0])
    pts, _ = probes._first_layer(*hidden[0], scales, rng)
    W, b = hidden[0]
    for j in range(W.shape[0]):
        zp, zm = pts[2 * j] @ W[j] + b[j], pts[2 * j + 1] @ W[j] + b[j]
        assert np.all(zp > 0) and np.all(zm < 0) and np.all(zp - zm <= 0.2 * 100 + 1e-9)
    pts, _ = probes._deep(hidden, scales, rng)
    assert len(pts) == 4  # layers 2 and 3, each side
    for li, (plus, minus) in zip((1, 2), (pts[0:2], pts[2:4])):
        zp, zm = pre_activations(hidden, plus)[0][li], pre_activations(hidden, minus)[0][li]
        assert len(plus) >= hidden[li][0].shape[0]  # most units kept their points
        # some unit of the layer switches between them (a step may also cross a boundary of an
        # earlier layer, where the bent boundary turns: most pairs, not all)
        assert ((zp > 0) & (zm < 0)).any(axis=1).mean() >= 0.75


@pytest.mark.parametrize("seed", [1, 3])
def test_model_changing_between_calls_is_named(seed):
    """Dropout drawn once per call (p = 0.105 on each unit of a 7-3-1 network): the extraction
    happens to see the full network, and the old certificate, one call, said exact. The
    certificate's calls each ask the same points; the answers differ, and the message says so."""
    hidden, out = P.deep_relu(7, (3,), 1, random_state=seed)
    W, b = hidden[0]
    rng = np.random.default_rng(seed)

    def f(X):
        H = np.maximum(np.asarray(X) @ W.T + b, 0.0) * (rng.random(3) > 0.105)
        return H @ out[0].T + out[1]

    res = not_exact(f, 7, 3)
    assert "answered the same queries differently in different calls" in res.message
    assert res.diagnostics["certificate_inconsistency"] > res.diagnostics["certificate_tolerance"]
