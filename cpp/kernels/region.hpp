// Activation-region refinement (relufast's own exact step for biased networks).
//
// For y = U relu(V x + b) + c and a current estimate (V, b, U, c), a sample whose
// pre-activations p = V x + b all satisfy |p_i| > margin_i has a "certain" activation
// pattern s = 1{p > 0}. If the pattern is also the true one, the residual
// r = y - U relu(p) - c of the current network is affine in x on that sample:
//   r = sum_{i: s_i = 1} dC_i^T [x; 1] + dc,   dC_i = (true - current) U_i (v_i, b_i).
// region_systems accumulates, in one threaded pass, the normal equations of that
// least-squares problem per populated region (pattern key): count, G = sum [x;1][x;1]^T,
// H = sum [x;1] r^T and sum ||r||^2, so the joint solve over all regions needs no second
// look at the samples. The same pass accumulates, over all samples, the statistics of
// the output-layer fit with the current (V, b): F1 = [relu(V x + b), 1],
// F1^T F1, F1^T r, ||r||^2 and ||y||^2 (the certificate).
// region_residuals returns per sample ||r - linearised update|| for trimming.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "types.hpp"

namespace relufast {

using BoolVector = Eigen::Matrix<bool, Eigen::Dynamic, 1>;

struct RegionSystems {
  Index n_words = 0;                 // 64-bit words per pattern key (bit i: unit i active)
  std::vector<std::uint64_t> keys;   // n_regions * n_words, sorted by key
  Eigen::VectorXd counts;            // samples per region
  RowMatrixXd gram;                  // n_regions x (D*D), D = d + 1
  RowMatrixXd cross;                 // n_regions x (D*m)
  Eigen::VectorXd sq_res;            // sum of ||r||^2 per region
  Eigen::MatrixXd fgram;             // (k+1) x (k+1): F1^T F1 over all samples
  Eigen::MatrixXd fcross;            // (k+1) x m: F1^T r over all samples
  double sq_residual = 0.0;          // ||r||^2 over all samples
  double sq_norm = 0.0;              // ||y||^2 over all samples
  double n_certain = 0.0;            // samples with a certain pattern (and not masked)
  double count = 0.0;
};

// margin: (k) per-unit margins (>= 0); mask: optional (n) samples to use in the
// region systems (false: trimmed); the global statistics always use every sample.
// Throws std::invalid_argument when more than max_regions regions are populated.
RegionSystems region_systems(const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V,
                             const Eigen::VectorXd& b, const RowMatrixXd& U, const Eigen::VectorXd& c,
                             const Eigen::VectorXd& margin, const BoolVector* mask,
                             Index max_regions, int n_jobs, Index block);

// Per-sample ||r_s - sum_{i active} dC_i^T [x_s; 1] - dc|| for certain samples, NaN
// otherwise. dC: k x (D*m), row i is dC_i (D x m) in row-major order.
Eigen::VectorXd region_residuals(const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V,
                                 const Eigen::VectorXd& b, const RowMatrixXd& U,
                                 const Eigen::VectorXd& c, const Eigen::VectorXd& margin,
                                 const RowMatrixXd& dC, const Eigen::VectorXd& dc, int n_jobs,
                                 Index block);

}  // namespace relufast
