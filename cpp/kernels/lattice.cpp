#include "lattice.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "parallel.hpp"

namespace relufast {

namespace {

constexpr double kMaxEntry = 4503599627370496.0;  // 2^52: integers stay exact in a double

using Real = long double;
using RealMatrix = Eigen::Matrix<Real, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RealVector = Eigen::Matrix<Real, Eigen::Dynamic, 1>;

// <b_i, b_j> of two integer rows: in double, and exactly (128-bit integers where the
// compiler has them) when the double sum cancels (Schnorr-Euchner's test: |sum| below
// 2^-20 of |b_i| |b_j|), as it does on the knapsack lattices relufast reduces.
Real dot(const RowMatrixXd& b, const Eigen::VectorXd& norms, Index i, Index j) {
  const double s = b.row(i).dot(b.row(j));
  if (std::fabs(s) >= 9.5367431640625e-07 * norms(i) * norms(j)) return s;
#if defined(__SIZEOF_INT128__)
  __int128 acc = 0;
  for (Index c = 0; c < b.cols(); ++c)
    acc += static_cast<__int128>(static_cast<long long>(b(i, c))) * static_cast<long long>(b(j, c));
  return static_cast<Real>(acc);
#else
  Real acc = 0;
  for (Index c = 0; c < b.cols(); ++c) acc += static_cast<Real>(b(i, c)) * static_cast<Real>(b(j, c));
  return acc;
#endif
}

// Gram-Schmidt row k from the exact basis rows (Schnorr-Euchner: recomputed, not updated,
// so rounding does not accumulate across swaps). r(k, j) = <b_k, b*_j> (j < k), mu = r / |b*_j|^2,
// rr(k) = |b*_k|^2; in long double.
void gso_row(const RowMatrixXd& b, Eigen::VectorXd& norms, RealMatrix& r, RealMatrix& mu, RealVector& rr, Index k) {
  norms(k) = b.row(k).norm();
  for (Index j = 0; j < k; ++j) {
    Real s = dot(b, norms, k, j);
    for (Index i = 0; i < j; ++i) s -= mu(j, i) * r(k, i);
    r(k, j) = s;
    mu(k, j) = s / rr(j);
  }
  Real s = dot(b, norms, k, k);
  for (Index j = 0; j < k; ++j) s -= mu(k, j) * r(k, j);
  rr(k) = s;
}

}  // namespace

LllResult lll_reduce(const ConstRowRef& B, double delta, long long max_swaps) {
  if (!(delta > 0.25 && delta < 1.0)) throw std::invalid_argument("lll_reduce: delta must be in (1/4, 1); got " + std::to_string(delta));
  const Index n = B.rows();
  for (Index i = 0; i < B.rows(); ++i)
    for (Index j = 0; j < B.cols(); ++j) {
      const double v = B(i, j);
      if (!std::isfinite(v) || std::fabs(v) >= kMaxEntry || v != std::nearbyint(v))
        throw std::invalid_argument("lll_reduce: entries must be integers below 2^52 in magnitude; got " +
                                    std::to_string(v) + " at (" + std::to_string(i) + ", " + std::to_string(j) + ")");
    }
  LllResult out;
  out.basis = B;
  if (n == 0) {
    out.complete = true;
    return out;
  }
  RowMatrixXd& b = out.basis;
  RealMatrix r = RealMatrix::Zero(n, n), mu = RealMatrix::Zero(n, n);
  RealVector rr = RealVector::Zero(n);
  Eigen::VectorXd norms = Eigen::VectorXd::Zero(n);
  Eigen::RowVectorXd scratch;
  auto dependent = [] { throw std::invalid_argument("lll_reduce: the rows of B are linearly dependent"); };
  gso_row(b, norms, r, mu, rr, 0);
  if (!(rr(0) > 0.0)) dependent();
  Index k = 1;
  while (k < n) {
    checkpoint();
    // Size reduction of row k; repeated while a large multiplier was used (its rounding
    // makes the recomputed coefficients the reliable ones).
    for (int pass = 0; pass < 64; ++pass) {
      gso_row(b, norms, r, mu, rr, k);
      bool large = false;
      for (Index j = k - 1; j >= 0; --j) {
        const Real ql = std::nearbyint(mu(k, j));
        if (ql == 0) continue;
        const double q = static_cast<double>(ql);
        if (std::fabs(q) > 67108864.0) large = true;  // 2^26
        b.row(k) -= q * b.row(j);
        for (Index i = 0; i < j; ++i) mu(k, i) -= ql * mu(j, i);
        mu(k, j) -= ql;
      }
      if (b.row(k).cwiseAbs().maxCoeff() >= kMaxEntry)
        throw std::overflow_error("lll_reduce: an entry grew past 2^52 (scale the basis down)");
      if (!large) break;
    }
    gso_row(b, norms, r, mu, rr, k);
    if (!(rr(k) > 0.0)) dependent();
    if (delta * rr(k - 1) > rr(k) + mu(k, k - 1) * mu(k, k - 1) * rr(k - 1)) {
      if (out.swaps >= max_swaps) return out;
      scratch = b.row(k);
      b.row(k) = b.row(k - 1);
      b.row(k - 1) = scratch;
      ++out.swaps;
      if (k == 1) {
        gso_row(b, norms, r, mu, rr, 0);
      } else {
        --k;
      }
    } else {
      ++k;
    }
  }
  out.complete = true;
  return out;
}

}  // namespace relufast
