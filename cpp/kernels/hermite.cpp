#include "hermite.hpp"

#include <stdexcept>
#include <string>

#include "parallel.hpp"

namespace relufast {

namespace {
Index ipow(Index k, int r) {
  Index p = 1;
  for (int i = 0; i < r; ++i) p *= k;
  return p;
}
}  // namespace

HermiteSums::HermiteSums(Index k, Index m, int order) : k_(k), m_(m), order_(order) {
  if (k < 1 || m < 1) throw std::invalid_argument("HermiteSums: need k >= 1 and m >= 1");
  if (order < 0 || order > 6)
    throw std::invalid_argument("HermiteSums: order must be in 0..6; got " + std::to_string(order));
  for (int r = 0; r <= order; ++r) sums_.push_back(RowMatrixXd::Zero(m, ipow(k, r)));
}

const RowMatrixXd& HermiteSums::sums(int r) const {
  if (r < 0 || r > order_)
    throw std::invalid_argument("HermiteSums.sums: r must be in 0.." + std::to_string(order_));
  return sums_[r];
}

void HermiteSums::update(const ConstRowRef& X, const ConstRowRef& Y, const RowMatrixXd* P,
                         int n_jobs, Index block) {
  const Index k = k_, m = m_;
  if (P) {
    if (P->rows() != X.cols() || P->cols() != k)
      throw std::invalid_argument("HermiteSums.update: P has shape (" + std::to_string(P->rows()) +
                                  ", " + std::to_string(P->cols()) + "), expected (d, k) = (" +
                                  std::to_string(X.cols()) + ", " + std::to_string(k) + ")");
  } else if (X.cols() != k) {
    throw std::invalid_argument("HermiteSums.update: X has " + std::to_string(X.cols()) +
                                " columns, expected k = " + std::to_string(k) + " (or pass P)");
  }
  if (Y.cols() != m)
    throw std::invalid_argument("HermiteSums.update: Y has " + std::to_string(Y.cols()) +
                                " columns, expected m = " + std::to_string(m));
  if (X.rows() != Y.rows())
    throw std::invalid_argument("HermiteSums.update: X has " + std::to_string(X.rows()) +
                                " rows but Y has " + std::to_string(Y.rows()));
  if (block < 1) throw std::invalid_argument("HermiteSums.update: block must be >= 1");
  const Index n = X.rows();
  if (n == 0) return;
  const int order = order_;
  const Index k2 = k * k;

  struct Local {
    std::vector<RowMatrixXd> s;
    RowMatrixXd Z, Z2, Z3, W, W2, W3;
  };
  accumulate_blocks<Local>(
      n, block, n_jobs,
      [&] {
        Local L;
        for (int r = 0; r <= order; ++r) L.s.push_back(RowMatrixXd::Zero(m, ipow(k, r)));
        return L;
      },
      [&](Local& L) {
        for (auto& S : L.s) S.setZero();
      },
      [&](Local& L, Index s0, Index len) {
        const auto Xb = X.middleRows(s0, len);
        const auto Yb = Y.middleRows(s0, len);
        if (P)
          L.Z.noalias() = Xb * (*P);
        else
          L.Z = Xb;
        L.s[0].col(0).noalias() += Yb.colwise().sum().transpose();
        if (order >= 1) L.s[1].noalias() += Yb.transpose() * L.Z;
        if (order < 2) return;
        // W[s, i*k + a] = y_si z_sa; S_2[i] = Z^T W_i.
        L.W.resize(len, m * k);
        for (Index s = 0; s < len; ++s)
          for (Index i = 0; i < m; ++i) L.W.row(s).segment(i * k, k).noalias() = Yb(s, i) * L.Z.row(s);
        {
          const RowMatrixXd G = L.Z.transpose() * L.W;  // (k, m k)
          for (Index i = 0; i < m; ++i)
            for (Index a = 0; a < k; ++a) L.s[2].row(i).segment(a * k, k) += G.row(a).segment(i * k, k);
        }
        if (order < 3) return;
        // Z2[s, a*k + b] = z_sa z_sb (the row-wise Kronecker square).
        L.Z2.resize(len, k2);
        for (Index s = 0; s < len; ++s)
          for (Index a = 0; a < k; ++a) L.Z2.row(s).segment(a * k, k).noalias() = L.Z(s, a) * L.Z.row(s);
        {
          const RowMatrixXd G = L.Z2.transpose() * L.W;  // (k^2, m k): S_3[i][ab, c]
          for (Index i = 0; i < m; ++i)
            for (Index ab = 0; ab < k2; ++ab) L.s[3].row(i).segment(ab * k, k) += G.row(ab).segment(i * k, k);
        }
        if (order < 4) return;
        L.W2.resize(len, m * k2);
        for (Index s = 0; s < len; ++s)
          for (Index i = 0; i < m; ++i) L.W2.row(s).segment(i * k2, k2).noalias() = Yb(s, i) * L.Z2.row(s);
        {
          const RowMatrixXd G = L.Z2.transpose() * L.W2;  // (k^2, m k^2): S_4[i][ab, cd]
          for (Index i = 0; i < m; ++i)
            for (Index ab = 0; ab < k2; ++ab) L.s[4].row(i).segment(ab * k2, k2) += G.row(ab).segment(i * k2, k2);
        }
        if (order < 5) return;
        // Orders 5 and 6 (ATV21 Alg. 4 with l = 2): Z3 = row-wise Kronecker cube.
        const Index k3 = k2 * k;
        L.Z3.resize(len, k3);
        for (Index s = 0; s < len; ++s)
          for (Index ab = 0; ab < k2; ++ab) L.Z3.row(s).segment(ab * k, k).noalias() = L.Z2(s, ab) * L.Z.row(s);
        {
          const RowMatrixXd G = L.Z3.transpose() * L.W2;  // (k^3, m k^2): S_5[i][abc, de]
          for (Index i = 0; i < m; ++i)
            for (Index abc = 0; abc < k3; ++abc) L.s[5].row(i).segment(abc * k2, k2) += G.row(abc).segment(i * k2, k2);
        }
        if (order < 6) return;
        L.W3.resize(len, m * k3);
        for (Index s = 0; s < len; ++s)
          for (Index i = 0; i < m; ++i) L.W3.row(s).segment(i * k3, k3).noalias() = Yb(s, i) * L.Z3.row(s);
        {
          const RowMatrixXd G = L.Z3.transpose() * L.W3;  // (k^3, m k^3): S_6[i][abc, def]
          for (Index i = 0; i < m; ++i)
            for (Index abc = 0; abc < k3; ++abc) L.s[6].row(i).segment(abc * k3, k3) += G.row(abc).segment(i * k3, k3);
        }
      },
      [&](const Local& L) {
        for (int r = 0; r <= order; ++r) sums_[r] += L.s[r];
      });
  count_ += static_cast<double>(n);
}

void HermiteSums::merge(const HermiteSums& other) {
  if (other.k_ != k_ || other.m_ != m_ || other.order_ != order_)
    throw std::invalid_argument("HermiteSums.merge: shapes differ (k, m, order)");
  count_ += other.count_;
  for (int r = 0; r <= order_; ++r) sums_[r] += other.sums_[r];
}

void HermiteSums::set_state(double count, const std::vector<RowMatrixXd>& sums) {
  if (static_cast<int>(sums.size()) != order_ + 1)
    throw std::invalid_argument("HermiteSums.set_state: expected order + 1 sums");
  for (int r = 0; r <= order_; ++r)
    if (sums[r].rows() != m_ || sums[r].cols() != ipow(k_, r))
      throw std::invalid_argument("HermiteSums.set_state: sums[" + std::to_string(r) + "] has the wrong shape");
  if (!(count >= 0.0)) throw std::invalid_argument("HermiteSums.set_state: count must be >= 0");
  count_ = count;
  sums_ = sums;
}

}  // namespace relufast
