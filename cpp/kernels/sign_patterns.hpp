// Candidate sign patterns (positive sets) of vectors in the row span of the
// outputs, for BJW19 Algorithms 1-2 (Lemma 1) and the extreme-ray shortcut of
// (docs/bjw19.md).
//
// B is k x n with rows spanning the output span (samples are columns here).
//  * Vertices (Lemma 1): for every k-subset J with B[:, J] nonsingular and every
//    b in {0,1}^k \ {0}, w solves B[:, J]^T w = b and r = w B gives the positive
//    set {j : r_j > tol * max|r|}. Every realizable positive set is produced
//    (its LP {r >= 1 on S, r <= 0 off S} has such a vertex); C(n,k)(2^k - 1)
//    systems of cost O(k^3 + n k).
//  * Rays: for every (k-1)-subset J, the null vector z of B[:, J]^T (when it is
//    one-dimensional) and its negation; z B >= -tol * max|z B| makes z an
//    extreme ray of {z : z B >= 0}. The rows of relu(V X) are such rays
//    (BJW19 Lemma 10), so these are tried first. C(n, k-1) systems.
// Subsets are visited in lexicographic rank order; a call covers ranks
// [begin, end) so callers can stream, report progress and stop early. Results
// are deduplicated and returned in rank order whatever the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "types.hpp"

namespace relufast {

enum class PatternMode { Vertices, Rays };

struct PatternBatch {
  Index n_words = 0;                 // 64-bit words per pattern
  std::vector<std::uint64_t> words;  // count * n_words, bit j of pattern = sample j positive
  RowMatrixXd coeffs;                // count x k: r = coeffs.row(c) * B realises pattern c
  long long systems = 0;             // linear systems solved
};

// Largest k of the "vertices" mode: its 2^k - 1 right-hand sides per subset
// are enumerated as 64-bit masks (and beyond ~30 could never finish anyway).
constexpr Index kMaxVerticesK = 62;

// Number of subsets the mode visits: C(n, k) or C(n, k-1), in exact integer
// arithmetic; throws std::invalid_argument when it reaches 2^62 or when k is
// out of range for the mode.
long long pattern_subset_count(Index n, Index k, PatternMode mode);

PatternBatch enumerate_patterns(const ConstRowRef& B, PatternMode mode, long long begin,
                                long long end, double tol, int n_jobs);

// The same systems on explicit subsets (rows of `subsets`, k or k-1 indices each), e.g.
// random ones: a random (k-1)-subset lies in the zero set of a given rectified row with
// probability about 2^-(k-1), so a few hundred of them usually find every row long
// before the lexicographic enumeration would.
using IndexMatrix = Eigen::Matrix<Index, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
PatternBatch enumerate_patterns_for(const ConstRowRef& B, PatternMode mode,
                                    const Eigen::Ref<const IndexMatrix>& subsets, double tol,
                                    int n_jobs);

}  // namespace relufast
