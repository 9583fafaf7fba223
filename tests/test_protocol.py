"""The one method protocol: every registered method takes the common options, a direct call
and a call through ``recover`` give the same result, and ``time_limit`` stops any method."""

import inspect
import threading
import time

import numpy as np
import pytest

import relufast as rf
from relufast import _deadline
from relufast._native import core
from relufast._validation import check_scalar
from relufast.methods import COMMON_OPTIONS, METHODS, run_method

from .conftest import planted


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_has_the_common_options_and_one_protocol(name):
    spec = METHODS[name]
    assert spec.name == name == spec.function.protocol.name
    assert set(COMMON_OPTIONS) <= set(spec.options), name
    assert spec.takes_comm == ("comm" in inspect.signature(spec.function).parameters)
    with pytest.raises(TypeError, match="did you mean 'random_state'"):
        spec.function(None, None, 1, random_stat=0)
    with pytest.raises(ValueError, match="time_limit must be a positive number"):
        spec.function(None, None, 1, time_limit=-1)


def _same(a, b):
    assert a.status == b.status and a.method == b.method
    for x, y in ((a.U, b.U), (a.V, b.V), (a.b, b.b), (a.c, b.c)):
        assert (x is None) == (y is None)
        if x is not None:
            np.testing.assert_array_equal(x, y)
    assert a.residual == b.residual or (np.isnan(a.residual) and np.isnan(b.residual))


def test_direct_call_equals_recover_bias_free():
    net = planted(10, 4, 6, 3)
    X, Y = net.sample(20000, random_state=1)
    from relufast.algorithms import bjw19, gklw19

    for name, function in (("bjw19-gaussian", bjw19.gaussian), ("gklw19", gklw19.recover)):
        via = rf.recover(X, Y, n_hidden=4, method=name, random_state=0)
        direct = function(X, Y, 4, random_state=0)
        assert via.exact, via.message
        _same(via, direct)


def test_direct_call_equals_recover_atv21_with_biases_and_offset():
    from relufast.algorithms import atv21

    net = rf.planted.two_layer(8, 3, 4, random_state=2, bias=0.3, offset=1.0)
    X, Y = net.sample(100000, random_state=3)
    via = rf.recover(X * 2.0 + 1.0, Y, n_hidden=3, method="atv21", random_state=0)  # whitened by the protocol
    direct = atv21.atv21(X * 2.0 + 1.0, Y, 3, random_state=0)
    assert via.exact, via.message
    _same(via, direct)


@pytest.mark.parametrize("name", ["atv21", "bjw19-gaussian", "gklw19", "bjw19-fpt"])
def test_time_limit_stops_any_method(name):
    net = rf.planted.two_layer(30, 12, 20 if name != "bjw19-fpt" else 3, random_state=0)
    X, Y = net.sample(400000, random_state=1)
    t = time.perf_counter()
    with pytest.warns(rf.RelufastWarning, match="stopped by time_limit"):
        res = run_method(name, X, Y, 12, {"time_limit": 0.05, "random_state": 0})
    seconds = time.perf_counter() - t
    assert res.status == "failed" and not res.exact
    assert res.diagnostics["stopped_by"] == "time_limit" and res.diagnostics["time_limit"] == 0.05
    # The protocol's own passes over the samples (units, outputs) come before the deadline
    # stops the method; the method itself stops at its next stage or kernel check.
    assert seconds < 20, seconds


def test_kernel_deadline_stops_a_kernel_and_is_cleared():
    with _deadline.limit(0.2):
        t = time.perf_counter()
        with pytest.raises(TimeoutError):
            core._fault_pipeline(4000, 16, 2, "none", 0, sleep_us=20000, slow_until=4000)
        assert time.perf_counter() - t < 5
        assert _deadline.remaining() is not None
    assert _deadline.remaining() is None
    assert core._fault_pipeline(2000, 64, 2) == 2000 * 1999 / 2  # no deadline left on the thread


def test_deadlines_nest_and_belong_to_their_thread():
    with _deadline.limit(100):
        with _deadline.limit(1000):
            assert _deadline.remaining() <= 100
        seen = []
        thread = threading.Thread(target=lambda: seen.append(_deadline.remaining()))
        thread.start()
        thread.join()
        assert seen == [None]
    with _deadline.limit(1e-6):
        time.sleep(0.01)
        assert _deadline.passed()
        with pytest.raises(_deadline.TimeLimitReached, match="passed in the test"):
            _deadline.check("in the test")


def test_check_scalar_names_what_was_expected_and_got():
    assert check_scalar(3, "tol", kind=float, low=0.0, include_low=False) == 3.0
    assert check_scalar(np.int64(4), "n", kind=int, low=1) == 4
    with pytest.raises(TypeError, match=r"tol must be a number in \(0, inf\); got str '1'"):
        check_scalar("1", "tol", low=0.0, include_low=False)
    with pytest.raises(TypeError, match="got bool"):
        check_scalar(True, "tol")
    with pytest.raises(ValueError, match=r"eps must be a number in \(0, 1\); got 1.0"):
        check_scalar(1.0, "eps", low=0.0, high=1.0, include_low=False, include_high=False)
    with pytest.raises(ValueError, match="got nan"):
        check_scalar(float("nan"), "tol")
    with pytest.raises(TypeError, match="must be an integer"):
        check_scalar(2.5, "n", kind=int)


@pytest.mark.parametrize("name", ["atv21", "bjw19-gaussian"])
def test_time_limit_under_comm_stops_every_rank_together(name):
    """Each rank's deadline passes at its own time; the ranks agree at every check, so none
    is left waiting in a collective (the run would hang otherwise) and all return the same."""
    from .threadcomm import run_ranks

    net = rf.planted.two_layer(20, 8, 10, random_state=0)
    X, Y = net.sample(200000, random_state=1)
    parts = np.array_split(np.arange(len(X)), 2)

    def rank(r, comm):
        limit = 0.05 if r == 0 else 30.0  # rank 1 alone would not stop
        return run_method(name, X[parts[r]], Y[parts[r]], 8, {"time_limit": limit, "comm": comm})

    with pytest.warns(rf.RelufastWarning, match="stopped by time_limit"):
        out, _ = run_ranks(2, rank)
    assert [res.status for res in out] == ["failed", "failed"]
    assert all(res.diagnostics["stopped_by"] == "time_limit" for res in out)


def test_mr19_is_named_as_the_exception():
    with pytest.raises(ValueError, match="call relufast.algorithms.mr19 directly"):
        rf.recover(np.zeros((10, 2)), np.zeros((10, 1)), n_hidden=1, method="mr19")
