#include "sign_patterns.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "parallel.hpp"

namespace relufast {
namespace {

constexpr long long kSubsetCap = 1LL << 62;

// Binomial coefficient C(n, r) in exact integer arithmetic, saturating at
// kSubsetCap. Each step C(n-r+i, i) = C(n-r+i-1, i-1) (n-r+i) / i is exact;
// the product is below 2^62 * 2^63, so it fits in 128 bits.
long long binom(long long n, long long r) {
  if (r < 0 || n < 0 || r > n) return 0;
  r = std::min(r, n - r);
#if defined(__SIZEOF_INT128__)
  unsigned __int128 acc = 1;
  for (long long i = 1; i <= r; ++i) {
    acc = acc * static_cast<unsigned __int128>(n - r + i) / static_cast<unsigned __int128>(i);
    if (acc >= static_cast<unsigned __int128>(kSubsetCap)) return kSubsetCap;
  }
  return static_cast<long long>(acc);
#else
  // Without 128-bit integers: divide by the gcd first so that the product
  // stays in 64 bits whenever the result does.
  unsigned long long acc = 1;
  for (long long i = 1; i <= r; ++i) {
    unsigned long long num = static_cast<unsigned long long>(n - r + i), den = static_cast<unsigned long long>(i);
    unsigned long long g = std::gcd(acc, den);
    acc /= g;
    den /= g;
    num /= den;  // den divides num once acc and den are coprime
    if (acc > static_cast<unsigned long long>(kSubsetCap) / num) return kSubsetCap;
    acc *= num;
    if (acc >= static_cast<unsigned long long>(kSubsetCap)) return kSubsetCap;
  }
  return static_cast<long long>(acc);
#endif
}

// The rank-th r-subset of [0, n) in lexicographic order (0 <= rank < C(n, r)).
std::vector<Index> unrank(long long rank, Index n, Index r) {
  if (rank < 0 || rank >= binom(n, r))
    throw std::out_of_range("pattern enumeration: subset rank " + std::to_string(rank) +
                            " is outside [0, C(" + std::to_string(n) + ", " + std::to_string(r) + "))");
  std::vector<Index> c(r);
  Index x = 0;
  for (Index i = 0; i < r; ++i) {
    while (true) {
      if (x >= n) throw std::logic_error("pattern enumeration: unranking ran past the end");
      const long long cnt = binom(n - x - 1, r - i - 1);
      if (rank < cnt) break;
      rank -= cnt;
      ++x;
    }
    c[i] = x++;
  }
  return c;
}

bool next_combination(std::vector<Index>& c, Index n) {
  const Index r = static_cast<Index>(c.size());
  for (Index i = r - 1; i >= 0; --i) {
    if (c[i] < n - r + i) {
      ++c[i];
      for (Index j = i + 1; j < r; ++j) c[j] = c[j - 1] + 1;
      return true;
    }
  }
  return false;
}

struct Local {
  std::vector<std::uint64_t> words;
  std::vector<double> coeffs;
  std::unordered_set<std::string> seen;
  long long systems = 0;
};

void emit(Local& out, const Eigen::VectorXd& r, const Eigen::VectorXd& z, double tol, Index n_words) {
  const Index n = r.size();
  const double scale = r.cwiseAbs().maxCoeff();
  if (!(scale > 0.0) || !std::isfinite(scale)) return;
  std::string key(static_cast<size_t>(n_words) * 8, '\0');
  auto* w = reinterpret_cast<std::uint64_t*>(&key[0]);
  bool any = false;
  for (Index j = 0; j < n; ++j)
    if (r(j) > tol * scale) {
      w[j >> 6] |= (std::uint64_t(1) << (j & 63));
      any = true;
    }
  if (!any) return;
  if (!out.seen.insert(key).second) return;
  out.words.insert(out.words.end(), w, w + n_words);
  out.coeffs.insert(out.coeffs.end(), z.data(), z.data() + z.size());
}

}  // namespace

long long pattern_subset_count(Index n, Index k, PatternMode mode) {
  if (n < 1 || k < 1 || k > n)
    throw std::invalid_argument("pattern enumeration: need 1 <= k <= n; got n = " + std::to_string(n) +
                                ", k = " + std::to_string(k));
  if (mode == PatternMode::Vertices && k > kMaxVerticesK)
    throw std::invalid_argument("pattern enumeration: 'vertices' mode supports k <= " +
                                std::to_string(kMaxVerticesK) + " (2^k - 1 systems per subset); got k = " +
                                std::to_string(k));
  const Index r = mode == PatternMode::Vertices ? k : k - 1;
  const long long c = binom(n, r);
  if (c >= kSubsetCap)
    throw std::invalid_argument("pattern enumeration: C(" + std::to_string(n) + ", " + std::to_string(r) +
                                ") subsets exceed the limit 2^62");
  return c;
}

namespace {

// Runs the systems of `mode` on `count` subsets; fill(i, c, first) writes subset i into c
// (first: c holds nothing useful yet). Deduplicates and merges in subset order.
template <class Fill>
PatternBatch run_subsets(const ConstRowRef& B, PatternMode mode, long long count, double tol,
                         int n_jobs, Fill fill) {
  const Index k = B.rows(), n = B.cols();
  PatternBatch out;
  out.n_words = (n + 63) / 64;
  if (count <= 0) {
    out.coeffs.resize(0, k);
    return out;
  }
  const Index r = mode == PatternMode::Vertices ? k : k - 1;
  // Work items of `grain` consecutive subsets, sized to about 4e6 flops so that
  // a stop request (signal, time limit) is seen within milliseconds; results
  // are kept per item and merged in item order, so they do not depend on n_jobs.
  const long long rhs = mode == PatternMode::Vertices ? (1LL << k) - 1 : 2;
  const double per_subset = static_cast<double>(n) * static_cast<double>(k) * static_cast<double>(rhs);
  const long long grain = std::max(1LL, std::min(256LL, static_cast<long long>(4e6 / per_subset)));
  const long long nitems = count / grain + (count % grain != 0);
  // Vertices: the 2^k - 1 right-hand sides b in {0,1}^k \ {0} are solved in
  // panels of at most kRhsPanel columns, so the workspace is O(n kRhsPanel),
  // not O(n 2^k).
  constexpr long long kRhsPanel = 256;
  std::vector<Local> local(nitems);
  parallel_for(nitems, n_jobs, [&](long long item) {
    Local& L = local[item];
    const long long i0 = item * grain, i1 = std::min(count, i0 + grain);
    std::vector<Index> c(r);
    Eigen::MatrixXd BJ(k, std::max<Index>(r, 1));
    Eigen::VectorXd z(k), rv(n);
    Eigen::MatrixXd bits, Wall, Rall;
    for (long long i = i0; i < i1; ++i) {
      fill(i, c, i == i0);
      for (Index a = 0; a < r; ++a) BJ.col(a) = B.col(c[a]);
      ++L.systems;
      if (mode == PatternMode::Vertices) {
        // B[:, J]^T w = b for all b in {0,1}^k \ {0}: one LU, 2^k - 1 solves.
        Eigen::PartialPivLU<Eigen::MatrixXd> lu(BJ.leftCols(k).transpose());
        const double det = std::abs(lu.determinant());
        double colscale = 1.0;
        for (Index a = 0; a < k; ++a) colscale *= std::max(BJ.col(a).norm(), 1e-300);
        if (det > 1e-12 * colscale) {
          // A panel of right-hand sides at once: W = (B_J^T)^{-1} Bits, R = B^T W.
          for (long long m0 = 1; m0 <= rhs; m0 += kRhsPanel) {
            if (m0 > 1) checkpoint();
            const long long w = std::min(kRhsPanel, rhs - m0 + 1);
            bits.resize(k, w);
            for (long long col = 0; col < w; ++col) {
              const unsigned long long mask = static_cast<unsigned long long>(m0 + col);
              for (Index a = 0; a < k; ++a) bits(a, col) = (mask >> a) & 1ULL ? 1.0 : 0.0;
            }
            Wall = lu.solve(bits);
            Rall.noalias() = B.transpose() * Wall;
            for (Index col = 0; col < Wall.cols(); ++col) {
              rv = Rall.col(col);
              z = Wall.col(col);
              emit(L, rv, z, tol, out.n_words);
            }
          }
        }
        continue;
      }
      // Null vector of B[:, J]^T (k x (k-1)): the last left singular vector.
      if (k == 1) {
        z.setOnes();
      } else {
        Eigen::JacobiSVD<Eigen::MatrixXd> svd(BJ, Eigen::ComputeFullU);
        const auto& s = svd.singularValues();
        if (!(s(0) > 0.0) || s(k - 2) < 1e-10 * s(0)) continue;  // null space not 1-dim
        z = svd.matrixU().col(k - 1);
      }
      for (int sgn = 0; sgn < 2; ++sgn) {
        if (sgn == 1) z = -z;
        rv.noalias() = B.transpose() * z;
        const double scale = rv.cwiseAbs().maxCoeff();
        if (rv.minCoeff() >= -tol * scale) emit(L, rv, z, tol, out.n_words);
      }
    }
  });
  // Merge in item (= subset) order, keeping first occurrences.
  std::unordered_set<std::string> seen;
  std::vector<double> coeffs;
  for (Local& L : local) {
    out.systems += L.systems;
    const size_t cnt = L.words.size() / out.n_words;
    for (size_t p = 0; p < cnt; ++p) {
      std::string key(reinterpret_cast<const char*>(&L.words[p * out.n_words]), out.n_words * 8);
      if (!seen.insert(key).second) continue;
      out.words.insert(out.words.end(), L.words.begin() + p * out.n_words,
                       L.words.begin() + (p + 1) * out.n_words);
      coeffs.insert(coeffs.end(), L.coeffs.begin() + p * k, L.coeffs.begin() + (p + 1) * k);
    }
  }
  const Index total_found = static_cast<Index>(coeffs.size()) / k;
  out.coeffs = Eigen::Map<RowMatrixXd>(coeffs.data(), total_found, k);
  return out;
}

void check_input(const ConstRowRef& B, PatternMode mode, double tol) {
  const Index k = B.rows(), n = B.cols();
  if (k < 1 || n < k)
    throw std::invalid_argument("enumerate_patterns: B must be k x n with 1 <= k <= n; got " +
                                std::to_string(k) + " x " + std::to_string(n));
  if (mode == PatternMode::Vertices && k > kMaxVerticesK)
    throw std::invalid_argument("enumerate_patterns: 'vertices' mode supports k <= " +
                                std::to_string(kMaxVerticesK) + " (2^k - 1 systems per subset); got k = " +
                                std::to_string(k));
  if (!(tol >= 0.0)) throw std::invalid_argument("enumerate_patterns: tol must be >= 0");
}

}  // namespace

PatternBatch enumerate_patterns(const ConstRowRef& B, PatternMode mode, long long begin,
                                long long end, double tol, int n_jobs) {
  check_input(B, mode, tol);
  const Index k = B.rows(), n = B.cols();
  const Index r = mode == PatternMode::Vertices ? k : k - 1;
  const long long total = pattern_subset_count(n, k, mode);
  begin = std::max(0LL, std::min(begin, total));
  end = std::max(begin, std::min(end, total));
  return run_subsets(B, mode, std::max(0LL, end - begin), tol, n_jobs,
                     [&](long long i, std::vector<Index>& c, bool first) {
                       if (first)
                         c = unrank(begin + i, n, r);
                       else
                         next_combination(c, n);
                     });
}

PatternBatch enumerate_patterns_for(const ConstRowRef& B, PatternMode mode,
                                    const Eigen::Ref<const IndexMatrix>& subsets, double tol,
                                    int n_jobs) {
  check_input(B, mode, tol);
  const Index k = B.rows(), n = B.cols();
  const Index r = mode == PatternMode::Vertices ? k : k - 1;
  if (subsets.cols() != r)
    throw std::invalid_argument("enumerate_patterns_for: subsets must have " + std::to_string(r) +
                                " columns for this mode; got " + std::to_string(subsets.cols()));
  if (subsets.size() && (subsets.minCoeff() < 0 || subsets.maxCoeff() >= n))
    throw std::invalid_argument("enumerate_patterns_for: subset indices must be in [0, n)");
  return run_subsets(B, mode, subsets.rows(), tol, n_jobs,
                     [&](long long i, std::vector<Index>& c, bool) {
                       for (Index a = 0; a < r; ++a) c[a] = subsets(i, a);
                     });
}

}  // namespace relufast
