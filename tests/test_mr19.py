"""MR19 (Mazumdar & Rawat): generalized LASSO (47) and the column space of Section 3.

Oracles are closed forms (checked by quadrature and Monte Carlo here) and seeded
measurements (docs/mr19.md); the paper itself has no experiments.
"""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import relufast as rf
from relufast._blas import single_threaded_blas
from relufast.algorithms.mr19 import InfeasibleError
from relufast.planted import relu_codes, relu_dictionary

mr19 = rf.mr19


@pytest.fixture(autouse=True)
def _one_blas_thread():
    """The tests' own NumPy work (least squares, SVDs) on one thread: on this shared 2-core
    machine a multithreaded LAPACK call next to other jobs was 100x slower."""
    with single_threaded_blas():
        yield


#: Closed-form moments against the quadrature table (six digits in the table).
MOMENT_TOL = 1e-6
#: Tail formula vs 2e6 Monte Carlo draws: 3 binomial standard errors at p = 0.3.
TAIL_MC_TOL = 1e-3
#: The two exact solvers of (47) agree to rounding (both end on the same quadratic piece).
AGREE_TOL = 1e-8
#: KKT stationarity ||A^T r||_inf relative to ||A||_F ||v||.
KKT_TOL = 1e-8
#: Exact recovery on linear data: rounding of a d = 500 least-squares solve.
EXACT_TOL = 1e-10
#: Mean errors of the main rate study within 30% of the measured 0.144 / 0.058 / 0.027.
RATE_REL_TOL = 0.30
SEEDS = range(20)


def _mean_err(d, k, s, *, lam="theory", bias=0.0, solver="huber", debias=False):
    errs, ls, ratio, exact_support, fp = [], [], [], 0, []
    mu = mr19.bias_moments(bias)[0]
    for seed in SEEDS:
        P = relu_codes(d, k, s, bias=bias, random_state=seed)
        r = mr19.robust_recover(P.A, P.v, lam, truth=P, bias=bias, solver=solver, debias=debias)
        e = np.linalg.norm(r.c - mu * P.c)
        errs.append(e)
        ratio.append((e + np.linalg.norm(r.outliers - P.e) / np.sqrt(d)) / np.sqrt((k + s) * np.log(d) / d))
        ls.append(np.linalg.norm(np.linalg.lstsq(P.A, P.v, rcond=None)[0] - mu * P.c))
        exact_support += np.array_equal(r.support, P.support)
        fp.append(np.setdiff1d(r.support, P.support).size)
    return np.mean(errs), np.array(ratio), np.mean(ls), exact_support, np.mean(fp)


# ---------------------------------------------------------------- bias law, lambda


@pytest.mark.parametrize(
    "bias, expected",
    [
        (0.0, (0.5, 0.25, 0.75)),
        (0.5, (0.691462, 0.562240, 1.232365)),
        (-1.0, (0.158655, 0.050168, 0.240356)),
        (stats.norm(0, 1), (0.5, 0.75, 1.25)),
        (stats.uniform(-1, 2), (0.5, 0.416667, 0.916667)),
    ],
)
def test_bias_moments_table(bias, expected):
    assert mr19.bias_moments(bias) == pytest.approx(expected, abs=MOMENT_TOL)


def test_bias_moments_symmetric_identity_and_monte_carlo():
    for law in (stats.norm(0, 0.5), stats.laplace(0, 0.7)):
        mu, s2, _ = mr19.bias_moments(law)
        assert mu == pytest.approx(0.5, abs=1e-9)
        assert s2 == pytest.approx(0.25 + law.var() / 2, abs=1e-8)
    rng = np.random.default_rng(0)
    g, b = rng.standard_normal(2_000_000), 0.5
    mu, s2, eta2 = mr19.bias_moments(b)
    z = np.maximum(g + b, 0) - mu * g
    assert np.mean(g * np.maximum(g + b, 0)) == pytest.approx(mu, abs=5e-3)
    assert np.mean(z**2) == pytest.approx(s2, abs=5e-3)
    assert np.mean(g**2 * z**2) == pytest.approx(eta2, abs=2e-2)


