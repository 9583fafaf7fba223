// Streaming raw moments for projected Hermite tensors of order 0..6.
//
// ATV21 (Awasthi, Tang, Vijayaraghavan, NeurIPS 2021), Alg. 4/6 with l = 1, needs
// the Hermite coefficient tensors T_r = (1/N) sum_s y_s He_r(x_s), r <= 4. relufast
// never forms them in R^d: the inputs are first projected onto a k-dimensional
// orthonormal basis P (d x k) of span(V) (found from T_2), z_s = P^T x_s, which is
// N(0, I_k) when x is N(0, I_d), and He_r contracted with P in every mode is the
// k-dimensional He_r(z). This kernel accumulates the raw sums
//   S_r[i] = sum_s y_si z_s^{(x) r},  r = 0..order,
// from which T_r follows by the pairing (delta-correction) formula, applied once
// at the end (in Python). The sums are mergeable: blocks, threads, MPI ranks and
// dask chunks reduce by addition. Cost per sample: 2 m (k + k^2 + k^3 + k^4) flops,
// as GEMMs on the row-wise Kronecker square of Z.
#pragma once

#include <vector>

#include "types.hpp"

namespace relufast {

class HermiteSums {
 public:
  // k: projected dimension; m: outputs; order: highest order (0..6; 5 and 6 serve
  // ATV21 Alg. 4 with l = 2, in the full input space, so keep k small there).
  HermiteSums(Index k, Index m, int order);

  // Adds samples X (n x d) with outputs Y (n x m). With P (d x k) the samples are
  // projected first (z = P^T x); without it d must equal k.
  void update(const ConstRowRef& X, const ConstRowRef& Y, const RowMatrixXd* P, int n_jobs,
              Index block);
  void merge(const HermiteSums& other);

  Index k() const { return k_; }
  Index m() const { return m_; }
  int order() const { return order_; }
  double count() const { return count_; }
  // sums(r): (m, k^r) row-major, row i is sum_s y_si z_s^{(x) r} flattened in C order.
  const RowMatrixXd& sums(int r) const;
  void set_state(double count, const std::vector<RowMatrixXd>& sums);

 private:
  Index k_, m_;
  int order_;
  double count_ = 0.0;
  std::vector<RowMatrixXd> sums_;  // order_ + 1 matrices
};

}  // namespace relufast
