// Lattice basis reduction: LLL (Lenstra, Lenstra, Lovasz 1982) in the floating-point form of
// Schnorr and Euchner (1994). relufast uses it for the signs of a layer wider than the
// equations that fix them (a 0/1 combination of real vectors that hits a target: a
// low-density subset-sum problem, solved by a short vector of an embedding lattice).
#pragma once

#include "types.hpp"

namespace relufast {

struct LllResult {
  RowMatrixXd basis;    // the reduced rows (same lattice as the input rows)
  long long swaps = 0;  // Lovasz swaps performed
  bool complete = false;  // false: stopped at max_swaps (the basis is still a basis, only less reduced)
};

// Reduces the rows of B (integers held in doubles, |entries| < 2^52, linearly independent)
// with Lovasz parameter delta in (1/4, 1). Throws std::invalid_argument on entries that are
// not integers or too large, or on dependent rows; std::overflow_error when an entry grows
// past 2^52 during the reduction. Checks the running call's cancellation between swaps.
LllResult lll_reduce(const ConstRowRef& B, double delta, long long max_swaps);

}  // namespace relufast