@pytest.mark.parametrize("b, t, expected", [(0.0, 0.5, 0.31731), (0.0, 1.0, 0.04550), (0.5, 1.0, 0.12662)])
def test_abs_z_tail_closed_form_and_monte_carlo(b, t, expected):
    p = mr19.abs_z_tail(t, b)
    assert p == pytest.approx(expected, abs=1e-5)
    g = np.random.default_rng(1).standard_normal(2_000_000)
    z = np.maximum(g + b, 0) - mr19.bias_moments(b)[0] * g
    assert np.mean(np.abs(z) > t) == pytest.approx(p, abs=TAIL_MC_TOL)


def test_calibrated_tau():
    for d, tau in [(500, 3.110), (2000, 3.501), (8000, 3.856)]:
        assert mr19.calibrated_lam(d, 0.0, 0.01) * d == pytest.approx(tau, abs=5e-3)
    for d, tau in [(500, 4.00), (2000, 4.57), (8000, 5.09)]:
        assert mr19.calibrated_lam(d, 0.5, 0.01) * d == pytest.approx(tau, abs=1e-2)


# ---------------------------------------------------------------- (47): QP vs Huber, KKT


@pytest.mark.parametrize("d", [50, 300])
@pytest.mark.parametrize("k", [3, 10])
@pytest.mark.parametrize("s", [0, 5])
@pytest.mark.parametrize("tau", [0.5, 3.0])
@pytest.mark.filterwarnings("ignore:more than 30%")  # tau = 0.5 flags many coordinates, on purpose
def test_qp_and_huber_agree_with_kkt(d, k, s, tau):
    P = relu_codes(d, k, s, random_state=d + 7 * k + 13 * s)
    a = mr19.robust_recover(P.A, P.v, tau / d)
    b = mr19.robust_recover(P.A, P.v, tau / d, solver="highs")
    assert a.status == b.status == "optimal"
    assert np.linalg.norm(a.c - b.c) <= AGREE_TOL * np.linalg.norm(a.c)
    assert np.abs(a.outliers - b.outliers).max() <= AGREE_TOL * (1 + np.abs(P.v).max())
    for res in (a, b):
        r = P.v - P.A @ res.c - res.outliers
        assert np.abs(P.A.T @ r).max() <= KKT_TOL * np.linalg.norm(P.A) * np.linalg.norm(P.v)
        assert np.abs(r).max() <= tau * (1 + 1e-9)
        S = res.outliers != 0
        assert np.allclose(r[S], tau * np.sign(res.outliers[S]), rtol=0, atol=1e-9 * tau)
        assert res.kkt_residual <= KKT_TOL
        # e-hat is the soft-thresholded residual of c-hat
        u = P.v - P.A @ res.c
        assert np.allclose(res.outliers, np.sign(u) * np.maximum(np.abs(u) - tau, 0), atol=1e-9)
    assert a.tau == pytest.approx(tau)


