"""The convex QP session of the HiGHS stage (added for MR19's generalized LASSO)."""

import numpy as np
import pytest
import scipy.sparse as sp

from relufast.stages.highs import INF, LPStatus, QPSession

#: A small QP solved exactly (regularization 0): rounding only.
QP_TOL = 1e-9


def test_diagonal_qp_known_optimum_and_warm_changes():
    # min 1/2 (x0^2 + x1^2) - x0 - x1  s.t. x0 + x1 <= 1  ->  x = (1/2, 1/2), dual -1/2
    s = QPSession(2, hessian=[1.0, 1.0], cost=[-1.0, -1.0], regularization=0.0)
    s.add_rows([[1.0, 1.0]], -INF, 1.0)
    r = s.solve()
    assert r.status == LPStatus.OPTIMAL and r.feasible
    np.testing.assert_allclose(r.x, [0.5, 0.5], atol=QP_TOL)
    assert r.objective == pytest.approx(-0.75, abs=QP_TOL)
    assert abs(abs(r.row_dual[0]) - 0.5) <= QP_TOL
    s.set_row_bounds([0], -INF, 4.0)  # constraint inactive: x = (1, 1)
    np.testing.assert_allclose(s.solve().x, [1.0, 1.0], atol=QP_TOL)
    s.set_cost([1], [-3.0])  # x1 = 3 unconstrained, but x0 + x1 <= 4 binds: x = (1, 3)
    np.testing.assert_allclose(s.solve().x, [1.0, 3.0], atol=QP_TOL)
    assert s.n_solves == 3


def test_sparse_hessian_matches_closed_form():
    rng = np.random.default_rng(0)
    B = rng.standard_normal((6, 4))
    Q = B.T @ B + np.eye(4)
    g = rng.standard_normal(4)
    s = QPSession(4, hessian=sp.csr_matrix(Q), cost=g, regularization=0.0)
    r = s.solve()
    np.testing.assert_allclose(r.x, -np.linalg.solve(Q, g), atol=QP_TOL)


def test_infeasible_and_bad_hessian():
    s = QPSession(1, hessian=[1.0])
    s.add_rows([[1.0], [1.0]], [2.0, -INF], [INF, 1.0])
    r = s.solve()
    assert r.status == LPStatus.INFEASIBLE and r.x is None and not r.feasible
    with pytest.raises(ValueError, match="symmetric"):
        QPSession(2, hessian=np.array([[1.0, 1.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="must have 3 entries"):
        QPSession(3, hessian=[1.0, 1.0])
    with pytest.raises(ValueError, match="rows must have 2 columns"):
        QPSession(2, hessian=[1.0, 1.0]).add_rows([[1.0]], 0.0, 1.0)
