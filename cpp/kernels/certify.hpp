// The one pass over the samples that fits and certifies a recovered network
// (the residual check that ends BJW19 Thm 7 / Alg. 5 and every
// exact method; the normal equations of the output layer, Thm 1 proof / Lemma 20).
// No Python in here.
//
// For each block of samples, read once: F = relu(X V^T + b)^power (with a constant
// column 1 appended when `intercept`, so the output offset c is the last column of
// U), the normal equations gram = F^T F, cross = F^T Y, and, when U is given, the
// squared residual ||Y - F U^T||_F^2 and ||Y||_F^2; optionally the non-finite
// entries of X and Y are counted on the way, so a NaN anywhere is seen without an
// n x d mask. `certify` and `relu_stats` are two views of this one pass.
#pragma once

#include <string>

#include <Eigen/Dense>

#include "types.hpp"

namespace relufast {

struct NetworkStats {
  Eigen::MatrixXd gram;   // k x k (k + 1 with the intercept)
  Eigen::MatrixXd cross;  // k x m
  double sq_residual = 0.0;
  double sq_norm = 0.0;
  double count = 0.0;
  double nonfinite = 0.0;  // non-finite entries of X and Y (when counted)
};
using Certificate = NetworkStats;
using ReluStats = NetworkStats;

struct PassOptions {
  double power = 1.0;
  const Eigen::VectorXd* b = nullptr;  // hidden biases (k), or none
  bool intercept = false;              // append a constant feature (the offset c)
  bool normal_equations = true;        // with U given, false skips gram and cross
  bool count_nonfinite = false;
};

// The shared pass (see the header comment). U (m x k, or m x (k + 1) with the
// intercept) may be null; `name` prefixes the messages of std::invalid_argument.
NetworkStats network_pass(const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V,
                          const RowMatrixXd* U, int n_jobs, Index block, const PassOptions& opt,
                          const std::string& name);

// The certificate: relu^power without biases, non-finite entries counted. With
// normal_equations false (and U given) gram and cross are skipped: the residual
// alone then costs what a plain check of the network costs.
Certificate certify(const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V,
                    const RowMatrixXd* U, int n_jobs, Index block, double power = 1.0,
                    bool normal_equations = true);

// The fit statistics with optional biases and intercept (always the normal
// equations; no finiteness count).
ReluStats relu_stats(const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V,
                     const RowMatrixXd* U, int n_jobs, Index block, double power = 1.0,
                     const Eigen::VectorXd* b = nullptr, bool intercept = false);

// Number of non-finite entries of A, read in row blocks by n_jobs threads.
double count_nonfinite(const ConstRowRef& A, int n_jobs, Index block);

}  // namespace relufast
