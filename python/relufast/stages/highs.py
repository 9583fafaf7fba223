"""LP stage: the only module that imports highspy.

An :class:`LPSession` holds one HiGHS model that is built once, gets rows added and
bounds changed, and is re-solved warm (HiGHS keeps its basis). Every solution is
re-checked against all constraints in double precision. :data:`STATUS_TABLE` is the one
map from HiGHS model statuses to relufast's LP statuses.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum

import highspy
import numpy as np

__all__ = ["LPStatus", "LPResult", "LPSession", "STATUS_TABLE", "INF"]

INF = highspy.kHighsInf


class LPStatus(str, Enum):
    OPTIMAL = "optimal"
    INFEASIBLE = "infeasible"
    UNBOUNDED = "unbounded"
    INFEASIBLE_OR_UNBOUNDED = "infeasible_or_unbounded"
    TIME_LIMIT = "time_limit"
    ITERATION_LIMIT = "iteration_limit"
    INACCURATE = "inaccurate"  #: HiGHS said optimal but the point violates a constraint
    ERROR = "error"

    def __str__(self):
        return self.value


_M = highspy.HighsModelStatus
#: HiGHS model status -> relufast LP status (anything not listed is ERROR).
STATUS_TABLE = {
    _M.kOptimal: LPStatus.OPTIMAL,
    _M.kInfeasible: LPStatus.INFEASIBLE,
    _M.kUnbounded: LPStatus.UNBOUNDED,
    _M.kUnboundedOrInfeasible: LPStatus.INFEASIBLE_OR_UNBOUNDED,
    _M.kTimeLimit: LPStatus.TIME_LIMIT,
    _M.kIterationLimit: LPStatus.ITERATION_LIMIT,
    _M.kModelEmpty: LPStatus.OPTIMAL,
}


@dataclass(frozen=True)
class LPResult:
    status: LPStatus
    x: np.ndarray | None
    objective: float
    max_violation: float
    iterations: int
    seconds: float
    highs_status: str

    @property
    def feasible(self):
        return self.status == LPStatus.OPTIMAL


class LPSession:
    """A HiGHS LP built once and re-solved warm.

    Parameters
    ----------
    n_vars : int
    lower, upper : array-like of shape (n_vars,), optional
        Variable bounds (default free).
    cost : array-like of shape (n_vars,), optional
        Minimised objective (default 0: a feasibility problem).
    time_limit : float, optional
        Seconds per solve.
    feasibility_tol : float, default=1e-9
        HiGHS primal feasibility tolerance.
    check_tol : float, default=1e-7
        Largest violation accepted by the re-check, relative to the row's scale.
    """

    def __init__(self, n_vars, *, lower=None, upper=None, cost=None, time_limit=None,
                 feasibility_tol=1e-9, check_tol=1e-7):
        self.n_vars = int(n_vars)
        self._h = highspy.Highs()
        self._check(self._h.setOptionValue("output_flag", False), "setOptionValue")
        self._check(self._h.setOptionValue("primal_feasibility_tolerance", feasibility_tol), "setOptionValue")
        self._check(self._h.setOptionValue("dual_feasibility_tolerance", feasibility_tol), "setOptionValue")
        if time_limit is not None:
            self._check(self._h.setOptionValue("time_limit", float(time_limit)), "setOptionValue")
        lo = np.full(self.n_vars, -INF) if lower is None else np.asarray(lower, dtype=np.float64)
        up = np.full(self.n_vars, INF) if upper is None else np.asarray(upper, dtype=np.float64)
        self._lo, self._up = lo.copy(), up.copy()
        self._check(self._h.addVars(self.n_vars, lo, up), "addVars")
        if cost is not None:
            c = np.asarray(cost, dtype=np.float64)
            self._check(self._h.changeColsCost(self.n_vars, np.arange(self.n_vars, dtype=np.int32), c),
                        "changeColsCost")
        self._rows = np.zeros((0, self.n_vars))
        self._rlo = np.zeros(0)
        self._rup = np.zeros(0)
        self._cost = np.zeros(self.n_vars) if cost is None else np.asarray(cost, dtype=np.float64)
        self.check_tol = check_tol
        self.n_solves = 0

    @staticmethod
    def _check(status, call):
        if status == highspy.HighsStatus.kError:
            raise RuntimeError(f"HiGHS {call} returned an error")

    @property
    def n_rows(self):
        return self._rows.shape[0]

    def add_rows(self, A, lower, upper):
        """Add rows ``lower <= A x <= upper`` (A dense, shape (r, n_vars)); returns their indices."""
        A = np.atleast_2d(np.asarray(A, dtype=np.float64))
        if A.shape[1] != self.n_vars:
            raise ValueError(f"rows must have {self.n_vars} columns; got shape {A.shape}")
        r = A.shape[0]
        lower = np.broadcast_to(np.asarray(lower, dtype=np.float64), (r,)).copy()
        upper = np.broadcast_to(np.asarray(upper, dtype=np.float64), (r,)).copy()
        rows, cols = np.nonzero(A)
        starts = np.searchsorted(rows, np.arange(r)).astype(np.int32)
        self._check(self._h.addRows(r, lower, upper, len(rows), starts, cols.astype(np.int32),
                                    A[rows, cols]), "addRows")
        first = self.n_rows
        self._rows = np.vstack([self._rows, A])
        self._rlo = np.concatenate([self._rlo, lower])
        self._rup = np.concatenate([self._rup, upper])
        return np.arange(first, first + r)

    def set_row_bounds(self, row, lower, upper):
        self._check(self._h.changeRowBounds(int(row), float(lower), float(upper)), "changeRowBounds")
        self._rlo[row], self._rup[row] = lower, upper

    def delete_rows(self, rows):
        rows = np.atleast_1d(np.asarray(rows, dtype=np.int32))
        self._check(self._h.deleteRows(len(rows), rows), "deleteRows")
        keep = np.ones(self.n_rows, dtype=bool)
        keep[rows] = False
        self._rows, self._rlo, self._rup = self._rows[keep], self._rlo[keep], self._rup[keep]

    def violation(self, x):
        """Largest constraint violation of x, each row relative to max(1, |row| |x|)."""
        if self.n_rows == 0:
            row_v = 0.0
        else:
            Ax = self._rows @ x
            scale = np.maximum(1.0, np.abs(self._rows) @ np.abs(x))
            row_v = float(np.max(np.maximum(np.maximum(self._rlo - Ax, Ax - self._rup), 0.0) / scale))
        col_v = float(np.max(np.maximum(np.maximum(self._lo - x, x - self._up), 0.0) / np.maximum(1.0, np.abs(x))))
        return max(row_v, col_v)

    def solve(self):
        """Solve (warm from the previous basis) and re-check the point."""
        t = time.perf_counter()
        run = self._h.run()
        self.n_solves += 1
        ms = self._h.getModelStatus()
        status = STATUS_TABLE.get(ms, LPStatus.ERROR)
        if run == highspy.HighsStatus.kError and status == LPStatus.OPTIMAL:
            status = LPStatus.ERROR
        x, viol, obj = None, float("nan"), float("nan")
        if status == LPStatus.OPTIMAL:
            x = np.array(self._h.getSolution().col_value, dtype=np.float64)
            viol = self.violation(x)
            obj = float(self._cost @ x)
            if not viol <= self.check_tol:
                status = LPStatus.INACCURATE
        info = self._h.getInfo()
        return LPResult(status=status, x=x, objective=obj, max_violation=viol,
                        iterations=int(info.simplex_iteration_count), seconds=time.perf_counter() - t,
                        highs_status=self._h.modelStatusToString(ms))
