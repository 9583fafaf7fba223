"""ATV21 at scale: MPI ranks (simulated by threads), memmaps and dask
arrays give the network of one process on the concatenated in-memory samples."""

import warnings

import numpy as np
import pytest

import relufast as rf
from relufast.algorithms import atv21 as A
from relufast.planted import PlantedNetwork

from .threadcomm import run_ranks as _run_ranks

#: Another container or rank split of the same samples sums the moments in another order:
#: the networks agree to rounding (to 1e-12).
SAME_TOL = 1e-12


def bounded_network(d, k, m, seed, c=0.0):
    """B-bounded teacher (ATV21 Sec. 1.1): |U| in [0.5, 1.5], |b| <= 1, unit rows."""
    r = np.random.default_rng(seed)
    V = r.standard_normal((k, d))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    U = r.choice([-1.0, 1.0], size=(m, k)) * r.uniform(0.5, 1.5, (m, k))
    return PlantedNetwork(U=U, V=V, b=r.uniform(-1, 1, k), c=np.full(m, c))


def quiet(f, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        return f(*a, **kw)


def run_ranks(size, fn):
    """``fn(rank, comm)`` on ``size`` simulated ranks (tests/threadcomm.py); their results."""
    return _run_ranks(size, fn)[0]


def same_network(res, ref):
    err = rf.metrics.parameter_error(res, ref.network)
    return max(err.U, err.V, err.b, err.c)


@pytest.mark.parametrize("n_refine", [None, 20000])
def test_two_ranks_match_one_process(n_refine):
    # n_refine < n: the refinement sample is gathered from both ranks and the certificate
    # is a reduction; None: every sample is gathered (n is small).
    net = bounded_network(8, 3, 2, 1, c=0.4)
    X, Y = net.sample(60000, random_state=2)
    one = quiet(A.atv21, X, Y, 3, random_state=0, n_refine=n_refine, n_jobs=1)
    assert one.exact
    cut = 25000  # unequal shares

    def rank(r, comm):
        rows = slice(0, cut) if r == 0 else slice(cut, None)
        return A.atv21(X[rows], Y[rows], 3, random_state=0, n_refine=n_refine, n_jobs=1, comm=comm)

    r0, r1 = quiet(run_ranks, 2, rank)  # warning filters are process-wide: not in the threads
    for name in ("U", "V", "b", "c"):
        assert np.array_equal(getattr(r0, name), getattr(r1, name)), name
    assert r0.residual == r1.residual and r0.status == one.status == "exact"
    assert same_network(r0, one) < SAME_TOL and r0.residual <= 1e-12
    assert r0.counts["n_samples"] == 60000


def test_ranks_with_bad_data_fail_together():
    net = bounded_network(6, 2, 1, 3)
    X, Y = net.sample(4000, random_state=4)

    def rank(r, comm):
        Xr = X[r::2].copy()
        if r == 1:
            Xr[5, 2] = np.nan
        try:
            A.atv21(Xr, Y[r::2], 2, comm=comm)
        except ValueError as exc:
            return str(exc)
        return ""

    for msg in run_ranks(2, rank):
        assert "found 1 NaN or infinite entries over all ranks" in msg


@pytest.mark.parametrize("n_refine", [None, 15000])
def test_memmap_and_dask_match_numpy(tmp_path, n_refine):
    da = pytest.importorskip("dask.array")
    net = bounded_network(8, 3, 2, 5, c=-0.3)
    X, Y = net.sample(40000, random_state=6)
    ref = quiet(A.atv21, X, Y, 3, random_state=0, n_refine=n_refine)
    assert ref.exact
    np.save(tmp_path / "X.npy", X), np.save(tmp_path / "Y.npy", Y)
    Xm, Ym = np.load(tmp_path / "X.npy", mmap_mode="r"), np.load(tmp_path / "Y.npy", mmap_mode="r")
    for Xa, Ya in [(Xm, Ym), (da.from_array(X, chunks=(7000, 8)), da.from_array(Y, chunks=(5000, 2)))]:
        res = quiet(rf.recover, Xa, Ya, n_hidden=3, method="atv21", random_state=0, n_refine=n_refine)
        assert res.status == "exact" and res.residual <= 1e-12
        assert same_network(res, ref) < SAME_TOL


def test_general_through_ranks_memmap_and_dask(tmp_path):
    da = pytest.importorskip("dask.array")
    # d = k = 3: a sane sampled l = 2 estimate (direction cosines > 0.98), so rounding is
    # not amplified by a huge |b|.
    net = bounded_network(3, 3, 1, 7, c=0.2)
    X, Y = net.sample(50000, random_state=8)
    for fit in (False, True):
        ref = quiet(A.atv21_general, X, Y, 3, random_state=0, fit=fit)
        np.save(tmp_path / "X.npy", X), np.save(tmp_path / "Y.npy", Y)
        Xm, Ym = np.load(tmp_path / "X.npy", mmap_mode="r"), np.load(tmp_path / "Y.npy", mmap_mode="r")
        got = [
            quiet(A.atv21_general, Xm, Ym, 3, random_state=0, fit=fit),
            quiet(
                A.atv21_general,
                da.from_array(X, chunks=(3000, 3)),
                da.from_array(Y, chunks=(4000, 1)),
                3,
                random_state=0,
                fit=fit,
            ),
        ]
        got += quiet(  # warning filters are process-wide: set them outside the threads
            run_ranks,
            2,
            lambda r, comm, fit=fit: A.atv21_general(
                X[r * 20000 : 20000 + r * 30000],
                Y[r * 20000 : 20000 + r * 30000],
                3,
                random_state=0,
                fit=fit,
                comm=comm,
            ),
        )
        for res in got:
            assert res.status == ref.status and res.V.shape == ref.V.shape
            for name in ("U", "V", "b", "c"):
                np.testing.assert_allclose(getattr(res, name), getattr(ref, name), atol=SAME_TOL, rtol=0)


def test_tensor_memory_beyond_what_is_available_is_a_status_not_bad_alloc(monkeypatch):
    # 100-100-1 asked for 9.6 GB in the Hermite kernel and ended in std::bad_alloc. The need
    # (k^4 entries a tensor, several batches) is now compared with the memory available
    # before any allocation; here the machine is made to have 1 MB.
    from relufast.algorithms.atv21 import pipeline

    monkeypatch.setattr(pipeline, "available_bytes", lambda: 1e6)
    net = bounded_network(12, 10, 1, seed=0)
    X = np.random.default_rng(0).standard_normal((4000, 12))
    with pytest.warns(rf.RelufastWarning, match=r"more than 80% of the 0.001 GB of memory available"):
        res = rf.recover(X, net.predict(X), n_hidden=10, method="atv21")
    assert res.status == "unsupported" and res.U is None
    assert res.diagnostics["tensor_memory_bytes"] > 0.8 * 1e6
    assert "k = 10 units need about" in res.message and "queries='chosen'" in res.message
    # the estimate at that size: 16 k^4 bytes an accumulator, about 28 of them at 2 threads
    assert pipeline.tensor_memory(100, 2) > 40e9 and pipeline.tensor_memory(10, 2) < 10e6
