"""MR19: representation learning and robust recovery in the single-layer ReLU model.

A. Mazumdar and A. S. Rawat, "Representation Learning and Recovery in the ReLU Model",
arXiv:1803.04304, 2018 (conference version: "Learning and Recovery in the ReLU Model",
57th Allerton Conference on Communication, Control, and Computing, 2019).

The paper studies two problems about ``y = relu(A c + b)`` with A of shape (d, k). It writes
vectors as columns; here a batch of codes or samples is stacked as rows (relufast's
convention), so the paper's d x n matrix Y is our ``Y.T``.

Problem D, robust recovery (Section 4), from ``v = relu(A c* + b) + e* + w`` with A known and
Gaussian, e* s-sparse, |w| <= delta:

- :func:`robust_recover`: the generalized LASSO, program (47), Theorem 4. It estimates
  ``mu c*`` with ``mu = E[g relu(g + B)] = E[Phi(B)]`` (and e*). Two exact solvers: a convex
  QP through HiGHS (:class:`relufast.highs.QPSession`), and the equivalent Huber regression in
  k variables solved by active-set Newton (derived for relufast; not in the paper).
- :func:`bias_moments` (mu, and sigma^2, eta^2 of eq. (58)), :func:`theory_lam` (Theorem 4's
  lambda = 2 ||z + w||_inf / d, needs the truth), :func:`calibrated_lam` (relufast's
  default, a quantile of |z|; not in the paper).

Problem R, representation learning (Section 3), from ``Y = relu(C A^T + 1 b^T)``:

- :func:`ml_estimate`: the maximum-likelihood estimate of M, program (34), solved in closed
  form row by row, with a documented fill rule for the entries (34) leaves free.
- :func:`column_space`: Section 3.2 (top-k SVD of the estimate), plus two estimators that are
  NOT in the paper: the centred-SVD baseline and a low-rank "Tobit" nuclear-norm extension.
  The paper's step taken literally recovers the column space poorly (docs/mr19.md).
- :func:`subspace_distance` (principal angles, ||sin Theta||_F, Procrustes distance),
  :func:`davis_kahan_bound` (Theorem 5, eqs. (71)-(72)) and :func:`theorem3_constants`
  (the constants of Theorem 3's bound (35), reported, never relied on).
"""

from __future__ import annotations

from .column_space import ColumnSpace, column_space
from .laws import abs_z_tail, bias_moments, calibrated_lam, theory_lam
from .ml import InfeasibleError, MLEstimate, ml_estimate
from .robust import RobustRecovery, robust_recover
from .subspaces import davis_kahan_bound, principal_angles, subspace_distance, theorem3_constants

__all__ = [
    "RobustRecovery",
    "robust_recover",
    "bias_moments",
    "abs_z_tail",
    "calibrated_lam",
    "theory_lam",
    "InfeasibleError",
    "MLEstimate",
    "ml_estimate",
    "ColumnSpace",
    "column_space",
    "principal_angles",
    "subspace_distance",
    "davis_kahan_bound",
    "theorem3_constants",
]
