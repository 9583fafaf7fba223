#include "certify.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "parallel.hpp"

namespace relufast {

namespace {

double nonfinite_in(const Eigen::Ref<const RowMatrixXd>& B) {
  // x - x is 0 for finite x and NaN for inf or NaN; one comparison per entry.
  return static_cast<double>((B.array() - B.array() != 0.0).count());
}

}  // namespace

Certificate certify(const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V,
                    const RowMatrixXd* U, int n_jobs, Index block, double power, bool normal_equations) {
  const Index n = X.rows(), d = X.cols(), m = Y.cols(), k = V.rows();
  if (V.cols() != d)
    throw std::invalid_argument("certify: V has " + std::to_string(V.cols()) +
                                " columns, expected d = " + std::to_string(d));
  if (Y.rows() != n)
    throw std::invalid_argument("certify: X has " + std::to_string(n) + " rows and Y " +
                                std::to_string(Y.rows()));
  if (U && (U->rows() != m || U->cols() != k))
    throw std::invalid_argument("certify: U must have shape (m, k) = (" + std::to_string(m) + ", " +
                                std::to_string(k) + ")");
  if (block < 1) throw std::invalid_argument("certify: block must be >= 1");
  if (!(power > 0.0)) throw std::invalid_argument("certify: power must be > 0");
  Certificate out;
  out.gram.setZero(k, k);
  out.cross.setZero(k, m);
  struct Local {
    Certificate c;
    RowMatrixXd F, R;
  };
  accumulate_blocks<Local>(
      n, block, n_jobs,
      [&] {
        Local L;
        L.c.gram.resize(k, k);
        L.c.cross.resize(k, m);
        return L;
      },
      [&](Local& L) {
        L.c.gram.setZero();
        L.c.cross.setZero();
        L.c.sq_residual = L.c.sq_norm = L.c.count = L.c.nonfinite = 0.0;
      },
      [&](Local& L, Index s0, Index len) {
        const auto Xb = X.middleRows(s0, len);
        const auto Yb = Y.middleRows(s0, len);
        L.c.nonfinite += nonfinite_in(Xb) + nonfinite_in(Yb);
        L.F.noalias() = Xb * V.transpose();
        L.F = L.F.cwiseMax(0.0);
        if (power != 1.0) L.F = L.F.array().pow(power).matrix();
        if (normal_equations || !U) {
          L.c.gram.noalias() += L.F.transpose() * L.F;
          L.c.cross.noalias() += L.F.transpose() * Yb;
        }
        if (U) {
          L.R = Yb;
          L.R.noalias() -= L.F * U->transpose();
          L.c.sq_residual += L.R.squaredNorm();
          L.c.sq_norm += Yb.squaredNorm();
        }
        L.c.count += static_cast<double>(len);
      },
      [&](const Local& L) {
        out.gram += L.c.gram;
        out.cross += L.c.cross;
        out.sq_residual += L.c.sq_residual;
        out.sq_norm += L.c.sq_norm;
        out.count += L.c.count;
        out.nonfinite += L.c.nonfinite;
      });
  return out;
}

double count_nonfinite(const ConstRowRef& A, int n_jobs, Index block) {
  if (block < 1) throw std::invalid_argument("count_nonfinite: block must be >= 1");
  double total = 0.0;
  accumulate_blocks<double>(
      A.rows(), block, n_jobs, [] { return 0.0; }, [](double& acc) { acc = 0.0; },
      [&](double& acc, Index s0, Index len) { acc += nonfinite_in(A.middleRows(s0, len)); },
      [&](double acc) { total += acc; });
  return total;
}

}  // namespace relufast
