"""Property tests: every C++ kernel against its NumPy reference, on inputs hypothesis draws.

Also the properties the kernels promise beyond agreement: results that do not depend on
``n_jobs`` (bit for bit: partial sums are reduced in a fixed block order), any block size
(up to 2^62) gives the same sums, and subset counts are exact integers.
"""

import math

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from relufast._native import core  # noqa: E402
from relufast.stages.moments import (  # noqa: E402  # noqa: E402
    SecondMomentAccumulator,
    detector_matrix,
    detector_matrix_reference,
    hermite_moment,
    hermite_moment_reference,
)
from relufast.stages.patterns import sign_patterns, sign_patterns_reference  # noqa: E402
from relufast.stages.refine import output_basis, refine_rows, refine_rows_reference  # noqa: E402

#: Sums of n products in a different order: relative error ~ n eps, with eps = 2.2e-16.
SUM_RTOL = 1e-12
#: Derandomised: the examples are a fixed function of the test, like a seeded test.
PROPERTY = settings(derandomize=True, deadline=None, max_examples=30)

#: Block sizes: one sample, ragged, the default, and sizes that overflowed the block count.
BLOCKS = st.sampled_from([1, 7, 256, 2**31, 2**62, 2**63 - 1])


def _data(seed, n, d, m):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)), rng.standard_normal((n, m))


def _close(got, ref, scale):
    np.testing.assert_allclose(got, ref, rtol=0, atol=SUM_RTOL * max(scale, 1.0))


@PROPERTY
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 300),
    d=st.integers(1, 40),
    m=st.integers(1, 4),
    block=BLOCKS,
    n_jobs=st.integers(1, 3),
)
def test_second_moment_matches_numpy(seed, n, d, m, block, n_jobs):
    X, Y = _data(seed, n, d, m)
    got = hermite_moment(X, Y, n_jobs=n_jobs, block_size=block)
    ref = hermite_moment_reference(X, Y)
    _close(got, ref, np.einsum("si,sj,sk->ijk", np.abs(Y), np.abs(X), np.abs(X)).max() / n)


@PROPERTY
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 2000),
    d=st.integers(1, 40),
    m=st.integers(1, 3),
    block=st.sampled_from([1, 5, 64, 256]),
)
def test_second_moment_does_not_depend_on_threads(seed, n, d, m, block):
    X, Y = _data(seed, n, d, m)
    T1 = hermite_moment(X, Y, n_jobs=1, block_size=block)
    for jobs in (2, 3, None):
        np.testing.assert_array_equal(hermite_moment(X, Y, n_jobs=jobs, block_size=block), T1)


@PROPERTY
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 400),
    d=st.integers(1, 12),
    m=st.integers(1, 4),
    k=st.integers(1, 5),
    power=st.sampled_from([1.0, 2.0]),
    block=BLOCKS,
    n_jobs=st.integers(1, 3),
)
def test_relu_stats_matches_numpy(seed, n, d, m, k, power, block, n_jobs):
    X, Y = _data(seed, n, d, m)
    rng = np.random.default_rng(seed + 1)
    V, U = rng.standard_normal((k, d)), rng.standard_normal((m, k))
    got = core.relu_stats(X, Y, V, U, n_jobs, block, power)
    F = np.maximum(X @ V.T, 0.0) ** power
    scale = float(np.abs(F).sum(axis=0).max() * max(np.abs(F).max(), np.abs(Y).max()))
    _close(got["gram"], F.T @ F, scale)
    _close(got["cross"], F.T @ Y, scale)
    R = Y - F @ U.T
    np.testing.assert_allclose(got["sq_residual"], np.sum(R * R), rtol=1e-11)
    np.testing.assert_allclose(got["sq_norm"], np.sum(Y * Y), rtol=1e-12)
    assert got["count"] == n
    one = core.relu_stats(X, Y, V, U, 1, block, power)
    assert all(np.array_equal(one[key], got[key]) for key in one)


@PROPERTY
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(30, 400),
    d=st.integers(1, 7),
    k=st.integers(1, 4),
    centred=st.booleans(),
    block=BLOCKS,
    n_jobs=st.integers(1, 3),
)
def test_detector_matches_numpy(seed, n, d, k, centred, block, n_jobs):
    X, Y = _data(seed, n, d, k)
    try:
        ref, _, _ = detector_matrix_reference(X, Y, centred=centred)
    except np.linalg.LinAlgError:  # singular E[x x^T] (n tiny against d): not a kernel question
        return
    got, _, _ = detector_matrix(X, Y, centred=centred, n_jobs=n_jobs, block_size=block)
    _close(got, ref, np.abs(ref).max() * 10)
    one, _, _ = detector_matrix(X, Y, centred=centred, n_jobs=1, block_size=block)
    np.testing.assert_array_equal(one, got)