@settings(max_examples=40, deadline=None)
@given(
    d=st.integers(6, 40),
    k=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
    tau=st.floats(0.05, 5.0),
    spikes=st.integers(0, 5),
)
def test_huber_newton_kkt_property(d, k, seed, tau, spikes):
    """Any small instance (possibly with fewer inliers than k): the Huber path ends at a point
    that satisfies (47)'s optimality conditions, and agrees with the QP in objective."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((d, k))
    v = rng.standard_normal(d)
    v[rng.choice(d, min(spikes, d), replace=False)] += 20 * rng.standard_normal(min(spikes, d))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        a = mr19.robust_recover(A, v, tau / d)
        b = mr19.robust_recover(A, v, tau / d, solver="highs")
    assert a.kkt_residual <= KKT_TOL and b.kkt_residual <= KKT_TOL

    def obj(r):
        return 0.5 * np.sum((v - A @ r.c - r.outliers) ** 2) + tau * np.abs(r.outliers).sum()

    assert obj(a) == pytest.approx(obj(b), rel=1e-9, abs=1e-12)


def test_batched_codes_match_single_solves():
    P = relu_codes(400, 8, 6, n_codes=5, random_state=3)
    r = mr19.robust_recover(P.A, P.v)
    assert r.c.shape == (5, 8) and r.outliers.shape == (5, 400) and len(r.support) == 5
    for j in range(5):
        one = mr19.robust_recover(P.A, P.v[j])
        assert np.allclose(one.c, r.c[j], rtol=0, atol=1e-13)
        np.testing.assert_array_equal(one.support, r.support[j])
    h = mr19.robust_recover(P.A, P.v[:2], solver="highs")
    assert np.abs(h.c - r.c[:2]).max() <= AGREE_TOL


# ---------------------------------------------------------------- exactness and lambda limits


def test_exact_on_linear_data():
    rng = np.random.default_rng(4)
    A, c = rng.standard_normal((500, 20)), rng.standard_normal(20)
    c /= np.linalg.norm(c)
    for tau in (0.1, 3.0):
        r = mr19.robust_recover(A, A @ c, tau / 500)
        assert np.linalg.norm(r.c - c) <= EXACT_TOL and r.support.size == 0
        assert not r.outliers.any()
    e = np.zeros(500)
    S = rng.choice(500, 10, replace=False)
    e[S] = 10 * rng.choice([-1.0, 1.0], 10)
    r = mr19.robust_recover(A, A @ c + e, 3.0 / 500)
    assert np.linalg.norm(r.c - c) > 1e-3  # soft-threshold shrinkage: not exact before debiasing
    r = mr19.robust_recover(A, A @ c + e, 3.0 / 500, debias=True)
    assert np.linalg.norm(r.c - c) <= EXACT_TOL
    assert np.abs(r.outliers - e).max() <= EXACT_TOL * 10
    np.testing.assert_array_equal(r.support, np.sort(S))


def test_huge_lambda_gives_least_squares():
    P = relu_codes(300, 5, 5, random_state=5)
    c_ls = np.linalg.lstsq(P.A, P.v, rcond=None)[0]
    tau = 1.01 * np.abs(P.v - P.A @ c_ls).max()
    for solver in ("huber", "highs"):
        r = mr19.robust_recover(P.A, P.v, tau / 300, solver=solver)
        assert np.linalg.norm(r.c - c_ls) <= EXACT_TOL and r.support.size == 0
        assert "no outliers detected" in r.message


# ---------------------------------------------------------------- Theorem 4's rate (study D1)


def test_rate_in_d():
    means = {}
    for d, measured in [(500, 0.144), (2000, 0.058), (8000, 0.027)]:
        err, ratio, _, _, _ = _mean_err(d, 20, 10)
        means[d] = err
        assert err == pytest.approx(measured, rel=RATE_REL_TOL)
        # Theorem 4's rate with the constant measured at about 1: (err + outlier err) / rate in [0.5, 2]
        assert np.all((ratio >= 0.5) & (ratio <= 2.0)), ratio
    assert 0.12 <= means[8000] / means[500] <= 0.35


def test_outlier_support_exact():
    for lam in ("theory", None):
        _, _, _, exact, fp = _mean_err(2000, 20, 10, lam=lam)
        assert exact >= 19 and fp <= 0.5


def test_robust_against_least_squares():
    err, _, ls, _, _ = _mean_err(2000, 20, 200)
    assert err <= 0.6 * ls  # measured 0.134 vs 0.312
    err0, _, ls0, _, _ = _mean_err(2000, 20, 0)
    assert err0 == pytest.approx(ls0, rel=0.05)


def test_direction_and_scale():
    cos, scaled, biased = [], [], []
    for seed in SEEDS:
        P = relu_codes(2000, 20, 10, random_state=seed)
        r = mr19.robust_recover(P.A, P.v, "theory", truth=P)
        cos.append(1 - r.c @ P.c / np.linalg.norm(r.c))
        scaled.append(np.linalg.norm(r.c_scaled - P.c))
        Q = relu_codes(2000, 20, 10, bias=0.5, random_state=seed)
        rb = mr19.robust_recover(Q.A, Q.v, "theory", truth=Q, bias=0.5)
        biased.append(np.linalg.norm(rb.c - rb.mu * Q.c))
    assert np.mean(cos) <= 0.01
    assert np.mean(scaled) == pytest.approx(0.115, abs=0.04)
    assert np.mean(biased) == pytest.approx(0.085, abs=0.03)


@pytest.mark.parametrize(
    "bias, measured",
    [
        (0.5, 0.085),
        (-0.5, 0.043),
        (stats.norm(0, 0.5), 0.070),
        (stats.uniform(-1, 2), 0.074),
        (stats.uniform(0, 1), 0.089),
    ],
)
def test_nonzero_bias_laws(bias, measured):
    """(47) ignores b; the target is mu c* with mu = E[Phi(B)] (d = 2000, k = 20, s = 10), for
    Theorem 4's lambda and the calibrated one alike."""
    for lam in ("theory", None):
        err, _, _, exact, _ = _mean_err(2000, 20, 10, lam=lam, bias=bias)
        assert err == pytest.approx(measured, rel=RATE_REL_TOL)
        assert exact >= 19


