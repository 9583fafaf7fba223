#include "cp.hpp"

#include <algorithm>

#include "parallel.hpp"

namespace relufast {

RowMatrixXd slice_column_sums(const ConstRowRef& Q, const ConstRowRef& W, int n_jobs) {
  const Index k1 = W.rows(), r = W.cols(), m = k1 > 0 ? Q.rows() / k1 : 0;
  RowMatrixXd T(m, r);
  // At least ~64 rows of Q a work item, so that small slices do not cost a dispatch each.
  const Index per = std::max<Index>(1, 64 / std::max<Index>(k1, 1));
  const long long items = m > 0 ? (m + per - 1) / per : 0;
  parallel_for(items, n_jobs, [&](long long item) {
    const Index i1 = std::min<Index>(m, (item + 1) * per);
    for (Index i = item * per; i < i1; ++i) T.row(i) = (Q.middleRows(i * k1, k1).array() * W.array()).colwise().sum();
  });
  return T;
}

RowMatrixXd slice_weighted_sum(const ConstRowRef& S, const ConstRowRef& A, int n_jobs) {
  const Index m = A.rows(), r = A.cols(), k = m > 0 ? S.rows() / m : 0;
  RowMatrixXd out = RowMatrixXd::Zero(k, r);
  const Index per = 16;  // rows of the result a work item
  const long long items = k > 0 ? (k + per - 1) / per : 0;
  parallel_for(items, n_jobs, [&](long long item) {
    const Index p0 = item * per, len = std::min<Index>(k, p0 + per) - p0;
    auto block = out.middleRows(p0, len);
    for (Index i = 0; i < m; ++i) block.array() += S.middleRows(i * k + p0, len).array().rowwise() * A.row(i).array();
  });
  return out;
}

}  // namespace relufast
