#pragma once

#include <Eigen/Dense>

namespace relufast {

// Row-major, to match NumPy's C order: samples are rows.
using RowMatrixXd = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstRowRef = Eigen::Ref<const RowMatrixXd>;
using Index = Eigen::Index;

// Fortran dgemm (column-major), as scipy.linalg.cython_blas exports it.
using DgemmFn = void (*)(char*, char*, int*, int*, int*, double*, double*, int*, double*, int*, double*, double*,
                         int*);

}  // namespace relufast
