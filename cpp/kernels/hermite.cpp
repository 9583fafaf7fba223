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

// out[s, a*c + b] = A[s, a] B[s, b]: the row-wise Kronecker product (c = B.cols()).
void kron_rows(const RowMatrixXd& A, const RowMatrixXd& B, RowMatrixXd& out) {
  const Index c = B.cols();
  out.resize(A.rows(), A.cols() * c);
  for (Index s = 0; s < A.rows(); ++s)
    for (Index a = 0; a < A.cols(); ++a) out.row(s).segment(a * c, c).noalias() = A(s, a) * B.row(s);
}

// out[s, i*c + b] = y_si C[s, b]: every output's weighting of C's rows.
template <class Rows>
void weight_rows(const Rows& Yb, const RowMatrixXd& C, RowMatrixXd& out) {
  const Index c = C.cols(), m = Yb.cols();
  out.resize(C.rows(), m * c);
  for (Index s = 0; s < C.rows(); ++s)
    for (Index i = 0; i < m; ++i) out.row(s).segment(i * c, c).noalias() = Yb(s, i) * C.row(s);
}

// S[i][a*c + b] += sum_s A[s, a] W[s, i*c + b] with W = weight_rows(Y, C): one GEMM A^T W,
// its (a, i) blocks scattered into output i's row (c = W.cols() / m).
void add_gram(RowMatrixXd& S, const RowMatrixXd& A, const RowMatrixXd& W) {
  const Index m = S.rows(), c = W.cols() / m;
  const RowMatrixXd G = A.transpose() * W;
  for (Index i = 0; i < m; ++i)
    for (Index a = 0; a < A.cols(); ++a) S.row(i).segment(a * c, c) += G.row(a).segment(i * c, c);
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
        // S_r[i] holds sum_s y_si z_s^{(x) r} flattened; Z2, Z3 are row-wise Kronecker powers
        // of Z and W, W2, W3 the outputs' weightings of Z, Z2, Z3: S_r = Z_p^T W_q, p + q = r.
        weight_rows(Yb, L.Z, L.W);
        add_gram(L.s[2], L.Z, L.W);
        if (order < 3) return;
        kron_rows(L.Z, L.Z, L.Z2);
        add_gram(L.s[3], L.Z2, L.W);
        if (order < 4) return;
        weight_rows(Yb, L.Z2, L.W2);
        add_gram(L.s[4], L.Z2, L.W2);
        if (order < 5) return;  // orders 5 and 6: ATV21 Alg. 4 with l = 2
        kron_rows(L.Z2, L.Z, L.Z3);
        add_gram(L.s[5], L.Z3, L.W2);
        if (order < 6) return;
        weight_rows(Yb, L.Z3, L.W3);
        add_gram(L.s[6], L.Z3, L.W3);
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
