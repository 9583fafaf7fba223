// Contractions of the fourth-order Hermite statistic of GP19 (Goel and
// Panigrahy, "Recovering the lowest layer of deep networks with high threshold
// activations", 2019), Step 1 (Sec. 2.1, App. B.1-B.4), streamed and mergeable.
//
// For outputs f, a known offset c0 (the median of f, preprocessing P0) and
// directions z_r (rows of Z, R x n), with y_r = z_r . x and ft = f - c0:
//
//   E[ft H_4(z.x)] = (S4 - 6 r S2 + 3 r^2 S0) / (sqrt(24) N),  r = |z|^2,
//   grad_z         = (4 G3 - 12 r G1 - 12 S2 z + 12 r S0 z) / (sqrt(24) N),
//   E[ft H_3(z.x)] = (S3 - 3 r S1) / (sqrt(6) N),
//
// with S_p = sum ft y^p, G_p = sum ft y^p x. The kernel keeps exactly these sums
// (never an n^4 tensor): 2 N_act n R flops for y, 4 N_act n R for G1 and G3.
// Optionally it also keeps M = sum ft x x^T (the second moment M_2 of P2) and the
// pair sums of the simultaneous landscape (App. B.4): S11 = sum ft y_j y_k,
// S22 = sum ft y_j^2 y_k^2 and GP_j = sum ft y_j (sum_{k != j} y_k^2) x.
//
// Active-row filtering (P1): after removing c0, a row where no unit is active
// has ft = 0 and contributes nothing to any sum, so rows with |ft| <= active_tol
// are skipped before any arithmetic (they still count in N). active_tol < 0
// turns the filter off. Rows are gathered per block of samples into a compact
// buffer; partial sums are reduced in a fixed group order (parallel.hpp), so the
// result does not depend on the thread count.
#pragma once

#include <mutex>

#include "types.hpp"

namespace relufast {

class Hermite4Contraction {
 public:
  // Z: R x n directions (R may be 0 when only M is wanted).
  Hermite4Contraction(const RowMatrixXd& Z, double offset, double active_tol, bool second, bool pairs);

  void update(const ConstRowRef& X, const Eigen::Ref<const Eigen::VectorXd>& f, int n_jobs, Index block);
  void merge(const Hermite4Contraction& other);
  // Replaces the raw sums (e.g. by sums reduced over MPI ranks); shapes must match.
  void set_state(double count, double n_active, double s0, const RowMatrixXd& S, const RowMatrixXd& G1,
                 const RowMatrixXd& G3, const RowMatrixXd& M, const RowMatrixXd& S11, const RowMatrixXd& S22,
                 const RowMatrixXd& GP);

  // Every read takes the lock and returns a copy, so a concurrent update is never half seen.
  Index n() const { return n_; }
  Index r() const { return Z_.rows(); }
  double count() const { return locked(count_); }
  double n_active() const { return locked(n_active_); }
  double s0() const { return locked(s0_); }
  RowMatrixXd S() const { return locked(S_); }     // R x 4: sum ft y^p, p = 1..4
  RowMatrixXd G1() const { return locked(G1_); }   // R x n
  RowMatrixXd G3() const { return locked(G3_); }   // R x n
  RowMatrixXd M() const { return locked(M_); }     // n x n (0 x 0 unless second)
  RowMatrixXd S11() const { return locked(S11_); } // R x R (0 x 0 unless pairs)
  RowMatrixXd S22() const { return locked(S22_); } // R x R
  RowMatrixXd GP() const { return locked(GP_); }   // R x n (0 x 0 unless pairs)

 private:
  RowMatrixXd Z_;
  double offset_, active_tol_;
  bool second_, pairs_;
  Index n_;
  double count_ = 0.0, n_active_ = 0.0, s0_ = 0.0;
  RowMatrixXd S_, G1_, G3_, M_, S11_, S22_, GP_;
  // Guards the sums: an update computes its own sums without it and adds them under it,
  // so concurrent updates of one accumulator run in parallel and none is lost.
  mutable std::mutex mu_;
  template <class T>
  T locked(const T& v) const {
    std::lock_guard<std::mutex> lock(mu_);
    return v;
  }
};

}  // namespace relufast
