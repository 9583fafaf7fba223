import math

import numpy as np
import pytest

from relufast.stages.highs import INF, LPSession
from relufast.stages.patterns import PatternStream, cell_count, sign_patterns, sign_patterns_reference


def _as_set(P):
    return {p.tobytes() for p in P}


@pytest.mark.parametrize("k,n", [(1, 6), (2, 9), (3, 10), (4, 8)])
@pytest.mark.parametrize("mode", ["vertices", "rays"])
def test_kernel_matches_reference(k, n, mode):
    rng = np.random.default_rng(10 * k + n)
    B = rng.standard_normal((k, n))
    P, C, systems = sign_patterns(B, mode=mode, n_jobs=2)
    R = sign_patterns_reference(B, mode=mode)
    assert _as_set(P) == _as_set(R)
    assert len(_as_set(P)) == len(P)  # no duplicates
    assert systems == math.comb(n, k if mode == "vertices" else k - 1)
    # Each coefficient realises its pattern.
    for S, c in zip(P, C):
        r = c @ B
        np.testing.assert_array_equal(r > 1e-9 * np.abs(r).max(), S)


def test_rectified_span_rays_contain_the_true_rows():
    # With enough samples the rows of relu(V X) are extreme rays of the non-negative
    # cone of their span (BJW19 Lemma 10); Lemma 1 finds every realizable set anyway.
    rng = np.random.default_rng(0)
    for n, modes in ((200, ("rays",)), (40, ("vertices",))):
        X = rng.standard_normal((n, 3))
        F = np.maximum(X @ rng.standard_normal((3, 3)).T, 0).T  # k x n rows of relu(V X)
        B = np.linalg.qr(F.T)[0].T  # orthonormal basis of their span
        for mode in modes:
            P, _, _ = sign_patterns(B, mode=mode)
            assert _as_set(F > 0) <= _as_set(P)
            assert len(P) <= math.comb(n, 3) * (2**3 - 1)


def _strictly_feasible(B, S):
    """Is {w : (wB)_j > 0 on S, < 0 off S} nonempty?  max t s.t. sign_j (wB)_j >= t."""
    k, n = B.shape
    sgn = np.where(S, 1.0, -1.0)
    sess = LPSession(k + 1, lower=np.r_[-np.ones(k), -INF], upper=np.r_[np.ones(k), 1.0], cost=np.r_[np.zeros(k), -1.0])
    sess.add_rows(np.hstack([-(sgn[:, None] * B.T), np.ones((n, 1))]), -INF, 0.0)
    res = sess.solve()
    return res.feasible and -res.objective > 1e-9


@pytest.mark.parametrize("k,n", [(2, 10), (3, 9), (3, 12)])
def test_full_dimensional_cells_match_the_counting_formula(k, n):
    rng = np.random.default_rng(k * n)
    B = rng.standard_normal((k, n))  # generic hyperplanes
    P, _, _ = sign_patterns(B, mode="vertices")
    cells = sum(_strictly_feasible(B, S) for S in P)
    # The empty positive set is never a candidate (Lemma 1 takes b != 0); its cell exists
    # exactly when the all-positive one does (negate w).
    cells += _strictly_feasible(B, np.ones(n, dtype=bool))
    assert cells == cell_count(n, k) == 2 * sum(math.comb(n - 1, i) for i in range(k))


def test_results_do_not_depend_on_threads():
    B = np.random.default_rng(5).standard_normal((3, 30))
    a = sign_patterns(B, n_jobs=1)
    b = sign_patterns(B, n_jobs=2)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_stream_dedupes_limits_and_orders_rays_first():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((30, 3))
    F = np.maximum(X @ rng.standard_normal((2, 3)).T, 0).T
    B = np.linalg.qr(F.T)[0].T
    stream = PatternStream(B, chunk=50)
    items = list(stream)
    keys = [S.tobytes() for S, _, _ in items]
    assert len(keys) == len(set(keys)) and stream.exhausted
    sources = [src for _, _, src in items]
    order = {"random": 0, "rays": 1, "vertices": 2}
    assert sources[0] == "random" and sources == sorted(sources, key=order.get)
    assert "vertices" in sources  # exhaustive phases follow and add what the rays miss
    limited = PatternStream(B, max_patterns=5)
    assert len(list(limited)) == 5 and limited.stopped_by == "max_patterns"


def test_ties_are_never_positive():
    # A vector with exact zeros: zero coordinates must not enter the positive set.
    B = np.array([[1.0, 0.0, -1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    P, _, _ = sign_patterns(B, mode="rays")
    for S, r in zip(P, sign_patterns(B, mode="rays")[1] @ B):
        assert not S[r == 0].any()


def test_bad_mode_and_shape():
    from relufast._native import core

    with pytest.raises(ValueError, match="mode must be 'vertices' or 'rays'"):
        core.enumerate_patterns(np.ones((2, 5)), "cells", 0, 10, 1e-9, 1)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        core.enumerate_patterns(np.ones((5, 2)), "rays", 0, 10, 1e-9, 1)


def test_random_subsets_agree_with_the_lexicographic_systems():
    from relufast._native import core

    rng = np.random.default_rng(9)
    X = rng.standard_normal((60, 3))
    F = np.maximum(X @ rng.standard_normal((3, 3)).T, 0).T
    B = np.ascontiguousarray(np.linalg.qr(F.T)[0].T)
    # Every 2-subset given explicitly gives the same set as the lexicographic enumeration.
    import itertools

    subsets = np.array(list(itertools.combinations(range(60), 2)), dtype=np.int64)
    out = core.enumerate_patterns_for(B, "rays", subsets, 1e-9, 2)
    from relufast.stages.patterns import unpack_patterns

    P, _, _ = sign_patterns(B, mode="rays")
    assert _as_set(unpack_patterns(out["words"], 60)) == _as_set(P)
    with pytest.raises(ValueError, match="indices must be in"):
        core.enumerate_patterns_for(B, "rays", np.array([[0, 60]], dtype=np.int64), 1e-9, 1)
    with pytest.raises(ValueError, match="must have 2 columns"):
        core.enumerate_patterns_for(B, "rays", np.array([[0, 1, 2]], dtype=np.int64), 1e-9, 1)
