// The contractions of a CP-ALS sweep (relufast.stages.tensor.cp_als), threaded.
//
// A third-order tensor P (m x k1 x k2) is stored as its m slices P_i (k1 x k2) stacked
// into a (m k1) x k2 row-major matrix. One sweep needs, for the current factors,
//
//   Q = P x_3 C   (slices P_i C, k1 x r each),
//   T(i, j) = sum_p Q_i(p, j) W(p, j)          (the mode-1 MTTKRP when W = B), and
//   S(p, j) = sum_i Q_i(p, j) A(i, j)          (the mode-2 / mode-3 MTTKRP),
//
// NumPy computes Q as one GEMM (threaded by the BLAS; relufast lifts its limit for it) and
// T and S as einsums, on one thread: at k = 128 those einsums were a fifth of the whole
// tensor stage. These kernels do T and S on relufast's threads: T slice by slice, S over
// blocks of p, each summing over i in increasing order, so that the results do not depend
// on n_jobs.
#pragma once

#include "types.hpp"

namespace relufast {

// Q ((m k1) x r) and W (k1 x r): the m x r matrix T(i, :) = column sums of Q_i .* W.
RowMatrixXd slice_column_sums(const ConstRowRef& Q, const ConstRowRef& W, int n_jobs);

// S ((m k) x r) and A (m x r): the k x r matrix sum_i S_i .* A(i, :), S_i = rows [i k, (i + 1) k).
RowMatrixXd slice_weighted_sum(const ConstRowRef& S, const ConstRowRef& A, int n_jobs);

}  // namespace relufast
