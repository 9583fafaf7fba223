"""BJW19 Alg. 1-2: sign-pattern kernel throughput, LP session vs scipy, end-to-end time.

Quality figures (patterns found, LP agreement, recovery error) sit in extra_info beside
every time.
"""

import math
import time

import numpy as np
import pytest
from scipy.optimize import linprog

import relufast as rf
from relufast.stages.highs import INF, LPSession
from relufast.stages.patterns import sign_patterns


def _span_basis(n, k, seed=0, d=4):
    rng = np.random.default_rng(seed)
    X = rng.laplace(size=(n, d))
    F = np.maximum(X @ rng.standard_normal((k, d)).T, 0)
    return np.ascontiguousarray(np.linalg.svd(F, full_matrices=False)[0][:, :k].T), X, F


@pytest.mark.parametrize("mode", ["rays", "vertices"])
@pytest.mark.parametrize("n,k", [(200, 2), (200, 3), (400, 3)])
def test_pattern_kernel(benchmark, n, k, mode):
    B, _, F = _span_basis(n, k)
    P, C, systems = benchmark.pedantic(sign_patterns, args=(B,), kwargs={"mode": mode}, rounds=3, warmup_rounds=1)
    t = benchmark.stats.stats.min
    truth = {s.tobytes() for s in (F.T > 0)}
    benchmark.extra_info.update(
        {
            "systems": systems,
            "systems_per_second": systems / t,
            "patterns": len(P),
            "patterns_per_second": len(P) / t,
            "true_patterns_found": len(truth & {p.tobytes() for p in P}),
            "bound_C(n,k)(2^k-1)": math.comb(n, k) * (2**k - 1),
        }
    )


def _iterative_lp_rows(n, k=2, d=4, seed=1):
    """The rows (a)-(d) of BJW19 Alg. 1 for one true pattern, as a dense matrix."""
    B, X, F = _span_basis(n, k, seed, d)
    S = F[:, 0] > 0
    XS, XN = X[S], X[~S]
    A = np.vstack(
        [
            np.hstack([XS, np.zeros((len(XS), k))]),
            np.hstack([XN, np.zeros((len(XN), k))]),
            np.hstack([XS, -B[:, S].T]),
            np.hstack([np.zeros((len(XN), d)), B[:, ~S].T]),
        ]
    )
    lo = np.r_[np.ones(len(XS)), -INF * np.ones(len(XN)), np.zeros(len(XS) + len(XN))]
    up = np.r_[INF * np.ones(len(XS)), np.zeros(len(XN)), np.zeros(len(XS) + len(XN))]
    return A, lo, up, d + k


@pytest.mark.parametrize("n", [100, 400])
def test_lp_session_resolves(benchmark, n):
    """Build once, then re-solve warm after a bound change (the Remark 1 independence LPs)."""
    A, lo, up, nv = _iterative_lp_rows(n)
    rng = np.random.default_rng(0)
    sess = LPSession(nv)
    sess.add_rows(A, lo, up)
    (row,) = sess.add_rows(rng.standard_normal((1, nv)), 1.0, INF)
    flip = [0]

    def resolve():
        flip[0] ^= 1
        sess.set_row_bounds(row, *((1.0, INF) if flip[0] else (-INF, -1.0)))
        return sess.solve()

    res = benchmark.pedantic(resolve, rounds=50, warmup_rounds=2)
    benchmark.extra_info.update(
        {"lps_per_second": 1.0 / benchmark.stats.stats.mean, "rows": A.shape[0] + 1, "status": res.status.value}
    )


@pytest.mark.parametrize("n", [100, 400])
def test_scipy_linprog_same_lp(benchmark, n):
    A, lo, up, nv = _iterative_lp_rows(n)
    eq = lo == up
    ub_rows = np.vstack([A[~eq & np.isfinite(up)], -A[~eq & np.isfinite(lo)]])
    ub = np.r_[up[~eq & np.isfinite(up)], -lo[~eq & np.isfinite(lo)]]

    def solve():
        return linprog(
            np.zeros(nv), A_ub=ub_rows, b_ub=ub, A_eq=A[eq], b_eq=lo[eq], bounds=[(None, None)] * nv, method="highs"
        )

    res = benchmark.pedantic(solve, rounds=20, warmup_rounds=1)
    sess = LPSession(nv)
    sess.add_rows(A, lo, up)
    benchmark.extra_info.update(
        {
            "lps_per_second": 1.0 / benchmark.stats.stats.mean,
            "status": int(res.status),
            "agrees_with_session": bool(res.status == 0) == sess.solve().feasible,
        }
    )


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("n", [100, 200, 400, 2000])
def test_enumeration_pipeline(benchmark, n, k):
    net = rf.planted.two_layer(d=5, k=k, m=5, random_state=0, max_cos=0.9)
    X, Y = net.sample(n, random_state=1, input="laplace")
    res = benchmark.pedantic(
        rf.recover,
        args=(X, Y),
        kwargs={"n_hidden": k, "method": "bjw19-enumeration", "random_state": 0},
        rounds=3,
        warmup_rounds=1,
    )
    err = rf.metrics.parameter_error(res, net)
    benchmark.extra_info.update(
        {
            "status": res.status.value,
            "error_U": err.U,
            "error_V": err.V,
            "patterns_tried": res.counts["patterns_tried"],
            "lps_solved": res.counts["lps_solved"],
            "linear_systems": res.counts["linear_systems"],
            "row_sources": res.diagnostics["row_sources"],
        }
    )
    # The exhaustive Lemma 1 enumeration (the worst case, what early stopping avoids),
    # when it takes at most about a minute.
    if math.comb(n, k) * (2**k - 1) <= 1e8:
        B = np.ascontiguousarray(np.linalg.svd(Y, full_matrices=False)[0][:, :k].T)
        t = time.perf_counter()
        P, _, systems = sign_patterns(B, mode="vertices")
        benchmark.extra_info.update(
            {
                "exhaustive_lemma1_seconds": time.perf_counter() - t,
                "exhaustive_patterns": len(P),
                "exhaustive_systems": systems,
            }
        )
    assert res.exact and err.V < 1e-10


@pytest.mark.parametrize("n", [12, 20])
def test_enumeration_pipeline_lp_path(benchmark, n):
    """Gaussian X, d = 8 > |S|: rows are not determined by their support and go through the
    Iterative LP (the fit is exact, the rows need not be the planted ones)."""
    net = rf.planted.two_layer(d=8, k=2, m=3, random_state=2)
    X, Y = net.sample(n, random_state=3)
    res = benchmark.pedantic(
        rf.recover,
        args=(X, Y),
        kwargs={"n_hidden": 2, "method": "bjw19-enumeration", "random_state": 0},
        rounds=3,
        warmup_rounds=1,
    )
    benchmark.extra_info.update(
        {
            "status": res.status.value,
            "residual": res.residual,
            "patterns_tried": res.counts["patterns_tried"],
            "lps_solved": res.counts["lps_solved"],
            "paths": res.diagnostics["row_paths"],
        }
    )
    assert res.exact
