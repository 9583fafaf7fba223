// The contractions of a CP-ALS sweep (relufast.stages.tensor.cp_als), threaded.
//
// A third-order tensor P (m x k1 x k2) is stored as its m slices P_i (k1 x k2) stacked
// into a (m k1) x k2 row-major matrix. One sweep needs, for the current factors,
//
//   Q = P x_3 C   (slices P_i C, k1 x r each),
//   T(i, j) = sum_p Q_i(p, j) W(p, j)          (the mode-1 MTTKRP when W = B), and
//   S(p, j) = sum_i Q_i(p, j) A(i, j)          (the mode-2 / mode-3 MTTKRP),
//
// NumPy computes Q as one GEMM and T and S as einsums on one thread; with the BLAS at
// several threads for the GEMM, its workers then spin beside the kernels that follow
// (measured on 16 cores: the einsum kernels 4 times slower than on 2). Here Q and T are
// computed slice block by slice block on relufast's threads, each block's GEMM by the
// caller's BLAS dgemm on that thread (Eigen when none is given) and its T from the block
// while it is in cache; S is summed over blocks of p, each in increasing order of i. The
// results do not depend on n_jobs.
#pragma once

#include "types.hpp"

namespace relufast {

// Q = P C slice by slice ((m k1) x r) and, when W (k1 x r) is not empty, T (m x r) with
// T(i, :) = column sums of Q_i .* W. dgemm: a BLAS dgemm that is safe to call from several
// threads at once (one whose own threading is limited to one thread), or nullptr for Eigen.
// Q must be (m k1) x r, contiguous rows; it is overwritten (the caller may reuse it).
void slice_products(const ConstRowRef& P, Index k1, const ConstRowRef& C, const ConstRowRef& W, DgemmFn dgemm,
                    int n_jobs, Eigen::Ref<RowMatrixXd> Q, RowMatrixXd& T);

// S ((m k) x r) and A (m x r): the k x r matrix sum_i S_i .* A(i, :), S_i = rows [i k, (i + 1) k).
RowMatrixXd slice_weighted_sum(const ConstRowRef& S, const ConstRowRef& A, int n_jobs);

}  // namespace relufast
