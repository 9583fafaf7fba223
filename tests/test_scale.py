"""Memmaps, dask arrays and fake communicators through whole pipelines."""

import threading
import time
import warnings

import numpy as np
import pytest

import relufast as rf
from relufast.stages.reduce import Samples, allreduce_state, check_comm

from .conftest import EXACT_TOL
from .threadcomm import run_ranks as _run_ranks

#: A network recovered from other containers of the same samples agrees to rounding.
SAME_TOL = 1e-12

#: Anonymous memory a memmap run may add: the probe / refinement sample (20,000 rows),
#: per-thread blocks and the interpreter's own noise; a copy of X (160 MB) or an n x d
#: finiteness mask (20 MB) would exceed it. The per-thread blocks grow with the method's
#: threads (20.1 MB at 16 on a 16-core Xeon), so the runs measured here use two.
ANON_BUDGET = 16 * 2**20
ANON_JOBS = 2
#: A whole recovery's own rise at two threads reached 16.8-17.1 MB on a 2-core AMD EPYC (its
#: first run in a process; ~0 after), so its budget is higher: that plus the 20 MB mask or a
#: copy of X still exceeds it.
ANON_BUDGET_RUN = 24 * 2**20


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
    _quiet(X[:5000], Y[:5000], 4, "bjw19-gaussian", n_jobs=ANON_JOBS)  # warm up imports and thread pools
    with PeakAnon() as mem:
        res = _quiet(X, Y, 4, "bjw19-gaussian", random_state=0, n_estimate=n_estimate, n_jobs=ANON_JOBS)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.U < EXACT_TOL and err.V < EXACT_TOL
    assert res.counts["n_certify"] == len(X)
    assert mem.rise < ANON_BUDGET_RUN, f"anonymous memory rose by {mem.rise / 2**20:.1f} MB"


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


def _on_threads(size, run):
    """``run(comm, rank)`` on ``size`` simulated ranks (tests/threadcomm.py), in rank order."""
    return _run_ranks(size, lambda r, comm: run(comm, r))[0]


def _enumeration_case():
    net = rf.planted.two_layer(d=4, k=3, m=3, random_state=4, max_cos=0.9)
    X, Y = net.sample(400, random_state=5, input="laplace")
    return net, X, Y


def _unrealizable_case():
    """Outputs of rank 3 that no ReLU network of these inputs gives: every candidate
    pattern goes to the LPs of Algorithm 1 (bounded by max_patterns)."""
    rng = np.random.default_rng(6)
    X = rng.laplace(size=(60, 5))
    return X, rng.standard_normal((60, 3)) @ rng.standard_normal((3, 4))


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("case", ["planted", "lps"])
def test_enumeration_splits_patterns_across_ranks(ranks, case):
    from relufast.algorithms import bjw19

    if case == "planted":
        net, X, Y = _enumeration_case()
        k, kw = 3, {}
    else:
        (X, Y), k, kw = _unrealizable_case(), 3, {"max_patterns": 40}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        one = bjw19.enumeration(X, Y, k, random_state=0, n_jobs=1, **kw)
        parts = np.array_split(np.arange(len(X)), ranks)
        got = _on_threads(
            ranks,
            lambda comm, r: bjw19.enumeration(X[parts[r]], Y[parts[r]], k, random_state=0, n_jobs=1, comm=comm, **kw),
        )
    if case == "planted":
        assert one.status == "exact" and rf.metrics.parameter_error(one, net).V < EXACT_TOL
    else:
        assert one.status == "failed" and one.counts["lps_solved"] >= 40
    for res in got:
        assert res.status == one.status and res.message == got[0].message
        if one.V is not None:
            np.testing.assert_array_equal(res.V, got[0].V)  # the same bits on every rank
            np.testing.assert_array_equal(res.U, got[0].U)
            err = rf.metrics.parameter_error(res, one.network)
            assert err.U < SAME_TOL and err.V < SAME_TOL
        # The same patterns, LPs and systems as one process: the work is split, not repeated.
        for key in ("patterns_tried", "lps_solved", "linear_systems", "rows_found"):
            assert res.counts[key] == one.counts[key], key
        assert res.counts["ranks"] == ranks


