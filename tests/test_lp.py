import highspy
import numpy as np
import pytest

from relufast.stages.highs import INF, STATUS_TABLE, LPSession, LPStatus


def test_optimal_and_warm_resolve_after_changes():
    s = LPSession(2, cost=[1.0, 1.0])
    s.add_rows([[1.0, 1.0], [1.0, -1.0]], [1.0, -INF], [INF, 3.0])
    r = s.solve()
    assert r.status == LPStatus.OPTIMAL and r.feasible and abs(r.objective - 1.0) < 1e-12
    assert r.max_violation <= 1e-12
    s.set_row_bounds(0, 5.0, INF)
    s.add_rows([[1.0, 0.0]], -INF, -100.0)
    r = s.solve()
    assert r.feasible and abs(r.objective - 5.0) < 1e-9 and r.x[0] <= -100.0 + 1e-9
    assert s.n_solves == 2 and s.n_rows == 3


def test_infeasible():
    s = LPSession(2)
    s.add_rows([[1.0, 1.0], [1.0, 1.0]], [2.0, -INF], [INF, 1.0])
    r = s.solve()
    assert r.status == LPStatus.INFEASIBLE and r.x is None and not r.feasible


def test_unbounded():
    s = LPSession(2, cost=[1.0, 0.0])
    s.add_rows([[1.0, 1.0]], [1.0], [INF])
    r = s.solve()
    assert r.status in (LPStatus.UNBOUNDED, LPStatus.INFEASIBLE_OR_UNBOUNDED)
    assert not r.feasible


def test_time_limit():
    rng = np.random.default_rng(0)
    n = 400
    s = LPSession(n, lower=-np.ones(n), upper=np.ones(n), cost=rng.standard_normal(n), time_limit=1e-9)
    s.add_rows(rng.standard_normal((2 * n, n)), -INF, 1.0)
    r = s.solve()
    assert r.status == LPStatus.TIME_LIMIT and not r.feasible


def test_status_table_covers_the_outcomes_we_rely_on():
    M = highspy.HighsModelStatus
    assert STATUS_TABLE[M.kOptimal] is LPStatus.OPTIMAL
    assert STATUS_TABLE[M.kInfeasible] is LPStatus.INFEASIBLE
    assert STATUS_TABLE[M.kUnbounded] is LPStatus.UNBOUNDED
    assert STATUS_TABLE[M.kTimeLimit] is LPStatus.TIME_LIMIT
    assert STATUS_TABLE[M.kIterationLimit] is LPStatus.ITERATION_LIMIT


def test_violation_recheck():
    s = LPSession(1)
    s.add_rows([[1.0]], 1.0, 2.0)
    assert s.violation(np.array([1.5])) == 0.0
    assert s.violation(np.array([3.0])) == pytest.approx(1.0 / 3.0)


def test_row_shape_check():
    with pytest.raises(ValueError, match="rows must have 3 columns"):
        LPSession(3).add_rows([[1.0, 2.0]], 0.0, 1.0)
