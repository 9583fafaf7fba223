"""LP stage: the only module that imports highspy.

An :class:`LPSession` holds one HiGHS model that is built once, gets rows added and
bounds changed, and is re-solved warm (HiGHS keeps its basis). A :class:`QPSession` does
the same for a convex quadratic objective with a sparse (typically diagonal) Hessian and
sparse rows. Every solution is
re-checked against all constraints in double precision. :data:`STATUS_TABLE` is the one
map from HiGHS model statuses to relufast's LP statuses.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from enum import Enum

import highspy
import numpy as np

from .._deadline import capped

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


def _check(status, call):
    """Raise when a HiGHS call returned an error (every call's status is checked)."""
    if status == highspy.HighsStatus.kError:
        raise RuntimeError(f"HiGHS {call} returned an error")


_QUIET: list = []  # [True] once the process's first solver has been created quietly


def _first_solver_quietly():
    """HiGHS prints a banner on the process's standard output (fd 1, from C++) when the
    first solver of the process is created, before any option can turn it off. Create that
    first solver with fd 1 pointed at /dev/null (once per process), so the banner never
    reaches a user's output; every later solver runs with output_flag off."""
    if _QUIET:
        return
    _QUIET.append(True)
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):  # no fd 1 (an embedded interpreter): nothing to hide
        highspy.Highs()
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class _HighsSession:
    """What the LP and QP sessions share: one HiGHS model with bounded columns, a linear
    cost and rows that are added, re-bounded and deleted between warm solves (HiGHS keeps
    its basis), plus a copy of the rows for the double-precision re-check of every point.

    Subclasses choose how that copy is held (:meth:`_as_rows`, :meth:`_stack_rows`): dense
    for :class:`LPSession`, sparse CSR for :class:`QPSession`.
    """

    _check = staticmethod(_check)

    def __init__(
        self,
        n_vars,
        *,
        lower=None,
        upper=None,
        cost=None,
        time_limit=None,
        feasibility_tol=1e-9,
        check_tol=1e-7,
        options=(),
    ):
        self.n_vars = n = int(n_vars)
        _first_solver_quietly()
        self._h = highspy.Highs()
        settings = [
            ("output_flag", False),
            ("primal_feasibility_tolerance", feasibility_tol),
            ("dual_feasibility_tolerance", feasibility_tol),
            *options,
        ]
        time_limit = capped(time_limit)  # never past the method's deadline (relufast._deadline)
        if time_limit is not None:
            settings.append(("time_limit", float(time_limit)))
        for name, value in settings:
            _check(self._h.setOptionValue(name, value), "setOptionValue")
        self._lo = np.full(n, -INF) if lower is None else np.array(lower, dtype=np.float64)
        self._up = np.full(n, INF) if upper is None else np.array(upper, dtype=np.float64)
        _check(self._h.addVars(n, self._lo, self._up), "addVars")
        self._cost = np.zeros(n) if cost is None else np.array(cost, dtype=np.float64)
        if cost is not None:
            _check(self._h.changeColsCost(n, np.arange(n, dtype=np.int32), self._cost), "changeColsCost")
        self._rows = self._as_rows(np.zeros((0, n)))
        self._rlo = np.zeros(0)
        self._rup = np.zeros(0)
        self.check_tol = check_tol
        self.n_solves = 0

    # How the copy of the rows is held (dense here; sparse in QPSession).
    @staticmethod
    def _as_rows(A):
        return np.atleast_2d(np.asarray(A, dtype=np.float64))

    @staticmethod
    def _stack_rows(R, A):
        return np.vstack([R, A])

    @property
    def n_rows(self):
        return self._rows.shape[0]

    def add_rows(self, A, lower, upper):
        """Add rows ``lower <= A x <= upper`` (A of shape (r, n_vars)); returns their indices."""
        import scipy.sparse as sp

        A = self._as_rows(A)
        if A.shape[1] != self.n_vars:
            raise ValueError(f"rows must have {self.n_vars} columns; got shape {A.shape}")
        S = sp.csr_matrix(A)
        S.sort_indices()
        r = A.shape[0]
        lower = np.broadcast_to(np.asarray(lower, dtype=np.float64), (r,)).copy()
        upper = np.broadcast_to(np.asarray(upper, dtype=np.float64), (r,)).copy()
        _check(
            self._h.addRows(r, lower, upper, S.nnz, S.indptr[:-1].astype(np.int32), S.indices.astype(np.int32), S.data),
            "addRows",
        )
        first = self.n_rows
        self._rows = self._stack_rows(self._rows, A)
        self._rlo = np.concatenate([self._rlo, lower])
        self._rup = np.concatenate([self._rup, upper])
        return np.arange(first, first + r)

    def set_row_bounds(self, rows, lower, upper):
        """Change the bounds of one row or several rows at once (re-solved warm)."""
        rows = np.atleast_1d(np.asarray(rows, dtype=np.int32))
        lower = np.broadcast_to(np.asarray(lower, dtype=np.float64), rows.shape).copy()
        upper = np.broadcast_to(np.asarray(upper, dtype=np.float64), rows.shape).copy()
        # changeRowsBounds is bound by highspy but missing from its type stubs.
        _check(self._h.changeRowsBounds(len(rows), rows, lower, upper), "changeRowsBounds")  # type: ignore[attr-defined]
        self._rlo[rows], self._rup[rows] = lower, upper

    def delete_rows(self, rows):
        """Delete rows by index (later rows move up, as in HiGHS)."""
        rows = np.atleast_1d(np.asarray(rows, dtype=np.int32))
        _check(self._h.deleteRows(len(rows), rows), "deleteRows")
        keep = np.ones(self.n_rows, dtype=bool)
        keep[rows] = False
        self._rows, self._rlo, self._rup = self._rows[keep], self._rlo[keep], self._rup[keep]

    def violation(self, x):
        """Largest constraint violation of x, each row relative to max(1, |row| |x|)."""
        row_v = 0.0
        if self.n_rows:
            Ax = self._rows @ x
            scale = np.maximum(1.0, abs(self._rows) @ np.abs(x))
            row_v = float(np.max(np.maximum(np.maximum(self._rlo - Ax, Ax - self._rup), 0.0) / scale))
        col_v = float(np.max(np.maximum(np.maximum(self._lo - x, x - self._up), 0.0) / np.maximum(1.0, np.abs(x))))
        return max(row_v, col_v)

    def objective(self, x):
        return float(self._cost @ x)

    def _run(self):
        """One warm solve: (status, solution or None, violation, objective, seconds, HiGHS
        model status as text); an optimum that violates a row is INACCURATE."""
        t = time.perf_counter()
        run = self._h.run()
        self.n_solves += 1
        ms = self._h.getModelStatus()
        status = STATUS_TABLE.get(ms, LPStatus.ERROR)
        if run == highspy.HighsStatus.kError and status == LPStatus.OPTIMAL:
            status = LPStatus.ERROR
        sol, viol, obj = None, float("nan"), float("nan")
        if status == LPStatus.OPTIMAL:
            sol = self._h.getSolution()
            x = np.array(sol.col_value, dtype=np.float64)
            viol, obj = self.violation(x), self.objective(x)
            if not viol <= self.check_tol:
                status = LPStatus.INACCURATE
        return status, sol, viol, obj, time.perf_counter() - t, self._h.modelStatusToString(ms)


