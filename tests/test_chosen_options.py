"""Options of ``extract`` in the chosen mode: honoured (time_limit, progress, batch_size, n_jobs) or
refused with a message naming them (n_queries, method; an invalid n_jobs); time_limit in the random mode."""

import time
import warnings

import numpy as np
import pytest

import relufast as rf
from relufast.planted import deep_relu, relu_function


@pytest.fixture(scope="module")
def deep():
    hidden, out = deep_relu(10, (6, 4), 3, random_state=8)
    return relu_function(hidden, out)


class Recorder:
    """A model that remembers the size of every call."""

    def __init__(self, f):
        self.f, self.sizes = f, []

    def __call__(self, X):
        self.sizes.append(len(X))
        return self.f(X)


def test_time_limit_stops_a_chosen_run_with_its_reason(deep):
    full = rf.extract(deep, 10, (6, 4), random_state=0)
    assert full.status == "exact"
    slow = lambda X: (time.sleep(0.01), deep(X))[1]  # noqa: E731 - 10 ms a call
    with pytest.warns(UserWarning, match="time_limit"):
        res = rf.extract(slow, 10, (6, 4), random_state=0, time_limit=0.2)
    assert res.status == "failed" and res.diagnostics["stopped_by"] == "time_limit"
    assert "time_limit of 0.2 s passed" in res.message and "larger time_limit" in res.message
    assert 0 < res.counts["queries"] < full.counts["queries"]


def test_queries_by_stage_account_for_the_run(deep):
    """``diagnostics["queries_by_stage"]`` charges the run's queries to the stages of
    ``seconds``, each stage's own."""
    res = rf.extract(deep, 10, (6, 4), random_state=0)
    by = res.diagnostics["queries_by_stage"]
    assert res.status == "exact"
    assert set(by) <= set(res.seconds) and {"first_layer", "layer_2", "certificate"} <= set(by)
    assert all(v >= 0 for v in by.values()) and by["first_layer"] > 0 and by["layer_2"] > 0
    assert by["certificate"] == res.diagnostics["certificate_queries"]
    assert (
        sum(by.values()) <= res.counts["queries"] <= sum(by.values()) + 8
    )  # queries outside every stage (none in this run)


def test_budget_spent_is_named_in_the_diagnostics(deep):
    with pytest.warns(UserWarning, match="max_queries=500 spent"):
        res = rf.extract(deep, 10, (6, 4), random_state=0, max_queries=500)
    assert res.status == "failed" and res.diagnostics["stopped_by"] == "max_queries"
    assert res.counts["queries"] <= 500


def test_a_numerical_breakdown_is_a_failed_result(deep, monkeypatch):
    """A LinAlgError inside a stage ends the run as ``failed``, with the stage named, not as
    an exception (as the passive methods do)."""
    from relufast.chosen import deep as deep_mod

    def breaks(*a, **k):
        raise np.linalg.LinAlgError("SVD did not converge")

    monkeypatch.setattr(deep_mod, "_chained", breaks)
    monkeypatch.setattr(deep_mod, "_gathered", breaks)
    with pytest.warns(UserWarning, match="numerical breakdown in stage layer 2"):
        res = rf.extract(deep, 10, (6, 4), random_state=0)
    assert res.status == "failed" and res.diagnostics["stopped_by"] == "numerical breakdown"
    assert "SVD did not converge" in res.message and res.counts["queries"] > 0


def test_progress_reports_stages_on_stderr(deep, capsys):
    res = rf.extract(deep, 10, (6, 4), random_state=0, progress=True)
    err = capsys.readouterr().err
    assert res.status == "exact"
    assert "relufast.extract (chosen)" in err and "first layer" in err
    assert f"done: {res.counts['queries']:,} queries" in err and err.endswith("\n")
    rf.extract(deep, 10, (6, 4), random_state=0, progress=False)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("batch_size", [7, 1000])
def test_batch_size_bounds_every_call(deep, batch_size):
    model = Recorder(deep)
    res = rf.extract(model, 10, (6, 4), random_state=0, batch_size=batch_size)
    assert res.status == "exact" and max(model.sizes) <= batch_size
    assert res.counts["calls"] == len(model.sizes) and res.counts["queries"] == sum(model.sizes)


@pytest.mark.parametrize(
    "option, named",
    [
        (dict(n_queries=5000), "n_queries=5000"),
        (dict(method="atv21"), "method='atv21'"),
        (dict(n_jobs=0), "n_jobs must be None, -1 or a positive integer; got 0"),
        (dict(batch_size=0), "batch_size"),
        (dict(time_limit=-1), "time_limit"),
    ],
)
def test_options_chosen_queries_cannot_honour_are_refused(deep, option, named):
    model = Recorder(deep)
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        rf.extract(model, 10, (6, 4), **option)
    assert model.sizes == []  # refused before any query


def test_time_limit_stops_random_queries():
    net = rf.planted.two_layer(10, 6, 4, bias=0.5, random_state=0)

    def slow(X):
        time.sleep(0.05)
        return net.predict(X)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = rf.extract(slow, 10, 6, queries="random", n_queries=4000, batch_size=1000, time_limit=0.12)
    assert res.status == "failed" and res.diagnostics["stopped_by"] == "time_limit"
    assert "time_limit passed" in res.message and res.counts["queries"] < 4000


