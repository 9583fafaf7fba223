#include "moments.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include "parallel.hpp"

namespace relufast {

SecondMoment::SecondMoment(Index d, Index m)
    : d_(d), m_(m), sum_y_(Eigen::VectorXd::Zero(m)), sum_yxx_(Eigen::MatrixXd::Zero(d, m * d)) {
  if (d < 1 || m < 1) throw std::invalid_argument("SecondMoment: need d >= 1 and m >= 1");
}

void SecondMoment::update(const ConstRowRef& X, const ConstRowRef& Y, int n_jobs, Index block) {
  if (X.cols() != d_)
    throw std::invalid_argument("SecondMoment.update: X has " + std::to_string(X.cols()) +
                                " columns, expected d = " + std::to_string(d_));
  if (Y.cols() != m_)
    throw std::invalid_argument("SecondMoment.update: Y has " + std::to_string(Y.cols()) +
                                " columns, expected m = " + std::to_string(m_));
  if (X.rows() != Y.rows())
    throw std::invalid_argument("SecondMoment.update: X has " + std::to_string(X.rows()) +
                                " rows but Y has " + std::to_string(Y.rows()));
  if (block < 1) throw std::invalid_argument("SecondMoment.update: block must be >= 1");
  const Index n = X.rows();
  if (n == 0) return;
  const Index nblocks = (n + block - 1) / block;
  const int nthreads = resolve_threads(n_jobs, nblocks);
  const Index d = d_, m = m_;

  std::vector<Eigen::MatrixXd> acc(nthreads);
  std::vector<Eigen::VectorXd> accy(nthreads);
  parallel_ranges(nthreads, nblocks, [&](int t, long long b0, long long b1) {
    Eigen::MatrixXd& a = acc[t];
    a.setZero(d, m * d);
    accy[t].setZero(m);
    // W[s, i*d + k] = y_si x_sk: one GEMM X_b^T W gives all m slices at once.
    RowMatrixXd W(block, m * d);
    for (long long b = b0; b < b1; ++b) {
      const Index s0 = b * block, len = std::min(block, n - s0);
      for (Index s = 0; s < len; ++s) {
        const auto x = X.row(s0 + s);
        for (Index i = 0; i < m; ++i) W.row(s).segment(i * d, d).noalias() = Y(s0 + s, i) * x;
      }
      a.noalias() += X.middleRows(s0, len).transpose() * W.topRows(len);
      accy[t].noalias() += Y.middleRows(s0, len).colwise().sum().transpose();
    }
  });
  for (int t = 0; t < nthreads; ++t) {
    sum_yxx_ += acc[t];
    sum_y_ += accy[t];
  }
  count_ += static_cast<double>(n);
}

void SecondMoment::merge(const SecondMoment& other) {
  if (other.d_ != d_ || other.m_ != m_)
    throw std::invalid_argument("SecondMoment.merge: shapes differ (d, m) = (" + std::to_string(d_) +
                                ", " + std::to_string(m_) + ") vs (" + std::to_string(other.d_) +
                                ", " + std::to_string(other.m_) + ")");
  count_ += other.count_;
  sum_y_ += other.sum_y_;
  sum_yxx_ += other.sum_yxx_;
}

void SecondMoment::set_state(double count, const Eigen::VectorXd& sum_y, const Eigen::MatrixXd& sum_yxx) {
  if (sum_y.size() != m_ || sum_yxx.rows() != d_ || sum_yxx.cols() != m_ * d_)
    throw std::invalid_argument("SecondMoment.set_state: state shapes do not match (d, m)");
  if (!(count >= 0.0)) throw std::invalid_argument("SecondMoment.set_state: count must be >= 0");
  count_ = count;
  sum_y_ = sum_y;
  sum_yxx_ = sum_yxx;
}

RowMatrixXd SecondMoment::tensor() const {
  if (count_ <= 0.0) throw std::domain_error("SecondMoment.tensor: no samples accumulated");
  const Index d = d_;
  RowMatrixXd T(m_, d * d);
  for (Index i = 0; i < m_; ++i) {
    Eigen::MatrixXd S = sum_yxx_.middleCols(i * d, d) / count_;
    S = 0.5 * (S + S.transpose()).eval();
    S.diagonal().array() -= sum_y_(i) / count_;
    // S is symmetric, so its column-major storage equals row-major storage.
    T.row(i) = Eigen::Map<const Eigen::RowVectorXd>(S.data(), d * d);
  }
  return T;
}

ReluStats relu_stats(const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V,
                     const RowMatrixXd* U, int n_jobs, Index block) {
  const Index n = X.rows(), d = X.cols(), m = Y.cols(), k = V.rows();
  if (V.cols() != d)
    throw std::invalid_argument("relu_stats: V has " + std::to_string(V.cols()) +
                                " columns, expected d = " + std::to_string(d));
  if (Y.rows() != n) throw std::invalid_argument("relu_stats: X and Y have different numbers of rows");
  if (U && (U->rows() != m || U->cols() != k))
    throw std::invalid_argument("relu_stats: U must have shape (m, k)");
  if (block < 1) throw std::invalid_argument("relu_stats: block must be >= 1");
  const Index nblocks = std::max<Index>(1, (n + block - 1) / block);
  const int nthreads = resolve_threads(n_jobs, nblocks);
  std::vector<ReluStats> part(nthreads);
  parallel_ranges(nthreads, nblocks, [&](int t, long long b0, long long b1) {
    ReluStats& p = part[t];
    p.gram.setZero(k, k);
    p.cross.setZero(k, m);
    RowMatrixXd F, R;
    for (long long b = b0; b < b1; ++b) {
      const Index s0 = b * block, len = std::min(block, n - s0);
      if (len <= 0) break;
      F.noalias() = X.middleRows(s0, len) * V.transpose();
      F = F.cwiseMax(0.0);
      p.gram.noalias() += F.transpose() * F;
      p.cross.noalias() += F.transpose() * Y.middleRows(s0, len);
      if (U) {
        R = Y.middleRows(s0, len);
        R.noalias() -= F * U->transpose();
        p.sq_residual += R.squaredNorm();
        p.sq_norm += Y.middleRows(s0, len).squaredNorm();
      }
      p.count += static_cast<double>(len);
    }
  });
  ReluStats out = part[0];
  for (int t = 1; t < nthreads; ++t) {
    out.gram += part[t].gram;
    out.cross += part[t].cross;
    out.sq_residual += part[t].sq_residual;
    out.sq_norm += part[t].sq_norm;
    out.count += part[t].count;
  }
  return out;
}

}  // namespace relufast
