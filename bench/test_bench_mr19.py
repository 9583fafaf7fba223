"""MR19: the generalized LASSO (47) by Huber-Newton vs the HiGHS QP as d, k, s grow; batched
codes per second; the column-space estimators of Section 3 (paper's ML vs centred SVD vs the
Tobit extension) against n.

Run: python -m pytest bench/test_bench_mr19.py --benchmark-only. All of relufast's own NumPy
work runs on one BLAS thread (``single_threaded_blas``); HiGHS's QP solver is single-threaded.
Quality figures sit beside every time in ``extra_info``.
"""

import warnings

import numpy as np
import pytest
from scipy import stats

import relufast as rf
from relufast.planted import relu_codes, relu_dictionary

mr19 = rf.mr19


def _quality(P, r, mu=0.5):
    C = np.atleast_2d(r.c)
    Ct = np.atleast_2d(P.c)
    err = float(np.mean(np.linalg.norm(C - mu * Ct, axis=1)))
    supports = r.support if isinstance(r.support, tuple) else (r.support,)
    truths = np.atleast_2d(P.support)
    exact = float(np.mean([np.array_equal(s, t) for s, t in zip(supports, truths)]))
    return {
        "err_c_mu": err,
        "support_exact_fraction": exact,
        "max_kkt": float(np.max(r.kkt_residual)),
        "status": r.status,
        "blas_threads": 1,
    }


@pytest.mark.parametrize("solver", ["huber", "highs"])
@pytest.mark.parametrize(
    "d, k, s",
    [(500, 20, 10), (2000, 20, 10), (8000, 20, 10), (2000, 5, 10), (2000, 50, 10), (2000, 20, 50), (2000, 20, 200)],
)
def test_lasso_solvers(benchmark, machine, solver, d, k, s):
    P = relu_codes(d, k, s, random_state=0)
    r = benchmark.pedantic(
        mr19.robust_recover,
        args=(P.A, P.v),
        kwargs={"solver": solver},
        rounds=3 if solver == "highs" else 10,
        warmup_rounds=1,
    )
    ref = mr19.robust_recover(P.A, P.v, solver="huber" if solver == "highs" else "highs") if d <= 2000 else None
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(_quality(P, r))
    benchmark.extra_info.update(
        {
            "iterations": int(r.iterations),
            "max_diff_vs_other_solver": None if ref is None else float(np.abs(r.c - ref.c).max()),
        }
    )


@pytest.mark.parametrize("n_codes", [100, 1000])
@pytest.mark.parametrize("d, k", [(2000, 20), (8000, 50)])
def test_batched_codes_per_second(benchmark, n_codes, d, k):
    P = relu_codes(d, k, 10, n_codes=n_codes, random_state=1)
    r = benchmark.pedantic(mr19.robust_recover, args=(P.A, P.v), rounds=3, warmup_rounds=1)
    benchmark.extra_info.update(_quality(P, r))
    benchmark.extra_info.update(
        {"codes_per_second": n_codes / benchmark.stats.stats.min, "max_newton_steps": int(np.max(r.iterations))}
    )


@pytest.mark.parametrize("method", ["ml", "centered", "tobit"])
@pytest.mark.parametrize("n", [25, 50, 100, 200, 400])
def test_column_space_vs_n(benchmark, method, n):
    """d = 200, k = 3, B ~ N(0, 0.3^2), gamma = 1.01 max|M|; ||sin Theta||_F (max sqrt(3) = 1.73)
    averaged over three draws, beside the time of one."""
    law = stats.norm(0, 0.3)
    draws = [relu_dictionary(n, 200, 3, bias=law, random_state=seed) for seed in range(3)]

    def run(D):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rf.RelufastWarning)
            return mr19.column_space(D.Y, 3, method=method, bias=law, gamma=1.01 * np.abs(D.M).max())

    cs = benchmark.pedantic(run, args=(draws[0],), rounds=2 if method == "tobit" else 5, warmup_rounds=0)
    sins = [mr19.subspace_distance(run(D).basis, D.A)[0] for D in draws]
    benchmark.extra_info.update(
        {
            "sin_theta_F_mean": float(np.mean(sins)),
            "sin_theta_F_draws": sins,
            "gap_ratio": cs.gap_ratio,
            "from_paper": cs.from_paper,
            "blas_threads": 1,
        }
    )