@PROPERTY
@given(n=st.integers(1, 200), k=st.integers(1, 200), mode=st.sampled_from(["rays", "vertices"]))
def test_subset_count_is_exact_or_refused(n, k, mode):
    if k > n:
        with pytest.raises(ValueError, match="1 <= k <= n"):
            core.pattern_subset_count(n, k, mode)
        return
    r = k if mode == "vertices" else k - 1
    exact = math.comb(n, r)
    if mode == "vertices" and k > 62:
        with pytest.raises(ValueError, match="k <= 62"):
            core.pattern_subset_count(n, k, mode)
    elif exact >= 2**62:
        with pytest.raises(ValueError, match=r"exceed the limit 2\^62"):
            core.pattern_subset_count(n, k, mode)
    else:
        assert core.pattern_subset_count(n, k, mode) == exact


@PROPERTY
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(2, 9),
    k=st.integers(1, 3),
    mode=st.sampled_from(["rays", "vertices"]),
    split=st.floats(0, 1),
    n_jobs=st.integers(1, 3),
)
def test_sign_patterns_match_numpy(seed, n, k, mode, split, n_jobs):
    k = min(k, n)
    B = np.random.default_rng(seed).standard_normal((k, n))
    got, coeffs, _ = sign_patterns(B, mode=mode, n_jobs=n_jobs)
    ref = sign_patterns_reference(B, mode=mode)
    assert {p.tobytes() for p in got} == {p.tobytes() for p in ref}
    assert len({p.tobytes() for p in got}) == len(got)  # deduplicated
    r = coeffs @ B
    np.testing.assert_array_equal(r > 1e-9 * np.abs(r).max(axis=1, keepdims=True), got)
    # Ranges compose: [0, a) and [a, total) find the same sets; threads change nothing.
    total = core.pattern_subset_count(n, k, mode)
    a = int(split * total)
    parts = [sign_patterns(B, mode=mode, begin=b, end=e, n_jobs=1)[0] for b, e in ((0, a), (a, None))]
    assert {p.tobytes() for part in parts for p in part} == {p.tobytes() for p in got}
    one, one_coeffs, _ = sign_patterns(B, mode=mode, n_jobs=1)
    np.testing.assert_array_equal(one, got)
    np.testing.assert_array_equal(one_coeffs, coeffs)


@PROPERTY
@given(
    seed=st.integers(0, 2**32 - 1),
    n_jobs=st.integers(1, 3),
    begin=st.integers(-5, 2**61),
    length=st.integers(-5, 2**61),
)
def test_sign_pattern_ranges_are_clamped(seed, n_jobs, begin, length):
    # Ranges past the end (or reversed) are empty, never an endless unranking.
    B = np.random.default_rng(seed).standard_normal((2, 6))
    out = core.enumerate_patterns(B, "rays", begin, begin + length, 1e-9, n_jobs)
    total = core.pattern_subset_count(6, 2, "rays")
    lo, hi = max(0, min(begin, total)), max(0, min(begin + length, total))
    assert out["systems"] == max(0, hi - lo)


@pytest.fixture(scope="module")
def refine_instance():
    import relufast as rf

    net = rf.planted.two_layer(d=6, k=3, m=5, random_state=0, max_cos=0.7, max_condition=3.0)
    X, Y = net.sample(300, random_state=1)
    return net, X, output_basis(Y, 3)[0]


@settings(derandomize=True, deadline=None, max_examples=15)
@given(seed=st.integers(0, 2**32 - 1), noise=st.sampled_from([0.0, 0.05, 0.2]), n_jobs=st.integers(1, 3))
def test_refine_rows_matches_numpy(refine_instance, seed, noise, n_jobs):
    net, X, B = refine_instance
    rng = np.random.default_rng(seed)
    cand = np.vstack([net.V + noise * rng.standard_normal(net.V.shape), rng.standard_normal((2, 6))])
    out = refine_rows(B, X, cand, n_jobs=n_jobs)
    rows, cert, sign = refine_rows_reference(B, X, cand)
    np.testing.assert_array_equal(out["certified"], cert)
    np.testing.assert_array_equal(out["sign"][cert], sign[cert])
    np.testing.assert_allclose(out["rows"][cert], rows[cert], atol=1e-12)


def test_vertices_with_more_right_hand_sides_than_one_panel():
    # k = 9: 511 right-hand sides per subset, solved in panels of 256 columns.
    B = np.random.default_rng(3).standard_normal((9, 10))
    got, _, systems = sign_patterns(B, mode="vertices")
    assert systems == 10
    ref = sign_patterns_reference(B, mode="vertices")
    assert {p.tobytes() for p in got} == {p.tobytes() for p in ref}


def test_accumulator_with_huge_block_size_is_not_empty():
    X, Y = _data(0, 500, 4, 2)
    acc = SecondMomentAccumulator(4, 2, block_size=2**63 - 1).update(X, Y)
    assert acc.n_samples == 500
    _close(acc.tensor(), hermite_moment_reference(X, Y), 10.0)