class LPSession(_HighsSession):
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
    options : sequence of (str, value), optional
        Further HiGHS options, set once.
    """

    def solve(self):
        """Solve (warm from the previous basis) and re-check the point."""
        status, sol, viol, obj, seconds, highs_status = self._run()
        return LPResult(
            status=status,
            x=None if sol is None else np.array(sol.col_value, dtype=np.float64),
            objective=obj,
            max_violation=viol,
            iterations=int(self._h.getInfo().simplex_iteration_count),
            seconds=seconds,
            highs_status=highs_status,
        )


# ----------------------------------------------------------------------------------------------
# Convex QP session (added for MR19's generalized LASSO, eq. (47)). Kept as one block.
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QPResult(LPResult):
    """Outcome of one :meth:`QPSession.solve`: an :class:`LPResult` with the row duals.

    ``row_dual`` follows HiGHS's convention: the gradient of the objective equals
    ``A^T row_dual + col_dual`` at an optimum.
    """

    row_dual: np.ndarray | None = None


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


class QPSession(_HighsSession):
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

        super().__init__(
            n_vars,
            lower=lower,
            upper=upper,
            cost=cost,
            time_limit=time_limit,
            feasibility_tol=feasibility_tol,
            check_tol=check_tol,
            options=[("qp_regularization_value", float(regularization))],
        )
        n = self.n_vars
        L = _lower_triangle_csc(hessian, n)
        self._Q = (L + sp.tril(L, k=-1, format="csc").T).tocsr()
        _check(
            # highspy's stub types the format as int; the binding takes the HessianFormat enum.
            self._h.passHessian(  # type: ignore[call-overload]
                n,
                L.nnz,
                highspy.HessianFormat.kTriangular,
                L.indptr.astype(np.int32),
                L.indices.astype(np.int32),
                L.data.astype(np.float64),
            ),
            "passHessian",
        )

    @staticmethod
    def _as_rows(A):
        import scipy.sparse as sp

        return sp.csr_matrix(A, dtype=np.float64)

    @staticmethod
    def _stack_rows(R, A):
        import scipy.sparse as sp

        return sp.vstack([R, A], format="csr")

    def set_regularization(self, value):
        """Change HiGHS's ``qp_regularization_value`` (see the class parameters)."""
        _check(self._h.setOptionValue("qp_regularization_value", float(value)), "setOptionValue")

    def set_cost(self, cols, values):
        """Change the linear cost of some columns."""
        cols = np.atleast_1d(np.asarray(cols, dtype=np.int32))
        values = np.broadcast_to(np.asarray(values, dtype=np.float64), cols.shape).copy()
        _check(self._h.changeColsCost(len(cols), cols, values), "changeColsCost")
        self._cost[cols] = values

    def objective(self, x):
        return float(self._cost @ x + 0.5 * x @ (self._Q @ x))

    def solve(self):
        """Solve (warm after the first solve) and re-check the point."""
        status, sol, viol, obj, seconds, highs_status = self._run()
        info = self._h.getInfo()
        return QPResult(
            status=status,
            x=None if sol is None else np.array(sol.col_value, dtype=np.float64),
            row_dual=None if sol is None else np.array(sol.row_dual, dtype=np.float64),
            objective=obj,
            max_violation=viol,
            iterations=int(info.qp_iteration_count) + max(int(info.simplex_iteration_count), 0),
            seconds=seconds,
            highs_status=highs_status,
        )
