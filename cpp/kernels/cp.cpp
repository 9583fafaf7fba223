#include "cp.hpp"

#include <algorithm>
#include <cmath>

#include "parallel.hpp"

namespace relufast {
namespace {

constexpr Index ROWS_PER_ITEM = 1024;
// Multiply-adds per thread below which another thread costs more than it saves (starting a
// thread is tens of microseconds; 2^20 multiply-adds are a few hundred on one core). CP-ALS
// calls these kernels hundreds of times on tensors as small as 10 x 10 x 10.
constexpr double WORK_PER_THREAD = 1 << 20;

// n_jobs as parallel_for takes it, lowered so that every thread has WORK_PER_THREAD.
int threads_for(double work, int n_jobs) {
  const double cap = std::max(1.0, std::floor(work / WORK_PER_THREAD));
  const int want = n_jobs > 0 ? n_jobs : hardware_threads();
  return static_cast<int>(std::min<double>(want, cap));
}

}  // namespace

void slice_products(const ConstRowRef& P, Index k1, const ConstRowRef& C, const ConstRowRef& W, DgemmFn dgemm,
                    int n_jobs, Eigen::Ref<RowMatrixXd> Q, RowMatrixXd& T) {
  const Index m = k1 > 0 ? P.rows() / k1 : 0, k2 = P.cols(), r = C.cols();
  const bool weighted = W.rows() > 0;  // (W of k1 x 0 still asks for T, of m x 0)
  T.setZero(weighted ? m : 0, r);
  if (m == 0 || r == 0) return;
  if (k2 == 0) {
    Q.setZero();
    return;
  }
  // About ROWS_PER_ITEM rows of P a work item (one GEMM each: small ones run far below the
  // BLAS rate), but at least 16 items when there are that many slices, for the threads.
  const Index per = std::max<Index>(1, std::min<Index>(ROWS_PER_ITEM / k1, (m + 15) / 16));
  const long long items = (m + per - 1) / per;
  const double work = static_cast<double>(P.rows()) * static_cast<double>(k2) * static_cast<double>(r);
  parallel_for(items, threads_for(work, n_jobs), [&](long long item) {
    const Index i0 = item * per, i1 = std::min<Index>(m, i0 + per), row0 = i0 * k1, rows = (i1 - i0) * k1;
    if (dgemm) {
      // Row-major Q_block = P_block C is, column-major, Q_block^T = C^T P_block^T.
      char no = 'N';
      int M = static_cast<int>(r), N = static_cast<int>(rows), K = static_cast<int>(k2);
      int lda = static_cast<int>(C.outerStride()), ldb = static_cast<int>(P.outerStride());
      int ldc = static_cast<int>(Q.outerStride());
      double one = 1.0, zero = 0.0;
      dgemm(&no, &no, &M, &N, &K, &one, const_cast<double*>(C.data()), &lda,
            const_cast<double*>(P.data() + row0 * P.outerStride()), &ldb, &zero, Q.data() + row0 * Q.outerStride(),
            &ldc);
    } else {
      Q.middleRows(row0, rows).noalias() = P.middleRows(row0, rows) * C;
    }
    if (weighted)
      for (Index i = i0; i < i1; ++i) T.row(i) = (Q.middleRows(i * k1, k1).array() * W.array()).colwise().sum();
  });
}

RowMatrixXd slice_weighted_sum(const ConstRowRef& S, const ConstRowRef& A, int n_jobs) {
  const Index m = A.rows(), r = A.cols(), k = m > 0 ? S.rows() / m : 0;
  RowMatrixXd out = RowMatrixXd::Zero(k, r);
  const Index per = 16;  // rows of the result a work item
  const long long items = k > 0 ? (k + per - 1) / per : 0;
  parallel_for(items, threads_for(static_cast<double>(S.rows()) * static_cast<double>(r), n_jobs),
               [&](long long item) {
    const Index p0 = item * per, len = std::min<Index>(k, p0 + per) - p0;
    auto block = out.middleRows(p0, len);
    for (Index i = 0; i < m; ++i) block.array() += S.middleRows(i * k + p0, len).array().rowwise() * A.row(i).array();
  });
  return out;
}

}  // namespace relufast
