import math

import numpy as np
import pytest

import relufast as rf
from relufast.stages.moments import C2_RELU, SecondMomentAccumulator, hermite_moment, hermite_moment_reference

#: Kernel vs NumPy reference: same sums in a different order.
KERNEL_RTOL = 1e-12


@pytest.mark.parametrize(
    "n,d,m", [(1, 1, 1), (7, 3, 2), (1000, 5, 4), (2049, 17, 3), (300, 33, 2), (700, 50, 3), (257, 71, 1)]
)
@pytest.mark.parametrize("n_jobs", [1, 2])
@pytest.mark.parametrize("block", [1, 64, 256])
def test_kernel_matches_reference(n, d, m, n_jobs, block):
    rng = np.random.default_rng(n * 100 + d)
    X = rng.standard_normal((n, d))
    Y = rng.standard_normal((n, m))
    T = hermite_moment(X, Y, n_jobs=n_jobs, block_size=block)
    R = hermite_moment_reference(X, Y)
    assert T.shape == (m, d, d)
    np.testing.assert_allclose(T, R, rtol=KERNEL_RTOL, atol=KERNEL_RTOL * np.abs(R).max())
    np.testing.assert_array_equal(T, np.transpose(T, (0, 2, 1)))


def test_chunked_and_merged_equal_one_shot():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((5000, 6))
    Y = rng.standard_normal((5000, 3))
    one = hermite_moment(X, Y)
    acc = SecondMomentAccumulator(6, 3)
    for s in range(0, 5000, 1234):
        acc.update(X[s : s + 1234], Y[s : s + 1234])
    a, b = SecondMomentAccumulator(6, 3), SecondMomentAccumulator(6, 3)
    a.update(X[:2500], Y[:2500])
    b.update(X[2500:], Y[2500:])
    merged = a.merge(b).tensor()
    assert acc.n_samples == 5000
    np.testing.assert_allclose(acc.tensor(), one, rtol=KERNEL_RTOL, atol=1e-14)
    np.testing.assert_allclose(merged, one, rtol=KERNEL_RTOL, atol=1e-14)


class _FakeComm:
    """Two 'ranks' in one process (this one is rank 0): allgather returns this rank's value
    and the other rank's state."""

    def __init__(self, other_state):
        self._other = other_state

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 2

    def allgather(self, value):
        return [value, self._other]


def test_allreduce_sums_rank_states():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((3000, 4))
    Y = rng.standard_normal((3000, 2))
    other = SecondMomentAccumulator(4, 2).update(X[1000:], Y[1000:]).state()
    mine = hermite_moment(X[:1000], Y[:1000], comm=_FakeComm(other))
    np.testing.assert_allclose(mine, hermite_moment(X, Y), rtol=KERNEL_RTOL, atol=1e-14)


def test_population_value_and_unnormalised_rows():
    # Spec oracle 2: E T[i] = c2 sum_j U_ij ||V_j|| vhat_j vhat_j^T, rows not normalised.
    rng = np.random.default_rng(3)
    d, k, m, n = 4, 2, 3, 400_000
    V = rng.standard_normal((k, d)) * np.array([[0.7], [1.8]])
    U = rng.standard_normal((m, k))
    X = rng.standard_normal((n, d))
    Y = np.maximum(X @ V.T, 0) @ U.T
    T = hermite_moment(X, Y)
    s = np.linalg.norm(V, axis=1)
    Vh = V / s[:, None]
    expected = C2_RELU * np.einsum("ij,j,ja,jb->iab", U, s, Vh, Vh)
    rel = np.linalg.norm(T - expected) / np.linalg.norm(expected)
    # The prototype measured 0.02-0.03 at n = 2.5e5; sampling error scales as n^-1/2.
    assert rel < 0.04
    assert math.isclose(C2_RELU, 0.3989422804014327)


def test_accumulator_validation():
    acc = SecondMomentAccumulator(3, 2)
    with pytest.raises(ValueError, match="no samples accumulated"):
        acc.tensor()
    with pytest.raises(ValueError, match="expected d = 3"):
        acc.update(np.zeros((5, 4)), np.zeros((5, 2)))
    with pytest.raises(ValueError, match="same number of samples"):
        acc.update(np.zeros((5, 3)), np.zeros((4, 2)))
    with pytest.raises(TypeError, match="SecondMomentAccumulator"):
        acc.merge("not an accumulator")
    with pytest.raises(ValueError, match="order must be 2"):
        hermite_moment(np.zeros((5, 3)), np.zeros((5, 2)), order=3)
    with pytest.raises(ValueError, match="n_jobs"):
        SecondMomentAccumulator(3, 2, n_jobs=0)


def test_kernel_refuses_silent_copies():
    # The facade converts; the raw kernel must not copy a Fortran-ordered array silently.
    from relufast._native import core

    acc = core.SecondMoment(3, 1)
    with pytest.raises(TypeError):
        acc.update(np.asfortranarray(np.ones((4, 3))), np.ones((4, 1)), 1, 8)
    # The facade accepts it (and integers), converting once.
    T = hermite_moment(np.asfortranarray(np.arange(12).reshape(4, 3)), np.ones(4, dtype=int))
    assert T.dtype == np.float64 and T.shape == (1, 3, 3)