# ---------------------------------------------------------------- bad input and degenerate data


def test_bad_input_robust_recover():
    P = relu_codes(50, 3, 2, random_state=0)
    with pytest.raises(ValueError, match="lam must be a positive finite number"):
        mr19.robust_recover(P.A, P.v, 0.0)
    with pytest.raises(ValueError, match="lam must be a positive finite number"):
        mr19.robust_recover(P.A, P.v, -1.0)
    with pytest.raises(ValueError, match="lam must be a positive finite number"):
        mr19.robust_recover(P.A, P.v, float("nan"))
    with pytest.raises(ValueError, match=r"v must have shape \(50,\) or \(n_codes, 50\).*got shape \(49,\)"):
        mr19.robust_recover(P.A, P.v[:49])
    with pytest.raises(ValueError, match=r"d > k.*got shape \(3, 3\)"):
        mr19.robust_recover(P.A[:3], P.v[:3])
    with pytest.raises(ValueError, match="finite"):
        mr19.robust_recover(P.A, np.r_[P.v[:-1], np.nan])
    with pytest.raises(ValueError, match="solver must be"):
        mr19.robust_recover(P.A, P.v, solver="cvx")
    with pytest.raises(ValueError, match="lam='theory' needs truth"):
        mr19.robust_recover(P.A, P.v, "theory")
    with pytest.raises(ValueError, match="needs the bias law"):
        mr19.robust_recover(P.A, P.v, bias=None)
    with pytest.raises(TypeError, match="bias must be a real number or a scipy.stats"):
        mr19.robust_recover(P.A, P.v, bias="gauss")


def test_degenerate_data_warn():
    P = relu_codes(100, 5, 60, random_state=1)
    with pytest.warns(rf.RelufastWarning, match="flagged as outliers"):
        mr19.robust_recover(P.A, P.v, 0.1 / 100)
    A = np.zeros((50, 3))
    A[:2] = np.random.default_rng(0).standard_normal((2, 3))  # rank 2: c is not unique
    with pytest.warns(rf.RelufastWarning, match="not unique"):
        r = mr19.robust_recover(A, np.ones(50), 1.0)
    assert r.status == "non_unique"
    with pytest.warns(rf.RelufastWarning, match="mu = .* unstable"):
        mr19.robust_recover(P.A, P.v, 0.05, bias=-2.0)


# ---------------------------------------------------------------- Problem R: (34), Section 3.2