# The stop's warning is ignored for the whole test as well: a CI run reported it from a rank
# thread although the block below ignores it (in Python 3.11 the warnings filters are one
# global list that catch_warnings swaps without a lock).
@pytest.mark.filterwarnings("ignore::relufast.RelufastWarning")
def test_enumeration_ranks_agree_on_the_time_limit():
    # Each rank's clock is its own: a rank past the deadline must stop every rank at the
    # same pattern, or the others would wait in a collective (a deadlock).
    from relufast.algorithms import bjw19

    rng = np.random.default_rng(7)
    X = rng.laplace(size=(400, 5))
    Y = rng.standard_normal((400, 3)) @ rng.standard_normal((3, 4))
    half = np.array_split(np.arange(len(X)), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        got = _on_threads(
            2, lambda comm, r: bjw19.enumeration(X[half[r]], Y[half[r]], 3, time_limit=0.5, n_jobs=1, comm=comm)
        )
    assert got[0].status == got[1].status == "failed"
    assert got[0].diagnostics["stopped_by"] == got[1].diagnostics["stopped_by"] == "time_limit"
    assert got[0].counts == got[1].counts


def test_enumeration_gathers_dask_inputs():
    da = pytest.importorskip("dask.array")
    from relufast.algorithms import bjw19

    _, X, Y = _enumeration_case()
    one = bjw19.enumeration(X, Y, 3, random_state=0)
    res = bjw19.enumeration(da.from_array(X, chunks=(150, 4)), da.from_array(Y, chunks=(100, 3)), 3, random_state=0)
    assert res.status == one.status == "exact"
    err = rf.metrics.parameter_error(res, one.network)
    assert err.U < SAME_TOL and err.V < SAME_TOL


def test_enumeration_refuses_to_gather_too_much(monkeypatch):
    import importlib

    module = importlib.import_module("relufast.algorithms.bjw19.enumeration")
    monkeypatch.setattr(module, "GATHER_LIMIT", 1000)
    _, X, Y = _enumeration_case()
    # FakeComm without values: two ranks of the same 400 rows, 800 samples in all.
    with pytest.raises(ValueError, match=r"needs every sample on every rank.*got n = 800, d = 4, m = 3"):
        module.enumeration(X, Y, 3, comm=FakeComm(0, None))


def test_auto_with_comm_decides_like_one_process():
    # Two ranks (threads), each with its half of the rows: auto must take the decisions and
    # give the result of one process on all rows, the same on both ranks.
    net = rf.planted.two_layer(d=8, k=3, m=5, random_state=1, max_cos=0.7)
    X, Y = net.sample(30000, random_state=2)
    one = _quiet(X, Y, 3, "auto", random_state=0)
    half = np.array_split(np.arange(len(X)), 2)
    with warnings.catch_warnings():  # restores the filters the ranks' own catch_warnings share
        warnings.simplefilter("ignore", rf.RelufastWarning)
        got = _on_threads(2, lambda comm, r: rf.recover(X[half[r]], Y[half[r]], n_hidden=3, random_state=0, comm=comm))
    for res in got:
        assert res.status == one.status == "exact"
        assert res.diagnostics["auto"] == one.diagnostics["auto"]
        facts = dict(res.diagnostics["auto_facts"])
        assert facts.pop("ranks") == 2
        assert facts == one.diagnostics["auto_facts"]
        np.testing.assert_array_equal(res.V, got[0].V)
        err = rf.metrics.parameter_error(res, one.network)
        assert err.U < SAME_TOL and err.V < SAME_TOL


def test_auto_with_dask_matches_numpy():
    da = pytest.importorskip("dask.array")
    net = rf.planted.two_layer(d=8, k=3, m=5, random_state=1, max_cos=0.7)
    X, Y = net.sample(30000, random_state=2)
    one = _quiet(X, Y, 3, "auto", random_state=0)
    res = _quiet(da.from_array(X, chunks=(7000, 8)), da.from_array(Y, chunks=(5000, 5)), 3, "auto", random_state=0)
    assert res.status == one.status == "exact"
    assert res.diagnostics["auto"] == one.diagnostics["auto"]
    assert res.diagnostics["auto_facts"] == one.diagnostics["auto_facts"]
    err = rf.metrics.parameter_error(res, one.network)
    assert err.U < SAME_TOL and err.V < SAME_TOL


def test_auto_with_dask_reaches_the_enumeration():
    # k = 5 > d = 3 with rank(Y) = k: only Thm 1 applies. auto runs the enumeration on a
    # gathered subsample of 200 of the 300 samples and certifies its rows by a reduction.
    da = pytest.importorskip("dask.array")
    rng = np.random.default_rng(3)
    net = rf.network.Network(rng.standard_normal((5, 5)), rng.standard_normal((5, 3)))
    X = rng.laplace(size=(300, 3))
    Y = net.predict(X)
    one = _quiet(X, Y, 5, "auto", random_state=0)
    res = _quiet(da.from_array(X, chunks=(120, 3)), da.from_array(Y, chunks=(100, 5)), 5, "auto", random_state=0)
    assert res.status == one.status == "exact"
    assert [a["method"] for a in res.diagnostics["auto_attempts"]] == ["bjw19-enumeration"]
    assert res.diagnostics["subsample"] == one.diagnostics["subsample"] == 200
    assert rf.metrics.parameter_error(one, net).V < EXACT_TOL
    err = rf.metrics.parameter_error(res, one.network)
    assert err.U < SAME_TOL and err.V < SAME_TOL


def test_auto_with_comm_plans_only_methods_that_take_comm():
    from relufast._auto import _auto_plan
    from relufast.methods import METHODS

    facts = {
        "n": 10**5, "d": 10, "m": 2, "k": 5, "rank_Y": 2, "standard_gaussian": True,
        "biased": False, "symmetry_statistic": 1.0, "time_limit": 60.0,
    }  # fmt: skip
    names = [name for name, _ in _auto_plan(facts, "X looks standard Gaussian", distributed=True)]
    assert names and all(METHODS[name].takes_comm for name in names)
    assert "atv21" in names  # m < k, Gaussian: atv21, which takes comm (reductions, a gathered sample)


def test_comm_without_mpi4py_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py now raises ImportError
    # What was given is wrong whether or not mpi4py is installed: TypeError first, naming the extra.
    with pytest.raises(TypeError, match=r"comm must be None or an mpi4py communicator.*pip install 'relufast\[mpi\]'"):
        check_comm("COMM_WORLD")
    with pytest.raises(TypeError, match="comm must be None or an mpi4py communicator"):
        check_comm(object())


@pytest.mark.parametrize("method", ["bjw19-gaussian", "bjw19-noisy", "atv21"])
def test_ranks_agree_on_a_seed_when_none_is_given(method):
    """random_state=None under comm: every rank draws with rank 0's seed (same bits)."""
    net = rf.planted.two_layer(d=8, k=3, m=5, random_state=1, max_cos=0.7)
    X, Y = net.sample(30000, random_state=2)
    half = [slice(0, 13000), slice(13000, None)]
    r0, r1 = _on_threads(2, lambda comm, r: _quiet(X[half[r]], Y[half[r]], 3, method, comm=comm))
    assert r0.status == r1.status
    assert np.array_equal(r0.U, r1.U) and np.array_equal(r0.V, r1.V)


def test_an_error_on_one_rank_of_the_enumeration_is_raised_on_every_rank(monkeypatch):
    """A failure inside one rank's share of the pattern trials (here an injected one) reaches
    every rank as the same error, instead of leaving the others waiting in a collective."""
    import importlib

    E = importlib.import_module("relufast.algorithms.bjw19.enumeration")  # the module, not the function
    real, where = E._try_pattern, threading.local()

    def flaky(*args):
        if getattr(where, "rank", 0) == 1:
            raise ValueError("injected failure on rank 1")
        return real(*args)

    monkeypatch.setattr(E, "_try_pattern", flaky)
    _, X, Y = _enumeration_case()

    def rank(r, comm):
        where.rank = r
        try:
            _quiet(X[r::2], Y[r::2], 3, "bjw19-enumeration", comm=comm, random_state=0, n_jobs=1)
        except ValueError as exc:
            return str(exc)
        return "no error"

    got, _ = _run_ranks(2, rank)  # a rank left waiting would end in BrokenBarrierError instead
    assert got == ["injected failure on rank 1"] * 2