def test_backend_name():
    assert rf.BACKEND in ("baseline", "avx2", "avx512")


def _variants():
    """The compiled variants this CPU can run (the baseline always)."""
    import importlib

    from relufast import _core

    found = [("baseline", _core)]
    for name, ok in (("avx2", _core.cpu_has_avx2_fma()), ("avx512", _core.cpu_has_avx512())):
        if not ok:  # importing a variant the CPU lacks can fault in its static initialisers
            continue  # (the AVX-512 build on an AMD EPYC with AVX2 only: Illegal instruction)
        try:
            mod = importlib.import_module(f"relufast._core_{name}")
        except ImportError:
            continue
        found.append((name, mod))
    return found


@pytest.mark.parametrize("name,mod", _variants(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_compiled_variant_computes_the_same_moment(name, mod):
    # The AVX-512 and AVX2 builds are the baseline's code for wider registers: the same
    # tensor as the reference to rounding, and each says what it was compiled for.
    rng = np.random.default_rng(7)
    X, Y = rng.standard_normal((700, 19)), rng.standard_normal((700, 3))
    acc = mod.SecondMoment(19, 3)
    acc.update(X, Y, 2, 64)
    T = acc.tensor().reshape(3, 19, 19)
    R = hermite_moment_reference(X, Y)
    np.testing.assert_allclose(T, R, rtol=KERNEL_RTOL, atol=KERNEL_RTOL * np.abs(R).max())
    assert mod.compiled_with_avx512() == (name == "avx512")
    assert mod.compiled_with_avx2() == (name != "baseline")


@pytest.mark.parametrize("d", [6, 45])
def test_output_projection_inside_kernel(d):
    # The pipeline compresses outputs per block (Y @ Q) inside the kernel.
    from relufast._native import core

    rng = np.random.default_rng(d)
    X = rng.standard_normal((900, d))
    Y = rng.standard_normal((900, 5))
    Q = np.ascontiguousarray(np.linalg.qr(rng.standard_normal((5, 3)))[0])
    acc = core.SecondMoment(d, 3)
    acc.update(X, Y, 2, 64, Q)
    T = acc.tensor().reshape(3, d, d)
    R = hermite_moment_reference(X, Y @ Q)
    np.testing.assert_allclose(T, R, rtol=KERNEL_RTOL, atol=KERNEL_RTOL * np.abs(R).max())
    with pytest.raises(ValueError, match=r"Q has shape \(5, 3\), expected \(4, 3\)"):
        acc.update(X, np.ascontiguousarray(Y[:, :4]), 1, 64, Q)


def test_dask_blocks_reduce_like_one_shot():
    da = pytest.importorskip("dask.array")
    rng = np.random.default_rng(11)
    X = rng.standard_normal((5000, 7))
    Y = rng.standard_normal((5000, 3))
    Xd = da.from_array(X, chunks=(777, 4))  # uneven row blocks, split columns
    Yd = da.from_array(Y, chunks=(1000, 3))  # different row blocks from X
    np.testing.assert_allclose(hermite_moment(Xd, Yd), hermite_moment(X, Y), rtol=KERNEL_RTOL, atol=1e-14)
    acc = SecondMomentAccumulator(7, 1).update(Xd, da.from_array(Y[:, 0], chunks=500))
    np.testing.assert_allclose(acc.tensor(), hermite_moment(X, Y[:, :1]), rtol=KERNEL_RTOL, atol=1e-14)


@pytest.mark.parametrize("name,mod", _variants(), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("d,block", [(5, 64), (33, 100), (71, 256)])
def test_blas_products_give_the_kernels_moment(name, mod, d, block):
    # The blocks' products by SciPy's dgemm (column panels of width 16 above d = 32, a last
    # narrower one, a last block of one sample, outputs compressed by Q) are Eigen's sums to
    # rounding, on every compiled variant and thread count.
    from relufast._blas import dgemm_capsule, single_threaded_blas

    rng = np.random.default_rng(d)
    X, Y = rng.standard_normal((1000, d)), rng.standard_normal((1000, 4))
    Q = np.ascontiguousarray(np.linalg.qr(rng.standard_normal((4, 3)))[0])
    R = hermite_moment_reference(X, Y @ Q)
    for n_jobs in (1, 2):
        acc = mod.SecondMoment(d, 3)
        with single_threaded_blas():
            acc.update(X, Y, n_jobs, block, Q, dgemm_capsule())
            acc.update(X[:1], Y[:1], n_jobs, block, Q, dgemm_capsule())  # a block of one sample
        ref = mod.SecondMoment(d, 3)
        ref.update(X, Y, n_jobs, block, Q)
        ref.update(X[:1], Y[:1], n_jobs, block, Q)
        T, E = acc.tensor(), ref.tensor()
        np.testing.assert_allclose(T, E, rtol=KERNEL_RTOL, atol=KERNEL_RTOL * np.abs(E).max())
        assert acc.count == 1001
    np.testing.assert_allclose(
        SecondMomentAccumulator(d, 4, blas=True).update(X, Y).tensor(),
        SecondMomentAccumulator(d, 4, blas=False).update(X, Y).tensor(),
        rtol=KERNEL_RTOL,
        atol=KERNEL_RTOL * np.abs(R).max(),
    )
