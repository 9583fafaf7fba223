// Streaming accumulation of Hermite cross moments.
//
// BJW19 Alg. 4, step 3 builds E[y (x) S_3(x)]; for ReLU that tensor is zero
// in expectation (E[relu(z) He_3(z)] = 0), so relufast uses the second-order
// moment with the output mode kept (docs/bjw19.md):
//
//   T[i] = (1/n) sum_s y_si (x_s x_s^T - I),   E T[i] = c2 sum_j U_ij v_j v_j^T.
//
// The accumulator keeps raw sums (count, sum_s y_s, sum_s y_si x_s x_s^T), so
// partial sums from blocks, threads, MPI ranks or dask chunks merge by
// addition. Cost: 2 n m d^2 flops, as one GEMM per block of samples.
#pragma once

#include <mutex>

#include "types.hpp"

namespace relufast {

class SecondMoment {
 public:
  SecondMoment(Index d, Index m);

  // Adds the samples X (n x d) with outputs Y (n x m), or, when Q (p x m) is
  // given, with outputs Y Q for Y of shape (n x p) (the output compression of
  // the pipeline, applied per block so no n x m copy is made). Sample blocks
  // are spread over threads and their partial sums are reduced
  // in block order (the sums do not depend on n_jobs). The heavy part runs
  // without the lock; only adding this call's sums to the state takes it, so
  // one accumulator may be updated from several threads at once. dgemm: a BLAS
  // dgemm safe to call from several threads at once (SciPy's, the BLAS held at one
  // thread) for the blocks' products, or nullptr for Eigen's.
  void update(const ConstRowRef& X, const ConstRowRef& Y, int n_jobs, Index block,
              const RowMatrixXd* Q = nullptr, DgemmFn dgemm = nullptr);
  void merge(const SecondMoment& other);

  // (m, d*d): row i is T[i] in row-major order (symmetrised).
  RowMatrixXd tensor() const;

  Index d() const { return d_; }
  Index m() const { return m_; }
  // Copies of the state, taken under the lock.
  double count() const;
  Eigen::VectorXd sum_y() const;
  // (d, m*d): column i*d + k holds sum_s y_si x_s x_sk.
  Eigen::MatrixXd sum_yxx() const;
  void snapshot(double& count, Eigen::VectorXd& sum_y, Eigen::MatrixXd& sum_yxx) const;
  void set_state(double count, const Eigen::VectorXd& sum_y, const Eigen::MatrixXd& sum_yxx);

 private:
  static constexpr Index kPanel = 16;
  Index d_, m_;
  double count_ = 0.0;
  Eigen::VectorXd sum_y_;
  Eigen::MatrixXd sum_yxx_;
  mutable std::mutex mu_;  // guards count_, sum_y_, sum_yxx_
};

}  // namespace relufast
