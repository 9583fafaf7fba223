"""Memmaps, dask arrays and fake communicators through whole pipelines (relufast issue 14)."""

import threading
import time
import warnings

import numpy as np
import pytest

import relufast as rf
from relufast.stages.reduce import Samples, allreduce_state, check_comm

from .conftest import EXACT_TOL

#: A network recovered from other containers of the same samples agrees to rounding.
SAME_TOL = 1e-12

#: Anonymous memory a memmap run may add: the probe / refinement sample (20,000 rows),
#: per-thread blocks and the interpreter's own noise; a copy of X (160 MB) or an n x d
#: finiteness mask (20 MB) would exceed it.
ANON_BUDGET = 16 * 2**20


def rss_anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no RssAnon in /proc/self/status on this system")


class PeakAnon:
    """Largest RssAnon seen by a sampling thread while the block runs."""

    def __enter__(self):
        self.base = rss_anon()
        self.peak = self.base
        self._stop = threading.Event()

        def watch():
            while not self._stop.is_set():
                self.peak = max(self.peak, rss_anon())
                time.sleep(0.002)

        self._t = threading.Thread(target=watch, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss_anon())

    @property
    def rise(self):
        return self.peak - self.base


def _quiet(X, Y, k, method, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        return rf.recover(X, Y, n_hidden=k, method=method, **kw)


def _write_memmap(path, net, n, chunk=100000, seed=0):
    d, m = net.V.shape[1], net.U.shape[0]
    X = np.lib.format.open_memmap(path / "X.npy", mode="w+", dtype=np.float64, shape=(n, d))
    Y = np.lib.format.open_memmap(path / "Y.npy", mode="w+", dtype=np.float64, shape=(n, m))
    rng = np.random.default_rng(seed)
    for s in range(0, n, chunk):
        Xc = rng.standard_normal((min(chunk, n - s), d))
        X[s : s + len(Xc)] = Xc
        Y[s : s + len(Xc)] = net.predict(Xc)
    X.flush(), Y.flush()
    del X, Y
    return np.load(path / "X.npy", mmap_mode="r"), np.load(path / "Y.npy", mmap_mode="r")


@pytest.fixture(scope="module")
def memmapped(tmp_path_factory):
    net = rf.planted.two_layer(d=20, k=4, m=6, random_state=3, max_cos=0.7)
    X, Y = _write_memmap(tmp_path_factory.mktemp("mm"), net, 1_000_000)
    return net, X, Y


@pytest.mark.parametrize("n_estimate", [None, "all"])
def test_memmap_streams_with_bounded_anonymous_memory(memmapped, n_estimate):
    net, X, Y = memmapped
    _quiet(X[:5000], Y[:5000], 4, "bjw19-gaussian")  # warm up imports and thread pools
    with PeakAnon() as mem:
        res = _quiet(X, Y, 4, "bjw19-gaussian", random_state=0, n_estimate=n_estimate)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.U < EXACT_TOL and err.V < EXACT_TOL
    assert res.counts["n_certify"] == len(X)
    assert mem.rise < ANON_BUDGET, f"anonymous memory rose by {mem.rise / 2**20:.1f} MB"


def test_validation_has_no_mask_of_the_data(memmapped):
    _, X, Y = memmapped
    with PeakAnon() as mem:
        Samples.from_arrays(X, Y, check_finite=True)
    assert mem.rise < ANON_BUDGET


@pytest.mark.parametrize(
    "method,kw",
    [
        ("bjw19-gaussian", {"random_state": 0}),
        ("bjw19-gaussian", {"random_state": 0, "n_estimate": "all"}),
        ("bjw19-noisy", {"random_state": 0}),
        ("gklw19", {"random_state": 0}),
    ],
)
def test_dask_and_memmap_match_numpy(tmp_path, method, kw):
    da = pytest.importorskip("dask.array")
    net = rf.planted.two_layer(d=8, k=3, m=5, random_state=1, max_cos=0.7, max_output_condition=10.0)
    X, Y = net.sample(30000, random_state=2, symmetrize=method == "gklw19")
    ref = _quiet(X, Y, 3, method, **kw)
    np.save(tmp_path / "X.npy", X), np.save(tmp_path / "Y.npy", Y)
    Xm, Ym = np.load(tmp_path / "X.npy", mmap_mode="r"), np.load(tmp_path / "Y.npy", mmap_mode="r")
    for Xa, Ya in [(Xm, Ym), (da.from_array(X, chunks=(7000, 8)), da.from_array(Y, chunks=(5000, 5)))]:
        res = _quiet(Xa, Ya, 3, method, **kw)
        assert res.status == ref.status
        err = rf.metrics.parameter_error(res, ref.network)
        assert err.U < SAME_TOL and err.V < SAME_TOL


class FakeComm:
    """Two "ranks" simulated in one process: allgather returns both ranks' values, the
    other rank's precomputed by running the same code on its share first."""

    def __init__(self, rank, values):
        self.rank, self.values = rank, values
        self.calls = 0

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return 2

    def allgather(self, value):
        out = list(self.values[self.calls]) if self.values is not None else [value, value]
        out[self.rank] = value
        self.calls += 1
        return out


def test_comm_must_be_a_communicator():
    with pytest.raises(TypeError, match="comm must be None or an mpi4py communicator"):
        check_comm(object())
    net = rf.planted.two_layer(d=5, k=2, m=3, random_state=0)
    X, Y = net.sample(2000, random_state=1)
    with pytest.raises(TypeError, match="comm must be None or an mpi4py communicator"):
        rf.recover(X, Y, n_hidden=2, method="bjw19-gaussian", comm="world")


def test_allreduce_sums_in_rank_order():
    comm = FakeComm(1, [[{"a": np.array([1.0, 2.0]), "n": 3.0}, None]])
    out = allreduce_state({"a": np.array([0.5, 0.25]), "n": 1.0}, comm)
    np.testing.assert_array_equal(out["a"], [1.5, 2.25])
    assert out["n"] == 4.0


def test_dask_refused_where_not_supported():
    da = pytest.importorskip("dask.array")
    X = da.zeros((100, 3), chunks=50)
    with pytest.raises(ValueError, match="polish_steps needs the samples in memory"):
        rf.recover(X, X[:, :3], n_hidden=2, method="bjw19-noisy", polish_steps=2)


def test_auto_needs_a_named_method_with_comm_or_dask():
    da = pytest.importorskip("dask.array")
    X = da.zeros((100, 3), chunks=50)
    with pytest.raises(ValueError, match="name the method"):
        rf.recover(X, X, n_hidden=2)
    with pytest.raises(ValueError, match="name the method"):
        rf.recover(np.zeros((100, 3)), np.zeros((100, 3)), n_hidden=2, comm=FakeComm(0, None))


def test_comm_without_mpi4py_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'relufast\[mpi\]'"):
        check_comm("COMM_WORLD")
