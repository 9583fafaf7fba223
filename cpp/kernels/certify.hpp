// The certificate of a recovered network, fused into one pass over the samples
// (relufast issue 12; the residual check that ends BJW19 Thm 7 / Alg. 5 and every
// exact method). No Python in here.
//
// For each block of samples, read once: F = relu(X V^T)^power, the normal equations
// of the output layer (gram = F^T F, cross = F^T Y), and, when U is given, the
// squared residual ||Y - F U^T||_F^2 and ||Y||_F^2; non-finite entries of X and Y
// are counted on the way, so a NaN anywhere is seen without an n x d mask.
#pragma once

#include <Eigen/Dense>

#include "types.hpp"

namespace relufast {

struct Certificate {
  Eigen::MatrixXd gram;   // k x k
  Eigen::MatrixXd cross;  // k x m
  double sq_residual = 0.0;
  double sq_norm = 0.0;
  double count = 0.0;
  double nonfinite = 0.0;  // non-finite entries of X and Y
};

// One pass over (X, Y): see the header comment. U (m x k) may be null. With
// normal_equations false (and U given) gram and cross are skipped: the residual
// alone then costs what a plain check of the network costs.
Certificate certify(const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V,
                    const RowMatrixXd* U, int n_jobs, Index block, double power = 1.0,
                    bool normal_equations = true);

// Number of non-finite entries of A, read in row blocks by n_jobs threads.
double count_nonfinite(const ConstRowRef& A, int n_jobs, Index block);

}  // namespace relufast