@pytest.mark.parametrize("width,found,searches", [(64, 0, 3), (64, 40, 3), (64, 63, 10), (8, 6, 3), (8, 7, 10)])
@pytest.mark.parametrize("low", [False, True])
def test_searches_past_three_only_for_the_last_units(monkeypatch, width, found, searches, low):
    """A layer gets up to LAYER_TRIES_LAST searches at any precision, but only while 90% of
    its units (or all but one) are found: a hopeless layer ends after LAYER_TRIES. (A
    trained float64 10-16-8-8-1 found its last third-layer unit, active on 0.5% of inputs
    at scale 3, in its ninth search.)"""
    import types

    import numpy as np

    from relufast._result import Run
    from relufast.chosen import driver

    calls = []

    def no_layer(oracle, known, tent, k, widths, rng, pool, *, carry, **kw):
        calls.append(1)
        carry["Theta"] = np.zeros((found, 3))
        return None

    monkeypatch.setattr(driver, "next_layer", no_layer)
    monkeypatch.setattr(driver, "residual_lines", lambda *a: 0)
    monkeypatch.setattr(driver, "from_outputs", lambda *a: a[3])  # no row from the outputs
    monkeypatch.setattr(driver, "measure_again", lambda *a: 0)
    tent = (np.eye(4), np.zeros(4))
    oracle = types.SimpleNamespace(low_precision=low)
    settled, tries = np.ones(4, dtype=bool), driver.LAYER_TRIES_LAST
    args = (oracle, [], tent, settled, 1, (4, width), np.random.default_rng(0), None, Run("chosen"), {}, tries)
    assert driver._peel(*args) is None
    assert len(calls) == searches


@pytest.mark.parametrize("low", [False, True])
def test_residual_lines_between_searches_of_the_last_layer_only(monkeypatch, low):
    """At any precision, with 90% of the last hidden layer found, the residual lines run
    between its searches (not after the last one)."""
    import types

    import numpy as np

    from relufast._result import Run
    from relufast.chosen import driver

    def no_layer(oracle, known, tent, k, widths, rng, pool, *, carry, **kw):
        carry["Theta"] = np.zeros((63, 3))
        return None

    lines, asked = [], []
    monkeypatch.setattr(driver, "next_layer", no_layer)
    monkeypatch.setattr(driver, "measure_again", lambda *a: 0)
    monkeypatch.setattr(driver, "from_outputs", lambda *a: asked.append(1) or a[3])  # no row from the outputs
    monkeypatch.setattr(driver, "residual_lines", lambda *a: lines.append(1) or 32)
    oracle = types.SimpleNamespace(low_precision=low)
    tent = (np.eye(4), np.zeros(4))
    diag: dict = {}
    settled, tries = np.ones(4, dtype=bool), driver.LAYER_TRIES_LAST
    assert (
        driver._peel(oracle, [], tent, settled, 1, (4, 64), np.random.default_rng(0), None, Run("chosen"), diag, tries)
        is None
    )
    assert len(lines) == tries - 1 and diag["residual_lines"] == 32 * len(lines)
    assert len(asked) == (len(lines) if low else 0)  # at low precision the outputs first, each time
    lines.clear(), asked.clear()  # a layer before the last: none
    assert (
        driver._peel(oracle, [], tent, settled, 1, (4, 64, 8), np.random.default_rng(0), None, Run("chosen"), {}, tries)
        is None
    )
    assert not lines and not asked


def test_chains_cut_short_only_where_residual_lines_follow(monkeypatch):
    """A search of the last hidden layer, save its last, is told ``nearly`` (90% or all but
    one of the units); a layer before the last never is. Given it, ``next_layer`` runs
    NEARLY_CHAIN_ROUNDS rounds of chains once the single kinks found that many units (a
    trained float32 784-64-64-10 had spent 149 s of 236 on 40 rounds of chains that found
    nothing, before residual lines gave its last unit), and every round otherwise."""
    import types

    import numpy as np

    from relufast._result import Run
    from relufast.chosen import deep, driver

    told = []

    def no_layer(oracle, known, tent, k, widths, rng, pool, *, carry, nearly=None, **kw):
        told.append(nearly)
        carry["Theta"] = np.zeros((63, 3))
        return None

    monkeypatch.setattr(driver, "next_layer", no_layer)
    monkeypatch.setattr(driver, "measure_again", lambda *a: 0)
    monkeypatch.setattr(driver, "residual_lines", lambda *a: 0)
    monkeypatch.setattr(driver, "from_outputs", lambda *a: a[3])  # no row from the outputs
    oracle = types.SimpleNamespace(low_precision=True)
    tent, settled, tries = (np.eye(4), np.zeros(4)), np.ones(4, dtype=bool), driver.LAYER_TRIES_LAST
    assert (
        driver._peel(oracle, [], tent, settled, 1, (4, 64), np.random.default_rng(0), None, Run("chosen"), {}, tries)
        is None
    )
    assert told == [64 * driver.LAST_UNITS] * (tries - 1) + [None]
    told.clear()
    assert (
        driver._peel(oracle, [], tent, settled, 1, (4, 64, 8), np.random.default_rng(0), None, Run("chosen"), {}, tries)
        is None
    )
    assert told and all(t is None for t in told)

    rounds = []
    for have, nearly, want in [(63, 57.6, deep.NEARLY_CHAIN_ROUNDS), (50, 57.6, 40), (63, None, 40)]:
        monkeypatch.setattr(deep, "_gathered", lambda *a, have=have: np.zeros((have, 4 + 3 + 1)))
        monkeypatch.setattr(deep, "_chained", lambda *a: rounds.append(a[10]) or a[7])
        oracle = types.SimpleNamespace(low_precision=True, eps=1e-7, d=4)  # d <= COARSE_DIMS
        got = deep.next_layer(
            oracle, [], (np.eye(3, 4), np.zeros(3)), 64, (3, 64), None, None, oriented=True, nearly=nearly
        )
        assert got is None and rounds[-1] == want
