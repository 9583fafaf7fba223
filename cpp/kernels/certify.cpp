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

void check_shapes(const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V, const RowMatrixXd* U,
                  Index block, const PassOptions& opt, const std::string& name) {
  const Index d = X.cols(), m = Y.cols(), k0 = V.rows();
  const Index k = k0 + (opt.intercept ? 1 : 0);
  if (V.cols() != d)
    throw std::invalid_argument(name + ": V has " + std::to_string(V.cols()) + " columns, expected d = " +
                                std::to_string(d));
  if (Y.rows() != X.rows())
    throw std::invalid_argument(name + ": X has " + std::to_string(X.rows()) + " rows and Y " +
                                std::to_string(Y.rows()));
  if (U && (U->rows() != m || U->cols() != k))
    throw std::invalid_argument(name + ": U must have shape (m, k) = (" + std::to_string(m) + ", " +
                                std::to_string(k) + ")" + (opt.intercept ? ", the last column being c" : ""));
  if (opt.b && opt.b->size() != k0) throw std::invalid_argument(name + ": b must have k entries");
  if (block < 1) throw std::invalid_argument(name + ": block must be >= 1");
  if (!(opt.power > 0.0)) throw std::invalid_argument(name + ": power must be > 0");
}

void add(NetworkStats& to, const NetworkStats& s) {
  to.gram += s.gram;
  to.cross += s.cross;
  to.sq_residual += s.sq_residual;
  to.sq_norm += s.sq_norm;
  to.count += s.count;
  to.nonfinite += s.nonfinite;
}

}  // namespace

NetworkStats network_pass(const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V,
                          const RowMatrixXd* U, int n_jobs, Index block, const PassOptions& opt,
                          const std::string& name) {
  check_shapes(X, Y, V, U, block, opt, name);
  const Index n = X.rows(), m = Y.cols(), k0 = V.rows();
  const Index k = k0 + (opt.intercept ? 1 : 0);  // features: the k0 units, then a constant 1
  const bool normal = opt.normal_equations || !U;
  NetworkStats out;
  out.gram.setZero(k, k);
  out.cross.setZero(k, m);
  struct Local {
    NetworkStats s;
    RowMatrixXd F, R;
  };
  accumulate_blocks<Local>(
      n, block, n_jobs,
      [&] {
        Local L;
        L.s.gram.resize(k, k);
        L.s.cross.resize(k, m);
        return L;
      },
      [&](Local& L) {
        L.s.gram.setZero();
        L.s.cross.setZero();
        L.s.sq_residual = L.s.sq_norm = L.s.count = L.s.nonfinite = 0.0;
      },
      [&](Local& L, Index s0, Index len) {
        const auto Xb = X.middleRows(s0, len);
        const auto Yb = Y.middleRows(s0, len);
        if (opt.count_nonfinite) L.s.nonfinite += nonfinite_in(Xb) + nonfinite_in(Yb);
        L.F.resize(len, k);
        L.F.leftCols(k0).noalias() = Xb * V.transpose();
        if (opt.b) L.F.leftCols(k0).rowwise() += opt.b->transpose();
        L.F.leftCols(k0) = L.F.leftCols(k0).cwiseMax(0.0);
        if (opt.power != 1.0) L.F.leftCols(k0) = L.F.leftCols(k0).array().pow(opt.power).matrix();
        if (opt.intercept) L.F.col(k0).setOnes();
        if (normal) {
          L.s.gram.noalias() += L.F.transpose() * L.F;
          L.s.cross.noalias() += L.F.transpose() * Yb;
        }
        if (U) {
          L.R = Yb;
          L.R.noalias() -= L.F * U->transpose();
          L.s.sq_residual += L.R.squaredNorm();
          L.s.sq_norm += Yb.squaredNorm();
        }
        L.s.count += static_cast<double>(len);
      },
      [&](const Local& L) { add(out, L.s); });
  return out;
}

Certificate certify(const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V,
                    const RowMatrixXd* U, int n_jobs, Index block, double power, bool normal_equations) {
  PassOptions opt;
  opt.power = power;
  opt.normal_equations = normal_equations;
  opt.count_nonfinite = true;
  return network_pass(X, Y, V, U, n_jobs, block, opt, "certify");
}

ReluStats relu_stats(const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V,
                     const RowMatrixXd* U, int n_jobs, Index block, double power,
                     const Eigen::VectorXd* b, bool intercept) {
  PassOptions opt;
  opt.power = power;
  opt.b = b;
  opt.intercept = intercept;
  return network_pass(X, Y, V, U, n_jobs, block, opt, "relu_stats");
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
