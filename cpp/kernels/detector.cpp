#include "detector.hpp"

#include <cmath>
#include <mutex>
#include <stdexcept>
#include <string>

#include "parallel.hpp"

namespace relufast {

DetectorMoment::DetectorMoment(const RowMatrixXd& M) : d_(M.cols()), k_(M.rows()), M_(M) {
  if (d_ < 1 || k_ < 1) throw std::invalid_argument("DetectorMoment: M must be k x d with k, d >= 1");
  const Index D1 = d_ * (d_ + 1) / 2, D2 = k_ * (k_ + 1) / 2;
  sum_phipsi_.setZero(D1, D2);
  sum_phi_.setZero(D1);
  sum_psi_.setZero(D2);
}

void DetectorMoment::update(const ConstRowRef& X, const ConstRowRef& Y, int n_jobs, Index block) {
  if (X.cols() != d_)
    throw std::invalid_argument("DetectorMoment.update: X has " + std::to_string(X.cols()) +
                                " columns, expected d = " + std::to_string(d_));
  if (Y.cols() != k_)
    throw std::invalid_argument("DetectorMoment.update: Y has " + std::to_string(Y.cols()) +
                                " columns, expected k = " + std::to_string(k_));
  if (X.rows() != Y.rows())
    throw std::invalid_argument("DetectorMoment.update: X and Y have different numbers of rows");
  if (block < 1) throw std::invalid_argument("DetectorMoment.update: block must be >= 1");
  const Index d = d_, k = k_, D1 = d * (d + 1) / 2, D2 = k * (k + 1) / 2;
  const double r2 = std::sqrt(2.0);
  const Index n = X.rows();
  if (n == 0) return;
  block = clamp_block(n, block);
  // This call's sums (fixed block order, independent of n_jobs), added to the
  // state under the lock at the end.
  Eigen::MatrixXd S = Eigen::MatrixXd::Zero(D1, D2);
  Eigen::VectorXd sphi = Eigen::VectorXd::Zero(D1), spsi = Eigen::VectorXd::Zero(D2);
  struct Local {
    Eigen::MatrixXd S;
    Eigen::VectorXd sphi, spsi;
    RowMatrixXd Phi, Psi, Yt;
  };
  accumulate_blocks<Local>(
      n, block, n_jobs,
      [&] {
        Local L;
        L.S.resize(D1, D2);
        L.sphi.resize(D1);
        L.spsi.resize(D2);
        L.Phi.resize(block, D1);
        L.Psi.resize(block, D2);
        return L;
      },
      [&](Local& L) {
        L.S.setZero();
        L.sphi.setZero();
        L.spsi.setZero();
      },
      [&](Local& L, Index s0, Index len) {
        L.Yt.noalias() = X.middleRows(s0, len) * M_.transpose();  // linear predictor, len x k
        for (Index s = 0; s < len; ++s) {
          const double* x = X.data() + (s0 + s) * X.outerStride();
          const double* y = Y.data() + (s0 + s) * Y.outerStride();
          const double* yt = &L.Yt(s, 0);
          double* ph = &L.Phi(s, 0);
          for (Index a = 0; a < d; ++a) {
            *ph++ = x[a] * x[a];
            const double xa = r2 * x[a];
            for (Index c = a + 1; c < d; ++c) *ph++ = xa * x[c];
          }
          double* ps = &L.Psi(s, 0);
          for (Index a = 0; a < k; ++a) {
            *ps++ = 2.0 * y[a] * yt[a] - y[a] * y[a];
            for (Index c = a + 1; c < k; ++c) *ps++ = 2.0 * (y[a] * yt[c] + y[c] * yt[a] - y[a] * y[c]);
          }
        }
        L.S.noalias() += L.Phi.topRows(len).transpose() * L.Psi.topRows(len);
        L.sphi.noalias() += L.Phi.topRows(len).colwise().sum().transpose();
        L.spsi.noalias() += L.Psi.topRows(len).colwise().sum().transpose();
      },
      [&](const Local& L) {
        S += L.S;
        sphi += L.sphi;
        spsi += L.spsi;
      });
  std::lock_guard<std::mutex> lock(mu_);
  sum_phipsi_ += S;
  sum_phi_ += sphi;
  sum_psi_ += spsi;
  count_ += static_cast<double>(n);
}

void DetectorMoment::merge(const DetectorMoment& other) {
  if (other.d_ != d_ || other.k_ != k_ || other.M_ != M_)
    throw std::invalid_argument("DetectorMoment.merge: accumulators differ in d, k or M");
  if (&other == this) {
    std::lock_guard<std::mutex> lock(mu_);
    count_ *= 2.0;
    sum_phipsi_ *= 2.0;
    sum_phi_ *= 2.0;
    sum_psi_ *= 2.0;
    return;
  }
  std::scoped_lock lock(mu_, other.mu_);
  count_ += other.count_;
  sum_phipsi_ += other.sum_phipsi_;
  sum_phi_ += other.sum_phi_;
  sum_psi_ += other.sum_psi_;
}

double DetectorMoment::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

Eigen::MatrixXd DetectorMoment::sum_phipsi() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sum_phipsi_;
}

Eigen::VectorXd DetectorMoment::sum_phi() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sum_phi_;
}

Eigen::VectorXd DetectorMoment::sum_psi() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sum_psi_;
}

void DetectorMoment::snapshot(double& count, Eigen::MatrixXd& sum_phipsi, Eigen::VectorXd& sum_phi,
                              Eigen::VectorXd& sum_psi) const {
  std::lock_guard<std::mutex> lock(mu_);
  count = count_;
  sum_phipsi = sum_phipsi_;
  sum_phi = sum_phi_;
  sum_psi = sum_psi_;
}

Eigen::MatrixXd DetectorMoment::matrix(bool centred) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (count_ <= 0.0) throw std::domain_error("DetectorMoment.matrix: no samples accumulated");
  Eigen::MatrixXd T = sum_phipsi_ / count_;
  if (centred) T.noalias() -= (sum_phi_ / count_) * (sum_psi_ / count_).transpose();
  return T;
}

void DetectorMoment::set_state(double count, const Eigen::MatrixXd& sum_phipsi,
                               const Eigen::VectorXd& sum_phi, const Eigen::VectorXd& sum_psi) {
  if (sum_phipsi.rows() != sum_phipsi_.rows() || sum_phipsi.cols() != sum_phipsi_.cols() ||
      sum_phi.size() != sum_phi_.size() || sum_psi.size() != sum_psi_.size())
    throw std::invalid_argument("DetectorMoment.set_state: the sums' shapes do not match this accumulator");
  std::lock_guard<std::mutex> lock(mu_);
  count_ = count;
  sum_phipsi_ = sum_phipsi;
  sum_phi_ = sum_phi;
  sum_psi_ = sum_psi;
}

}  // namespace relufast