@pytest.mark.parametrize(
    "law", [stats.norm(0.1, 0.5), stats.laplace(-0.2, 0.4), stats.expon(-0.5, 1.0), stats.uniform(-1.0, 2.0)]
)
def test_ml_closed_form_matches_highs(law):
    """The per-row ML of (34) against HiGHS: a QP for the Gaussian prior (diagonal Hessian),
    LPs for the others."""
    rng = np.random.default_rng(2)
    Y = np.maximum(rng.standard_normal((30, 50)) * 0.6 + 0.1, 0)
    gamma = 1.5
    est = mr19.ml_estimate(Y, bias=law, gamma=gamma)
    P = Y > 0
    has = P.any(axis=0)
    lo = np.where(P, Y, -np.inf).max(axis=0)[has] - gamma
    hi = np.where(P, Y, np.inf).min(axis=0)[has] + gamma
    lo, hi = np.maximum(lo, law.support()[0]), np.minimum(hi, law.support()[1])
    n = lo.size
    name = law.dist.name
    if name == "norm":
        m, sd = law.mean(), law.std()
        s = rf.highs.QPSession(
            n, hessian=np.full(n, 1 / sd**2), lower=lo, upper=hi, cost=np.full(n, -m / sd**2), regularization=0.0
        )  # HiGHS's default 1e-7 moves the optimum by ~1e-9
        beta = s.solve().x
    elif name == "laplace":  # min sum t_i, t_i >= |beta_i - m|
        m = law.median()
        s = rf.highs.LPSession(
            2 * n,
            lower=np.r_[lo, np.zeros(n)],
            upper=np.r_[hi, np.full(n, np.inf)],
            cost=np.r_[np.zeros(n), np.ones(n)],
        )
        I = np.eye(n)
        s.add_rows(np.block([[-I, I], [I, I]]), np.r_[np.full(n, -m), np.full(n, m)], np.inf)
        beta = s.solve().x[:n]
    elif name == "expon":  # min sum beta_i over beta_i >= a
        s = rf.highs.LPSession(n, lower=lo, upper=hi, cost=np.ones(n))
        beta = s.solve().x
    else:  # uniform: flat likelihood, any feasible point; relufast picks the midpoint
        beta = 0.5 * (lo + hi)
        assert set(est.row_status[has]) == {"non_unique_bias"}
    assert np.abs(est.beta[has] - beta).max() <= 1e-9
    # every filled entry satisfies (34)'s constraints
    assert np.abs(est.M).max() <= gamma * (1 + 1e-12)
    Xpos = np.where(P, est.M + est.beta, np.nan)
    np.testing.assert_allclose(Xpos[P], Y[P], atol=1e-12)
    cut_ok = np.where(~P & has, est.M <= np.where(P, est.M, np.inf).min(axis=0) + 1e-12, True)
    assert cut_ok.all()


def test_ml_zero_rows_and_infeasible_row():
    Y = np.zeros((10, 4))
    Y[:5, 1] = [0.2, 0.4, 1.7, 0.9, 1.0]  # positive entries span 1.5, one zero below them
    Y[:, 2] = 0.3
    est = mr19.ml_estimate(Y, bias=stats.norm(0, 1), gamma=2.0)
    assert np.all(est.M[:, 0] == -2.0) and np.isnan(est.beta[0])
    assert list(est.row_status) == ["zero_row", "ok", "all_positive", "zero_row"]
    with pytest.raises(InfeasibleError, match="need gamma >= 0.8") as info:
        mr19.ml_estimate(Y, bias=stats.norm(0, 1), gamma=0.7, margin=0.1)
    assert info.value.gamma_min == pytest.approx(0.8) and list(info.value.rows) == [1]


def test_bad_input_column_space():
    Y = np.abs(np.random.default_rng(0).standard_normal((20, 10)))
    with pytest.raises(ValueError, match="entries >= 0"):
        mr19.column_space(-Y, 2, bias=stats.norm())
    with pytest.raises(ValueError, match="k must be smaller than min"):
        mr19.column_space(Y, 10, method="centered")
    with pytest.raises(TypeError, match="k must be an integer"):
        mr19.column_space(Y, 2.5, method="centered")
    with pytest.raises(ValueError, match="needs the bias law"):
        mr19.column_space(Y, 2)
    with pytest.raises(ValueError, match="needs a density|law with a density"):
        mr19.column_space(Y, 2, bias=0.0)
    with pytest.raises(ValueError, match="method must be"):
        mr19.column_space(Y, 2, method="pca")
    with pytest.raises(ValueError, match="every coordinate of Y is zero"):
        mr19.ml_estimate(np.zeros((5, 3)), bias=stats.norm())
    with pytest.raises(ValueError, match="margin must be smaller"):
        mr19.ml_estimate(Y, bias=stats.norm(), gamma=1.0, margin=2.0)


