// Exact refinement of approximate hidden-unit directions.
//
// BJW19 Alg. 5 (Thm 6), in the margin-based form of docs/bjw19.md:
// for an approximate row v (unit norm, sign unknown) and each sign q = +-1,
//   step 2-3: Z_q = { j : q (X v)_j < -gamma } are coordinates confidently off;
//             the row-span vectors of the outputs that vanish on Z_q are the
//             null space of B[:, Z_q] (B: k x l orthonormal basis of the span);
//   step 4:   accept q when that null space is one-dimensional and the other
//             sign's is not; r = w B is then (a multiple of) relu(X v*);
//   step 5:   v* solves X_S v = phi^{-1}(r_S) on the support S = {r > 0}
//             (|S| >= d, rank X_S = d), by column-pivoted Householder QR.
// Verification: phi(X v*) must lie in the output span (relative residual of
// its projection below tol_verify) and its support must equal S.
// phi(t) = relu(t)^p (p = 1 is ReLU). For positively homogeneous phi the
// unknown scale of r only rescales v*, which is then normalised (Sec. 9.1).
#pragma once

#include <vector>

#include "types.hpp"

namespace relufast {

struct RefineOptions {
  std::vector<double> margins{0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.3, 1.6};
  double tol_null = 1e-10;    // s_k / s_1 below this: a null vector exists
  double tol_gap = 1e-6;      // s_{k-1} / s_1 above this: the null space is 1-dimensional
  double tol_verify = 1e-9;   // relative distance of relu(X v*) from the output span
  double tol_support = 1e-9;  // r_j > tol_support * max r counts as positive
  Index min_zeros = 0;        // 0 means 2k + 5
  double power = 1.0;         // activation relu(t)^power (BJW19 Sec. 9.1, homogeneous case)
  bool approximate = true;    // solve an approximate row when none certifies (noisy outputs)
};

struct RowCertificate {
  bool certified = false;     // passed every check: the row is exact
  bool solved = false;        // a row was computed (possibly only approximately)
  int sign = 0;               // +1 if v points like the true row, -1 if it must be flipped
  double margin = 0.0;        // margin gamma that produced the row
  double null_ratio = 1.0;    // s_k / s_1 for the chosen sign
  double gap_ratio = 0.0;     // s_{k-1} / s_1 for the chosen sign
  double other_ratio = 1.0;   // s_k / s_1 for the other sign (1 if unusable)
  Index n_zero = 0;           // |Z_q|
  Index support = 0;          // |S|
  double verify_residual = 1.0;
  Eigen::VectorXd row;        // unit-norm recovered row (size d) when solved
};

// B: k x l with orthonormal rows spanning the columns of the outputs on the
// refinement samples; X: l x d refinement samples; Vhat: c x d candidates.
// Candidates are processed in parallel; the result does not depend on n_jobs.
std::vector<RowCertificate> refine_rows(const ConstRowRef& B, const ConstRowRef& X,
                                        const ConstRowRef& Vhat, const RefineOptions& opts,
                                        int n_jobs);

}  // namespace relufast
