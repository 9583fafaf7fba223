"""LP stage: the only module that imports highspy.

An :class:`LPSession` holds one HiGHS model that is built once, gets rows added and
bounds changed, and is re-solved warm (HiGHS keeps its basis). A :class:`QPSession` does
the same for a convex quadratic objective with a sparse (typically diagonal) Hessian and
sparse rows. Every solution is
re-checked against all constraints in double precision. :data:`STATUS_TABLE` is the one
map from HiGHS model statuses to relufast's LP statuses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum

import highspy
import numpy as np

__all__ = ["LPStatus", "LPResult", "LPSession", "QPResult", "QPSession", "STATUS_TABLE", "INF"]

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

    def __init__(
        self, n_vars, *, lower=None, upper=None, cost=None, time_limit=None, feasibility_tol=1e-9, check_tol=1e-7
    ):
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
            self._check(
                self._h.changeColsCost(self.n_vars, np.arange(self.n_vars, dtype=np.int32), c), "changeColsCost"
            )
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
        self._check(
            self._h.addRows(r, lower, upper, len(rows), starts, cols.astype(np.int32), A[rows, cols]), "addRows"
        )
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
        return LPResult(
            status=status,
            x=x,
            objective=obj,
            max_violation=viol,
            iterations=int(info.simplex_iteration_count),
            seconds=time.perf_counter() - t,
            highs_status=self._h.modelStatusToString(ms),
        )


# ----------------------------------------------------------------------------------------------
# Convex QP session (added for MR19's generalized LASSO, eq. (47)). Kept as one block.
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QPResult:
    """Outcome of one :meth:`QPSession.solve`.

    ``row_dual`` follows HiGHS's convention: the gradient of the objective equals
    ``A^T row_dual + col_dual`` at an optimum.
    """

    status: LPStatus
    x: np.ndarray | None
    row_dual: np.ndarray | None
    objective: float
    max_violation: float
    iterations: int
    seconds: float
    highs_status: str

    @property
    def feasible(self):
        return self.status == LPStatus.OPTIMAL


def _lower_triangle_csc(hessian, n):
    """HiGHS's triangular Hessian format (lower triangle, column-wise) from a 1-D diagonal
    or a symmetric (sparse or dense) matrix."""
    import scipy.sparse as sp

    if np.ndim(hessian) == 1:
        diag = np.asarray(hessian, dtype=np.float64)
        if diag.shape != (n,):
            raise ValueError(f"a diagonal Hessian must have {n} entries; got shape {diag.shape}")
        Q = sp.diags(diag, format="csc")
    else:
        Q = sp.csc_matrix(hessian, dtype=np.float64)
        if Q.shape != (n, n):
            raise ValueError(f"the Hessian must have shape ({n}, {n}); got {Q.shape}")
        if abs(Q - Q.T).max() > 0:
            raise ValueError("the Hessian must be symmetric")
    L = sp.tril(Q, format="csc")
    L.eliminate_zeros()
    L.sort_indices()
    return L


class QPSession:
    """A HiGHS convex QP, ``min cost^T x + 1/2 x^T Q x`` s.t. ``row_lo <= A x <= row_up`` and
    ``lower <= x <= upper``, built once and re-solved warm after bound changes.

    Rows are kept sparse (unlike :class:`LPSession`), so models with tens of thousands of
    columns are cheap to hold. Statuses go through the one :data:`STATUS_TABLE`.

    Parameters
    ----------
    n_vars : int
    hessian : array-like of shape (n_vars,) or (n_vars, n_vars), or scipy sparse matrix
        Q: a 1-D array is its diagonal. Must be positive semidefinite (HiGHS's QP solver
        handles convex problems only; it reports an error otherwise).
    lower, upper, cost : array-like of shape (n_vars,), optional
        Variable bounds (default free) and linear cost (default 0).
    time_limit : float, optional
    feasibility_tol : float, default=1e-9
        HiGHS primal and dual feasibility tolerance.
    check_tol : float, default=1e-7
        Largest violation accepted by the re-check, relative to each row's scale.
    regularization : float, default=1e-7
        HiGHS's ``qp_regularization_value`` (its default). HiGHS adds it to the Hessian's
        diagonal, which perturbs the optimum by about this much; 0 gives the exact optimum of
        a piecewise-quadratic problem (e.g. the generalized LASSO: gradient residual 1e-14
        instead of 1e-7 at d = 2000).
    """

    def __init__(
        self,
        n_vars,
        *,
        hessian,
        lower=None,
        upper=None,
        cost=None,
        time_limit=None,
        feasibility_tol=1e-9,
        check_tol=1e-7,
        regularization=1e-7,
    ):
        import scipy.sparse as sp

        self.n_vars = int(n_vars)
        self._h = highspy.Highs()
        chk = LPSession._check
        chk(self._h.setOptionValue("output_flag", False), "setOptionValue")
        chk(self._h.setOptionValue("primal_feasibility_tolerance", feasibility_tol), "setOptionValue")
        chk(self._h.setOptionValue("dual_feasibility_tolerance", feasibility_tol), "setOptionValue")
        chk(self._h.setOptionValue("qp_regularization_value", float(regularization)), "setOptionValue")
        if time_limit is not None:
            chk(self._h.setOptionValue("time_limit", float(time_limit)), "setOptionValue")
        n = self.n_vars
        self._lo = np.full(n, -INF) if lower is None else np.array(lower, dtype=np.float64)
        self._up = np.full(n, INF) if upper is None else np.array(upper, dtype=np.float64)
        self._cost = np.zeros(n) if cost is None else np.array(cost, dtype=np.float64)
        chk(self._h.addVars(n, self._lo, self._up), "addVars")
        chk(self._h.changeColsCost(n, np.arange(n, dtype=np.int32), self._cost), "changeColsCost")
        L = _lower_triangle_csc(hessian, n)
        self._Q = (L + sp.tril(L, k=-1, format="csc").T).tocsr()
        chk(
            self._h.passHessian(
                n,
                L.nnz,
                highspy.HessianFormat.kTriangular,
                L.indptr.astype(np.int32),
                L.indices.astype(np.int32),
                L.data.astype(np.float64),
            ),
            "passHessian",
        )
        self._rows = sp.csr_matrix((0, n))
        self._rlo = np.zeros(0)
        self._rup = np.zeros(0)
        self.check_tol = check_tol
        self.n_solves = 0

    @property
    def n_rows(self):
        return self._rows.shape[0]

    def add_rows(self, A, lower, upper):
        """Add rows ``lower <= A x <= upper`` (A dense or scipy sparse, shape (r, n_vars))."""
        import scipy.sparse as sp

        A = sp.csr_matrix(A, dtype=np.float64)
        if A.shape[1] != self.n_vars:
            raise ValueError(f"rows must have {self.n_vars} columns; got shape {A.shape}")
        A.sort_indices()
        r = A.shape[0]
        lower = np.broadcast_to(np.asarray(lower, dtype=np.float64), (r,)).copy()
        upper = np.broadcast_to(np.asarray(upper, dtype=np.float64), (r,)).copy()
        LPSession._check(
            self._h.addRows(r, lower, upper, A.nnz, A.indptr[:-1].astype(np.int32), A.indices.astype(np.int32), A.data),
            "addRows",
        )
        first = self.n_rows
        self._rows = sp.vstack([self._rows, A], format="csr")
        self._rlo = np.concatenate([self._rlo, lower])
        self._rup = np.concatenate([self._rup, upper])
        return np.arange(first, first + r)

    def set_row_bounds(self, rows, lower, upper):
        """Change the bounds of several rows at once (the model is re-solved warm)."""
        rows = np.atleast_1d(np.asarray(rows, dtype=np.int32))
        lower = np.broadcast_to(np.asarray(lower, dtype=np.float64), rows.shape).copy()
        upper = np.broadcast_to(np.asarray(upper, dtype=np.float64), rows.shape).copy()
        LPSession._check(self._h.changeRowsBounds(len(rows), rows, lower, upper), "changeRowsBounds")
        self._rlo[rows], self._rup[rows] = lower, upper

    def set_regularization(self, value):
        """Change HiGHS's ``qp_regularization_value`` (see the class parameters)."""
        LPSession._check(self._h.setOptionValue("qp_regularization_value", float(value)), "setOptionValue")

    def set_cost(self, cols, values):
        """Change the linear cost of some columns."""
        cols = np.atleast_1d(np.asarray(cols, dtype=np.int32))
        values = np.broadcast_to(np.asarray(values, dtype=np.float64), cols.shape).copy()
        LPSession._check(self._h.changeColsCost(len(cols), cols, values), "changeColsCost")
        self._cost[cols] = values

    def objective(self, x):
        return float(self._cost @ x + 0.5 * x @ (self._Q @ x))

    def violation(self, x):
        """Largest constraint violation of x, each row relative to max(1, |row| |x|)."""
        row_v = 0.0
        if self.n_rows:
            Ax = self._rows @ x
            scale = np.maximum(1.0, abs(self._rows) @ np.abs(x))
            row_v = float(np.max(np.maximum(np.maximum(self._rlo - Ax, Ax - self._rup), 0.0) / scale))
        col_v = float(np.max(np.maximum(np.maximum(self._lo - x, x - self._up), 0.0) / np.maximum(1.0, np.abs(x))))
        return max(row_v, col_v)

    def solve(self):
        """Solve (warm after the first solve) and re-check the point."""
        t = time.perf_counter()
        run = self._h.run()
        self.n_solves += 1
        ms = self._h.getModelStatus()
        status = STATUS_TABLE.get(ms, LPStatus.ERROR)
        if run == highspy.HighsStatus.kError and status == LPStatus.OPTIMAL:
            status = LPStatus.ERROR
        x = dual = None
        viol = obj = float("nan")
        if status == LPStatus.OPTIMAL:
            sol = self._h.getSolution()
            x = np.array(sol.col_value, dtype=np.float64)
            dual = np.array(sol.row_dual, dtype=np.float64)
            viol = self.violation(x)
            obj = self.objective(x)
            if not viol <= self.check_tol:
                status = LPStatus.INACCURATE
        info = self._h.getInfo()
        iters = int(info.qp_iteration_count) + max(int(info.simplex_iteration_count), 0)
        return QPResult(
            status=status,
            x=x,
            row_dual=dual,
            objective=obj,
            max_violation=viol,
            iterations=iters,
            seconds=time.perf_counter() - t,
            highs_status=self._h.modelStatusToString(ms),
        )
