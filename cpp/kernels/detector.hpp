// The pure-neuron detector of GKLW19 (Ge, Kuditipudi, Li, Wang, ICLR 2019),
// Algorithms 2-3, in the covariance form of docs/gklw19.md:
//
//   T3 vec*(U) = Cov( phi(x), <U, Psi(x, y)> ),   T2 vec*(U) = E[ phi(x) <U, Psi(x, y)> ],
//   phi(x) = vech(x x^T) with sqrt(2) weights off the diagonal (an isometry of
//   the d^2 rows of the paper's T), Psi = y yt^T + yt y^T - y y^T with the linear
//   predictor yt = M x, M = P C^{-1} (P = E[y x^T], C = E[x x^T]) from a first pass.
//   Columns of Psi*: (a,a) -> 2 y_a yt_a - y_a^2, (a,c) a<c -> 2 (y_a yt_c + y_c yt_a - y_a y_c).
//
// The accumulator keeps sum phi psi^T (D1 x D2), sum phi, sum psi and the count,
// so it merges like every relufast moment; cost 2 n D1 D2 flops as one GEMM per
// block (D1 = d(d+1)/2, D2 = k(k+1)/2), never the k d^3 tensor of the paper.
#pragma once

#include <mutex>

#include "types.hpp"

namespace relufast {

class DetectorMoment {
 public:
  // M: k x d linear predictor P C^{-1}.
  explicit DetectorMoment(const RowMatrixXd& M);
  void update(const ConstRowRef& X, const ConstRowRef& Y, int n_jobs, Index block);
  void merge(const DetectorMoment& other);
  Index d() const { return d_; }
  Index k() const { return k_; }
  // Copies of the state, taken under the lock.
  double count() const;
  Eigen::MatrixXd sum_phipsi() const;
  Eigen::VectorXd sum_phi() const;
  Eigen::VectorXd sum_psi() const;
  void snapshot(double& count, Eigen::MatrixXd& sum_phipsi, Eigen::VectorXd& sum_phi,
                Eigen::VectorXd& sum_psi) const;
  // Replaces the raw sums (used to install sums reduced across processes).
  void set_state(double count, const Eigen::MatrixXd& sum_phipsi, const Eigen::VectorXd& sum_phi,
                 const Eigen::VectorXd& sum_psi);
  // D1 x D2: centred (noise-corrected, Alg. 3) or not (Alg. 2).
  Eigen::MatrixXd matrix(bool centred) const;

 private:
  Index d_, k_;
  RowMatrixXd M_;
  double count_ = 0.0;
  Eigen::MatrixXd sum_phipsi_;
  Eigen::VectorXd sum_phi_, sum_psi_;
  mutable std::mutex mu_;  // guards count_ and the sums: updates may come from several threads
};

}  // namespace relufast