def test_davis_kahan_bounds_hold():
    rng = np.random.default_rng(6)
    M = rng.standard_normal((300, 5)) @ rng.standard_normal((5, 200))
    U = np.linalg.svd(M)[0][:, :5]
    sk = np.linalg.svd(M, compute_uv=False)[4]
    for scale in (1e-3, 1e-1, 10):
        E = rng.standard_normal(M.shape)
        E *= scale * sk / np.linalg.norm(E)
        Uh = np.linalg.svd(M + E)[0][:, :5]
        sin_t, proc, _ = mr19.subspace_distance(Uh, U)
        b71, b72 = mr19.davis_kahan_bound(M, M + E, 5)
        assert sin_t <= b71 and proc <= b72
    sin_t, proc, ang = mr19.subspace_distance(np.linalg.svd(M)[0][:, :5], U)
    assert sin_t <= 1e-10 and proc <= 1e-10 and ang.max() <= 1e-10


def test_theorem3_constants():
    c = mr19.theorem3_constants(stats.expon(-2.0, 1.0), 1.0, 0.1)
    assert c["beta"] == pytest.approx(np.exp(-3) / 4, rel=1e-6)
    assert c["L"] == pytest.approx(1.0, rel=1e-6)
    assert c["omega"] == pytest.approx(0.00523615, rel=1e-5)
    assert c["bound_per_d"] == pytest.approx(166834.4, rel=1e-3)
    with pytest.warns(rf.RelufastWarning, match="vacuous"):
        g = mr19.theorem3_constants(stats.norm(0, 1), 1.0, 0.1)
    assert g["beta"] == 0 and g["bound_per_d"] == np.inf


def test_column_space_side_by_side():
    """Section 3 taken literally is weak; the centred SVD and the Tobit extension are not
    (setup: d = 200, k = 3, n = 100, B ~ N(0, 0.09); two draws averaged)."""
    law = stats.norm(0, 0.3)
    out = {"ml": [], "centered": [], "tobit": []}
    for seed in (0, 1):
        D = relu_dictionary(100, 200, 3, bias=law, random_state=seed)
        gamma = 1.01 * np.abs(D.M).max()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rf.RelufastWarning)
            for m in out:
                cs = mr19.column_space(D.Y, 3, method=m, bias=law, gamma=gamma)
                assert cs.basis.shape == (200, 3) and cs.from_paper == (m == "ml")
                out[m].append(mr19.subspace_distance(cs.basis, D.A)[0])
    ml, cen, tob = (np.mean(out[m]) for m in ("ml", "centered", "tobit"))
    assert 0.8 <= ml <= 1.4
    assert cen <= 0.6
    assert tob <= 0.4


def test_ml_error_grows_with_n():
    """(34) has no rank term: ||M - M-hat||_F^2 / d grows with n (measured 1.67 ... 14.5, docs/mr19.md)."""
    law = stats.norm(0, 0.3)
    errs = []
    for n in (5, 10, 20, 50):
        D = relu_dictionary(n, 2000, 3, bias=law, max_abs=0.95, random_state=n)
        est = mr19.ml_estimate(D.Y, bias=law, gamma=1.0)
        errs.append(np.linalg.norm(est.M - D.M) ** 2 / 2000)
    assert np.all(np.diff(errs) > 0), errs
    assert errs[-1] > 4 * errs[0]


def test_ml_mostly_zero_rows_warn():
    Y = np.zeros((20, 10))
    Y[:, :3] = np.random.default_rng(0).uniform(0.1, 1.0, (20, 3))
    with pytest.warns(rf.RelufastWarning, match="70% of the coordinates are zero in every sample"):
        est = mr19.ml_estimate(Y, bias=stats.norm(0, 1), gamma=1.0)
    assert np.all(est.M[:, 3:] == -1.0) and np.isnan(est.beta[3:]).all()


def test_ml_weak_gap_warns():
    law = stats.norm(0, 0.3)
    D = relu_dictionary(100, 200, 3, bias=law, random_state=0)
    with pytest.warns(rf.RelufastWarning, match="weak spectral gap"):
        mr19.column_space(D.Y, 3, bias=law, gamma=1.01 * np.abs(D.M).max())
