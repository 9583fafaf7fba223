#include "region.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>

#include "parallel.hpp"

namespace relufast {

namespace {

void check_network(const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V,
                   const Eigen::VectorXd& b, const RowMatrixXd& U, const Eigen::VectorXd& c,
                   const Eigen::VectorXd& margin, const char* who) {
  const Index d = X.cols(), k = V.rows(), m = Y.cols();
  const std::string w(who);
  if (X.rows() != Y.rows())
    throw std::invalid_argument(w + ": X has " + std::to_string(X.rows()) + " rows but Y has " +
                                std::to_string(Y.rows()));
  if (V.cols() != d)
    throw std::invalid_argument(w + ": V has " + std::to_string(V.cols()) + " columns, expected d = " +
                                std::to_string(d));
  if (k < 1) throw std::invalid_argument(w + ": V needs at least one row");
  if (b.size() != k || margin.size() != k)
    throw std::invalid_argument(w + ": b and margin must have k = " + std::to_string(k) + " entries");
  if (U.rows() != m || U.cols() != k)
    throw std::invalid_argument(w + ": U must have shape (m, k) = (" + std::to_string(m) + ", " +
                                std::to_string(k) + ")");
  if (c.size() != m) throw std::invalid_argument(w + ": c must have m = " + std::to_string(m) + " entries");
  if ((margin.array() < 0.0).any()) throw std::invalid_argument(w + ": margins must be >= 0");
}

// Pre-activations, residuals and certainty of one block.
struct BlockEval {
  RowMatrixXd P, F, R;
  std::vector<std::uint8_t> certain;
  void run(const ConstRowRef& Xb, const ConstRowRef& Yb, const ConstRowRef& V, const Eigen::VectorXd& b,
           const RowMatrixXd& U, const Eigen::VectorXd& c, const Eigen::VectorXd& margin) {
    const Index len = Xb.rows(), k = V.rows();
    P.noalias() = Xb * V.transpose();
    P.rowwise() += b.transpose();
    F = P.cwiseMax(0.0);
    R = Yb;
    R.noalias() -= F * U.transpose();
    R.rowwise() -= c.transpose();
    certain.assign(len, 1);
    for (Index s = 0; s < len; ++s)
      for (Index i = 0; i < k; ++i)
        if (!(std::abs(P(s, i)) > margin(i))) {
          certain[s] = 0;
          break;
        }
  }
};

using Key = std::vector<std::uint64_t>;

struct Region {
  double count = 0.0, sq = 0.0;
  Eigen::MatrixXd G, H;
};

}  // namespace

RegionSystems region_systems(const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V,
                             const Eigen::VectorXd& b, const RowMatrixXd& U, const Eigen::VectorXd& c,
                             const Eigen::VectorXd& margin, const BoolVector* mask,
                             Index max_regions, int n_jobs, Index block) {
  check_network(X, Y, V, b, U, c, margin, "region_systems");
  if (mask && mask->size() != X.rows())
    throw std::invalid_argument("region_systems: mask must have n = " + std::to_string(X.rows()) + " entries");
  if (block < 1) throw std::invalid_argument("region_systems: block must be >= 1");
  if (max_regions < 1) throw std::invalid_argument("region_systems: max_regions must be >= 1");
  const Index n = X.rows(), d = X.cols(), k = V.rows(), m = Y.cols(), D = d + 1;
  const Index W = (k + 63) / 64;

  struct Local {
    std::map<Key, Region> regions;
    Eigen::MatrixXd fgram, fcross;
    double sq_residual = 0.0, sq_norm = 0.0, n_certain = 0.0, count = 0.0;
    BlockEval ev;
    RowMatrixXd A, Rg;
    std::vector<std::pair<Key, Index>> order;
  };
  RegionSystems out;
  out.n_words = W;
  out.fgram.setZero(k + 1, k + 1);
  out.fcross.setZero(k + 1, m);
  std::map<Key, Region> merged;
  accumulate_blocks<Local>(
      n, block, n_jobs,
      [&] {
        Local L;
        L.fgram.setZero(k + 1, k + 1);
        L.fcross.setZero(k + 1, m);
        return L;
      },
      [&](Local& L) {
        L.regions.clear();
        L.fgram.setZero();
        L.fcross.setZero();
        L.sq_residual = L.sq_norm = L.n_certain = L.count = 0.0;
      },
      [&](Local& L, Index s0, Index len) {
        const auto Xb = X.middleRows(s0, len);
        const auto Yb = Y.middleRows(s0, len);
        L.ev.run(Xb, Yb, V, b, U, c, margin);
        const RowMatrixXd& F = L.ev.F;
        const RowMatrixXd& R = L.ev.R;
        // Output-layer statistics of F1 = [F, 1] over every sample.
        L.fgram.topLeftCorner(k, k).noalias() += F.transpose() * F;
        const Eigen::RowVectorXd fs = F.colwise().sum();
        L.fgram.block(0, k, k, 1) += fs.transpose();
        L.fgram.block(k, 0, 1, k) += fs;
        L.fgram(k, k) += static_cast<double>(len);
        L.fcross.topRows(k).noalias() += F.transpose() * R;
        L.fcross.row(k) += R.colwise().sum();
        L.sq_residual += R.squaredNorm();
        L.sq_norm += Yb.squaredNorm();
        L.count += static_cast<double>(len);
        // Certain samples, grouped by pattern key.
        L.order.clear();
        for (Index s = 0; s < len; ++s) {
          if (!L.ev.certain[s] || (mask && !(*mask)(s0 + s))) continue;
          Key key(W, 0);
          for (Index i = 0; i < k; ++i)
            if (L.ev.P(s, i) > 0.0) key[i / 64] |= std::uint64_t(1) << (i % 64);
          L.order.emplace_back(std::move(key), s);
        }
        std::sort(L.order.begin(), L.order.end());
        L.n_certain += static_cast<double>(L.order.size());
        std::size_t g0 = 0;
        while (g0 < L.order.size()) {
          std::size_t g1 = g0 + 1;
          while (g1 < L.order.size() && L.order[g1].first == L.order[g0].first) ++g1;
          const Index g = static_cast<Index>(g1 - g0);
          L.A.resize(g, D);
          L.Rg.resize(g, m);
          for (Index t = 0; t < g; ++t) {
            const Index s = L.order[g0 + t].second;
            L.A.row(t).head(d) = Xb.row(s);
            L.A(t, d) = 1.0;
            L.Rg.row(t) = R.row(s);
          }
          auto it = L.regions.find(L.order[g0].first);
          if (it == L.regions.end()) {
            if (static_cast<Index>(L.regions.size()) >= max_regions)
              throw std::invalid_argument("region_systems: more than max_regions = " +
                                          std::to_string(max_regions) +
                                          " activation regions are populated; use fewer samples "
                                          "(n_refine) or raise max_regions");
            Region r;
            r.G.setZero(D, D);
            r.H.setZero(D, m);
            it = L.regions.emplace(L.order[g0].first, std::move(r)).first;
          }
          Region& r = it->second;
          r.count += static_cast<double>(g);
          r.G.noalias() += L.A.transpose() * L.A;
          r.H.noalias() += L.A.transpose() * L.Rg;
          r.sq += L.Rg.squaredNorm();
          g0 = g1;
        }
      },
      [&](const Local& L) {
        out.fgram += L.fgram;
        out.fcross += L.fcross;
        out.sq_residual += L.sq_residual;
        out.sq_norm += L.sq_norm;
        out.n_certain += L.n_certain;
        out.count += L.count;
        for (const auto& kv : L.regions) {
          auto it = merged.find(kv.first);
          if (it == merged.end()) {
            if (static_cast<Index>(merged.size()) >= max_regions)
              throw std::invalid_argument("region_systems: more than max_regions = " +
                                          std::to_string(max_regions) +
                                          " activation regions are populated; use fewer samples "
                                          "(n_refine) or raise max_regions");
            merged.emplace(kv.first, kv.second);
          } else {
            it->second.count += kv.second.count;
            it->second.sq += kv.second.sq;
            it->second.G += kv.second.G;
            it->second.H += kv.second.H;
          }
        }
      });
  const Index R = static_cast<Index>(merged.size());
  out.keys.reserve(R * W);
  out.counts.resize(R);
  out.sq_res.resize(R);
  out.gram.resize(R, D * D);
  out.cross.resize(R, D * m);
  Index j = 0;
  for (const auto& kv : merged) {
    out.keys.insert(out.keys.end(), kv.first.begin(), kv.first.end());
    out.counts(j) = kv.second.count;
    out.sq_res(j) = kv.second.sq;
    // G is symmetric; H is stored row-major (D x m) as a flat row.
    for (Index p = 0; p < D; ++p) {
      for (Index q = 0; q < D; ++q) out.gram(j, p * D + q) = kv.second.G(p, q);
      for (Index q = 0; q < m; ++q) out.cross(j, p * m + q) = kv.second.H(p, q);
    }
    ++j;
  }
  return out;
}

Eigen::VectorXd region_residuals(const ConstRowRef& X, const ConstRowRef& Y, const ConstRowRef& V,
                                 const Eigen::VectorXd& b, const RowMatrixXd& U,
                                 const Eigen::VectorXd& c, const Eigen::VectorXd& margin,
                                 const RowMatrixXd& dC, const Eigen::VectorXd& dc, int n_jobs,
                                 Index block) {
  check_network(X, Y, V, b, U, c, margin, "region_residuals");
  const Index n = X.rows(), d = X.cols(), k = V.rows(), m = Y.cols(), D = d + 1;
  if (dC.rows() != k || dC.cols() != D * m)
    throw std::invalid_argument("region_residuals: dC must have shape (k, (d + 1) m)");
  if (dc.size() != m) throw std::invalid_argument("region_residuals: dc must have m entries");
  if (block < 1) throw std::invalid_argument("region_residuals: block must be >= 1");
  Eigen::VectorXd out(n);
  // Per unit, the D x m update as a matrix (row-major flat rows of dC).
  std::vector<Eigen::MatrixXd> dCi(k);
  for (Index i = 0; i < k; ++i) {
    dCi[i].resize(D, m);
    for (Index p = 0; p < D; ++p)
      for (Index q = 0; q < m; ++q) dCi[i](p, q) = dC(i, p * m + q);
  }
  struct Local {
    BlockEval ev;
    RowMatrixXd Xt, T;
  };
  accumulate_blocks<Local>(
      n, block, n_jobs, [] { return Local(); }, [](Local&) {},
      [&](Local& L, Index s0, Index len) {
        const auto Xb = X.middleRows(s0, len);
        L.ev.run(Xb, Y.middleRows(s0, len), V, b, U, c, margin);
        L.Xt.resize(len, D);
        L.Xt.leftCols(d) = Xb;
        L.Xt.col(d).setOnes();
        RowMatrixXd& Rr = L.ev.R;
        Rr.rowwise() -= dc.transpose();
        for (Index i = 0; i < k; ++i) {
          L.T.noalias() = L.Xt * dCi[i];
          for (Index s = 0; s < len; ++s)
            if (L.ev.P(s, i) > 0.0) Rr.row(s) -= L.T.row(s);
        }
        for (Index s = 0; s < len; ++s)
          out(s0 + s) = L.ev.certain[s] ? Rr.row(s).norm() : std::numeric_limits<double>::quiet_NaN();
      },
      [](const Local&) {});
  return out;
}

}  // namespace relufast
