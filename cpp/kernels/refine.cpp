#include "refine.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "parallel.hpp"

namespace relufast {
namespace {

struct SignProbe {
  bool usable = false;
  double null_ratio = 1.0;
  double gap_ratio = 0.0;
  Eigen::VectorXd null_vector;  // k
  Index n_zero = 0;
};

SignProbe probe(const ConstRowRef& B, const Eigen::VectorXd& p, int q, double gamma, Index min_zeros) {
  SignProbe out;
  const Index k = B.rows(), l = B.cols();
  std::vector<Index> Z;
  Z.reserve(l);
  for (Index j = 0; j < l; ++j)
    if (q * p(j) < -gamma) Z.push_back(j);
  out.n_zero = static_cast<Index>(Z.size());
  // Fewer than k rows leave B[:, Z]^T with fewer than k singular values: not
  // a test of a one-dimensional null space (and s(k - 1) would not exist).
  if (out.n_zero < std::max(min_zeros, k)) return out;
  Eigen::MatrixXd M(out.n_zero, k);  // B[:, Z]^T
  for (Index r = 0; r < out.n_zero; ++r) M.row(r) = B.col(Z[r]).transpose();
  // The singular values and right singular vectors of the tall M are those of the
  // k x k triangular factor of its (blocked, backward-stable) Householder QR: the
  // Jacobi SVD then runs on k x k instead of n_zero x k.
  Eigen::HouseholderQR<Eigen::MatrixXd> qr(M);
  const Eigen::MatrixXd R = qr.matrixQR().topRows(k).template triangularView<Eigen::Upper>();
  Eigen::JacobiSVD<Eigen::MatrixXd> svd(R, Eigen::ComputeFullV);
  const Eigen::VectorXd& s = svd.singularValues();
  // Scale of B[:, Z]: its largest singular value; for k = 1 that is the quantity under
  // test, so use the size B[:, Z] would have if its entries were typical of B.
  const double scale = k >= 2 ? s(0) : B.norm() * std::sqrt(double(out.n_zero) / double(l));
  if (!(scale > 0.0)) return out;
  out.usable = true;
  out.null_ratio = s(k - 1) / scale;
  out.gap_ratio = k >= 2 ? s(k - 2) / scale : 1.0;
  out.null_vector = svd.matrixV().col(k - 1);
  return out;
}

// Step 5: solve X_S v = r_S; fills row, support, verify_residual, certified.
void solve_row(const ConstRowRef& B, const ConstRowRef& X, const Eigen::VectorXd& w,
               const RefineOptions& opts, double tol_support, RowCertificate& c) {
  const Index l = B.cols(), d = X.cols();
  Eigen::VectorXd r = B.transpose() * w;  // l
  if (r.sum() < 0) r = -r;
  const double rmax = r.maxCoeff();
  if (!(rmax > 0.0)) return;
  std::vector<Index> S;
  for (Index j = 0; j < l; ++j)
    if (r(j) > tol_support * rmax) S.push_back(j);
  c.support = static_cast<Index>(S.size());
  if (c.support < d) return;
  Eigen::MatrixXd XS(c.support, d);
  Eigen::VectorXd rS(c.support);
  for (Index i = 0; i < c.support; ++i) {
    XS.row(i) = X.row(S[i]);
    rS(i) = r(S[i]) / rmax;
    if (opts.power != 1.0) rS(i) = std::pow(rS(i), 1.0 / opts.power);  // phi^{-1}
  }
  // Blocked Householder QR (least squares on the support); a rank-deficient X_S shows as
  // a negligible diagonal entry of R. The verification below decides certification
  // whatever the solve returns.
  Eigen::HouseholderQR<Eigen::MatrixXd> qr(XS);
  const auto Rd = qr.matrixQR().diagonal().cwiseAbs();
  if (!(Rd.minCoeff() > 1e-10 * Rd.maxCoeff())) return;
  Eigen::VectorXd z = qr.solve(rS);
  const double nz = z.norm();
  if (!(nz > 0.0) || !std::isfinite(nz)) return;
  c.row = z / nz;
  c.solved = true;
  // Certificate: t = relu(X z) must lie in span(B) (B orthonormal rows) with support S.
  Eigen::VectorXd t = (X * z).cwiseMax(0.0);
  if (opts.power != 1.0) t = t.array().pow(opts.power).matrix();
  const double tn = t.norm();
  if (!(tn > 0.0)) return;
  Eigen::VectorXd proj = B.transpose() * (B * t);
  c.verify_residual = (t - proj).norm() / tn;
  const double tmax = t.maxCoeff();
  Index agree = 0, positive = 0;
  for (Index j = 0; j < l; ++j) {
    const bool pos = t(j) > tol_support * tmax;
    positive += pos;
  }
  for (Index j : S) agree += t(j) > tol_support * tmax;
  c.certified = c.verify_residual < opts.tol_verify && agree == c.support && positive == c.support;
}

RowCertificate refine_one(const ConstRowRef& B, const ConstRowRef& X, const Eigen::VectorXd& vhat,
                          const RefineOptions& opts) {
  const Index k = B.rows();
  const Index min_zeros = opts.min_zeros > 0 ? opts.min_zeros : 2 * k + 5;
  RowCertificate best;  // best approximate candidate if nothing certifies
  double best_score = -1.0;
  SignProbe best_probe;
  int best_sign = 0;
  double best_margin = 0.0, best_other = 1.0;
  Eigen::VectorXd p = X * vhat;
  for (double gamma : opts.margins) {
    SignProbe pr[2] = {probe(B, p, +1, gamma, min_zeros), probe(B, p, -1, gamma, min_zeros)};
    for (int a = 0; a < 2; ++a) {
      const SignProbe& mine = pr[a];
      const SignProbe& other = pr[1 - a];
      if (!mine.usable) continue;
      const double other_ratio = other.usable ? other.null_ratio : 1.0;
      const bool exact = mine.null_ratio < opts.tol_null && mine.gap_ratio > opts.tol_gap &&
                         other_ratio > opts.tol_gap;
      if (exact) {
        RowCertificate c;
        c.sign = a == 0 ? +1 : -1;
        c.margin = gamma;
        c.null_ratio = mine.null_ratio;
        c.gap_ratio = mine.gap_ratio;
        c.other_ratio = other_ratio;
        c.n_zero = mine.n_zero;
        solve_row(B, X, mine.null_vector, opts, opts.tol_support, c);
        if (c.certified) return c;
      }
      // Approximate choice: the sign whose null space is most clearly
      // one-dimensional relative to the other sign and to its own gap.
      const double score = std::min(other_ratio, mine.gap_ratio) / std::max(mine.null_ratio, 1e-300);
      if (score > best_score) {
        best_score = score;
        best_probe = mine;
        best_sign = a == 0 ? +1 : -1;
        best_margin = gamma;
        best_other = other_ratio;
      }
    }
  }
  if (best_sign != 0) {
    best.sign = best_sign;
    best.margin = best_margin;
    best.null_ratio = best_probe.null_ratio;
    best.gap_ratio = best_probe.gap_ratio;
    best.other_ratio = best_other;
    best.n_zero = best_probe.n_zero;
    // With noise, r is only approximately zero off the support; count as
    // positive what stands clearly above the noise level of the null vector.
    const double tol = std::max(opts.tol_support, std::min(0.5, 100.0 * best_probe.null_ratio));
    solve_row(B, X, best_probe.null_vector, opts, tol, best);
    best.certified = false;
  }
  return best;
}

}  // namespace

std::vector<RowCertificate> refine_rows(const ConstRowRef& B, const ConstRowRef& X,
                                        const ConstRowRef& Vhat, const RefineOptions& opts,
                                        int n_jobs) {
  const Index k = B.rows(), l = B.cols(), d = X.cols();
  if (k < 1) throw std::invalid_argument("refine_rows: B must have at least one row");
  if (X.rows() != l)
    throw std::invalid_argument("refine_rows: B has " + std::to_string(l) + " columns but X has " +
                                std::to_string(X.rows()) + " rows");
  if (Vhat.cols() != d)
    throw std::invalid_argument("refine_rows: Vhat has " + std::to_string(Vhat.cols()) +
                                " columns, expected d = " + std::to_string(d));
  if (opts.margins.empty()) throw std::invalid_argument("refine_rows: margins must not be empty");
  if (!(opts.power > 0.0)) throw std::invalid_argument("refine_rows: power must be > 0");
  if (opts.min_zeros < 0 || (opts.min_zeros > 0 && opts.min_zeros < k))
    throw std::invalid_argument("refine_rows: min_zeros must be 0 (automatic: 2k + 5) or at least k = " +
                                std::to_string(k) + " (a null space in R^k needs k vanishing coordinates); got " +
                                std::to_string(opts.min_zeros));
  const Index c = Vhat.rows();
  std::vector<RowCertificate> out(c);
  parallel_for(c, n_jobs, [&](long long i) {
    Eigen::VectorXd v = Vhat.row(i).transpose();
    const double nv = v.norm();
    if (!(nv > 0.0) || !std::isfinite(nv)) return;
    out[i] = refine_one(B, X, v / nv, opts);
  });
  return out;
}

}  // namespace relufast
