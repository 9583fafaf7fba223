#include "contracted4.hpp"

#include <cmath>
#include <mutex>
#include <stdexcept>
#include <string>

#include "parallel.hpp"

namespace relufast {

namespace {

struct Sums {
  double n_active = 0.0, s0 = 0.0;
  RowMatrixXd S, G1, G3, M, S11, S22, GP;
  void zero(Index R, Index n, bool second, bool pairs) {
    n_active = s0 = 0.0;
    S.setZero(R, 4);
    G1.setZero(R, n);
    G3.setZero(R, n);
    M.setZero(second ? n : 0, second ? n : 0);
    S11.setZero(pairs ? R : 0, pairs ? R : 0);
    S22.setZero(pairs ? R : 0, pairs ? R : 0);
    GP.setZero(pairs ? R : 0, pairs ? n : 0);
  }
};

}  // namespace

Hermite4Contraction::Hermite4Contraction(const RowMatrixXd& Z, double offset, double active_tol,
                                         bool second, bool pairs)
    : Z_(Z), offset_(offset), active_tol_(active_tol), second_(second), pairs_(pairs), n_(Z.cols()) {
  if (n_ < 1) throw std::invalid_argument("Hermite4Contraction: Z must have at least one column (n >= 1)");
  if (!std::isfinite(offset)) throw std::invalid_argument("Hermite4Contraction: offset must be finite");
  if (!Z.allFinite()) throw std::invalid_argument("Hermite4Contraction: Z must be finite");
  Sums s;
  s.zero(Z.rows(), n_, second, pairs);
  S_ = s.S;
  G1_ = s.G1;
  G3_ = s.G3;
  M_ = s.M;
  S11_ = s.S11;
  S22_ = s.S22;
  GP_ = s.GP;
}

void Hermite4Contraction::update(const ConstRowRef& X, const Eigen::Ref<const Eigen::VectorXd>& f,
                                 int n_jobs, Index block) {
  if (X.cols() != n_)
    throw std::invalid_argument("Hermite4Contraction.update: X has " + std::to_string(X.cols()) +
                                " columns, expected n = " + std::to_string(n_));
  if (f.size() != X.rows())
    throw std::invalid_argument("Hermite4Contraction.update: X has " + std::to_string(X.rows()) +
                                " rows but f has " + std::to_string(f.size()) + " entries");
  if (block < 1) throw std::invalid_argument("Hermite4Contraction.update: block must be >= 1");
  const Index N = X.rows(), R = Z_.rows(), n = n_;
  if (N == 0) return;
  struct Local {
    Sums s;
    RowMatrixXd Xa, Y, W;
    Eigen::VectorXd fa;
  };
  const RowMatrixXd Zt = Z_.transpose();
  Sums total;  // this call's sums, reduced in a fixed block order, added under the lock
  total.zero(R, n, second_, pairs_);
  accumulate_blocks<Local>(
      N, block, n_jobs,
      [&] {
        Local L;
        L.Xa.resize(block, n);
        L.fa.resize(block);
        return L;
      },
      [&](Local& L) { L.s.zero(R, n, second_, pairs_); },
      [&](Local& L, Index s0, Index len) {
        Index na = 0;
        for (Index s = s0; s < s0 + len; ++s) {
          const double ft = f(s) - offset_;
          if (!std::isfinite(ft)) throw std::invalid_argument("Hermite4Contraction.update: f must be finite");
          if (active_tol_ >= 0.0 && std::abs(ft) <= active_tol_) continue;
          L.Xa.row(na) = X.row(s);
          L.fa(na) = ft;
          ++na;
        }
        if (na == 0) return;
        const auto Xa = L.Xa.topRows(na);
        const auto fa = L.fa.head(na);
        L.s.n_active += static_cast<double>(na);
        L.s.s0 += fa.sum();
        if (second_) {
          L.W = Xa;
          L.W.array().colwise() *= fa.array();
          L.s.M.noalias() += Xa.transpose() * L.W;
        }
        if (R == 0) return;
        L.Y.noalias() = Xa * Zt;  // na x R
        const Eigen::ArrayXXd y = L.Y.array();
        const Eigen::ArrayXXd fy = y.colwise() * fa.array();
        const Eigen::ArrayXXd fy2 = fy * y, fy3 = fy2 * y;
        L.s.S.col(0) += fy.colwise().sum().transpose().matrix();
        L.s.S.col(1) += fy2.colwise().sum().transpose().matrix();
        L.s.S.col(2) += fy3.colwise().sum().transpose().matrix();
        L.s.S.col(3) += (fy3 * y).colwise().sum().transpose().matrix();
        L.s.G1.noalias() += fy.matrix().transpose() * Xa;
        L.s.G3.noalias() += fy3.matrix().transpose() * Xa;
        if (pairs_) {
          const Eigen::ArrayXXd y2 = y * y;
          L.s.S11.noalias() += fy.matrix().transpose() * L.Y;
          L.s.S22.noalias() += (y2.colwise() * fa.array()).matrix().transpose() * y2.matrix();
          const Eigen::ArrayXd q = y2.rowwise().sum();
          const Eigen::ArrayXXd wp = fy * ((-y2).colwise() + q);
          L.s.GP.noalias() += wp.matrix().transpose() * Xa;
        }
      },
      [&](const Local& L) {
        total.n_active += L.s.n_active;
        total.s0 += L.s.s0;
        total.S += L.s.S;
        total.G1 += L.s.G1;
        total.G3 += L.s.G3;
        if (second_) total.M += L.s.M;
        if (pairs_) {
          total.S11 += L.s.S11;
          total.S22 += L.s.S22;
          total.GP += L.s.GP;
        }
      });
  std::lock_guard<std::mutex> lock(mu_);
  n_active_ += total.n_active;
  s0_ += total.s0;
  S_ += total.S;
  G1_ += total.G1;
  G3_ += total.G3;
  M_ += total.M;
  S11_ += total.S11;
  S22_ += total.S22;
  GP_ += total.GP;
  count_ += static_cast<double>(N);
}

void Hermite4Contraction::merge(const Hermite4Contraction& other) {
  if (&other == this) throw std::invalid_argument("Hermite4Contraction.merge: cannot merge an accumulator into itself");
  std::scoped_lock lock(mu_, other.mu_);
  if (other.n_ != n_ || other.Z_.rows() != Z_.rows() || other.second_ != second_ || other.pairs_ != pairs_ ||
      other.offset_ != offset_ || other.active_tol_ != active_tol_ || !(other.Z_.array() == Z_.array()).all())
    throw std::invalid_argument(
        "Hermite4Contraction.merge: accumulators differ (directions, offset, filter or options)");
  count_ += other.count_;
  n_active_ += other.n_active_;
  s0_ += other.s0_;
  S_ += other.S_;
  G1_ += other.G1_;
  G3_ += other.G3_;
  M_ += other.M_;
  S11_ += other.S11_;
  S22_ += other.S22_;
  GP_ += other.GP_;
}

void Hermite4Contraction::set_state(double count, double n_active, double s0, const RowMatrixXd& S,
                                    const RowMatrixXd& G1, const RowMatrixXd& G3, const RowMatrixXd& M,
                                    const RowMatrixXd& S11, const RowMatrixXd& S22, const RowMatrixXd& GP) {
  auto same = [](const RowMatrixXd& a, const RowMatrixXd& b) { return a.rows() == b.rows() && a.cols() == b.cols(); };
  if (!same(S, S_) || !same(G1, G1_) || !same(G3, G3_) || !same(M, M_) || !same(S11, S11_) ||
      !same(S22, S22_) || !same(GP, GP_))
    throw std::invalid_argument("Hermite4Contraction.set_state: state shapes do not match the accumulator");
  if (!(count >= 0.0) || !(n_active >= 0.0) || n_active > count)
    throw std::invalid_argument("Hermite4Contraction.set_state: need 0 <= n_active <= count");
  std::lock_guard<std::mutex> lock(mu_);
  count_ = count;
  n_active_ = n_active;
  s0_ = s0;
  S_ = S;
  G1_ = G1;
  G3_ = G3;
  M_ = M;
  S11_ = S11;
  S22_ = S22;
  GP_ = GP;
}

}  // namespace relufast
