"""ATV21 (Awasthi, Tang, Vijayaraghavan, NeurIPS 2021): Hermite coefficients, moments,
Algorithm 6 on exact tensors, sampled recovery made exact by region refinement."""

import warnings

import numpy as np
import pytest
from scipy.integrate import quad

import relufast as rf
from relufast.algorithms import atv21 as A
from relufast.network import Network
from relufast.planted import PlantedNetwork
from relufast.stages.hermite import hermite_he
from relufast.stages.moments import HermiteAccumulator, projected_hermite_moments, projected_hermite_reference

#: Exact recovery: machine precision times the conditioning of the fits (issue: 1e-10).
EXACT_TOL = 1e-10
#: c_k against adaptive quadrature (spec oracle 1; quad reaches ~1e-14).
QUAD_TOL = 1e-12
#: Pairing formula vs the recursion form of He_r: both are sums of O(1) terms in float64.
ALGEBRA_TOL = 1e-13


def bounded_network(d, k, m, seed, b=None, c=None):
    """B-bounded teacher (ATV21 Sec. 1.1): |U_ij| in [0.5, 1.5], |b| <= 1, unit rows."""
    r = np.random.default_rng(seed)
    V = r.standard_normal((k, d))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    U = r.choice([-1.0, 1.0], size=(m, k)) * r.uniform(0.5, 1.5, (m, k))
    b = r.uniform(-1, 1, k) if b is None else np.broadcast_to(np.asarray(b, float), (k,))
    c = np.zeros(m) if c is None else np.broadcast_to(np.asarray(c, float), (m,))
    return PlantedNetwork(U=U, V=V, b=b, c=c)


def quiet(f, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        return f(*a, **kw)


# ---- Lemma 3.5: c_k(b) ----------------------------------------------------------------


def test_coefficient_table():
    # Spec Sec. 2.4 reference values (exact to the printed digits).
    table = {
        -2: (0.008490702617, 0.022750131948, 0.053990966513, 0.107981933026, 0.161972899540),
        0: (0.398942280401, 0.5, 0.398942280401, 0.0, -0.398942280401),
        1: (1.083315470588, 0.841344746069, 0.241970724519, -0.241970724519, 0.0),
    }
    for b, row in table.items():
        got = [A.hermite_coefficient(r, b) for r in range(5)]
        np.testing.assert_allclose(got, row, atol=1e-12)


@pytest.mark.parametrize("b", [-4, -3, -1.3, -0.2, 0, 0.5, 1, 2.7, 4])
@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
def test_coefficient_matches_quadrature(b):
    phi = lambda z: np.exp(-z * z / 2) / np.sqrt(2 * np.pi)
    for r in range(9):
        val = quad(
            lambda z, r=r: (z + b) * hermite_he(r, z) * phi(z),
            -b,
            np.inf,
            epsabs=1e-15,
            epsrel=1e-14,
            limit=200,
        )[0]
        assert abs(A.hermite_coefficient(r, b) - val) <= QUAD_TOL


def test_non_unit_rows_scale_like_the_spec_oracle():
    # Spec oracle 2: E[relu(w.x + b) He_k(u.x)] for w = (1.7, -0.4), b = -0.6, u at angle 0.9.
    net = Network(np.ones((1, 1)), np.array([[1.7, -0.4]]), np.array([-0.6]))
    u = np.array([np.cos(0.9), np.sin(0.9)])
    T = A.population_tensors(net, order=4)
    got = []
    for r, t in enumerate(T):
        t = t[0]
        for _ in range(r):
            t = np.tensordot(t, u, axes=([0], [0]))
        got.append(float(t))
    want = [0.4374410872421, 0.2717811088322, 0.1190095981966, 0.0174044205328, -0.0190189670933]
    np.testing.assert_allclose(got, want, atol=1e-9)


# ---- moments: C++ kernel vs NumPy reference, mergeable, N^-1/2 ---------------------------


def test_projected_moments_match_reference_and_merge():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3000, 6))
    Y = rng.standard_normal((3000, 2))
    P = np.linalg.qr(rng.standard_normal((6, 3)))[0]
    got = projected_hermite_moments(X, Y, P)
    ref = projected_hermite_reference(X, Y, P)
    for r, (g, e) in enumerate(zip(got, ref)):
        assert g.shape == (2,) + (3,) * r
        assert np.max(np.abs(g - e)) <= ALGEBRA_TOL * max(1.0, np.max(np.abs(e)))
    # Symmetric under index permutations.
    assert np.allclose(got[4], got[4].transpose(0, 2, 1, 4, 3), atol=1e-15)
    # Batches merge to the one-shot sums; no basis: the identity.
    acc = HermiteAccumulator(2, basis=P).add(X[:1000], Y[:1000])
    acc.merge(HermiteAccumulator(2, basis=P).add(X[1000:], Y[1000:]))
    for g, e in zip(acc.tensors(), got):
        np.testing.assert_allclose(g, e, atol=1e-14)
    full = projected_hermite_moments(X[:, :3], Y, order=6)
    for g, e in zip(full, projected_hermite_reference(X[:, :3], Y, order=6)):
        np.testing.assert_allclose(g, e, atol=1e-12 * max(1.0, np.abs(e).max()))


def test_moment_validation():
    X = np.zeros((10, 4))
    with pytest.raises(ValueError, match="order must be an integer in 0..6"):
        HermiteAccumulator(1, order=7, n_features=4)
    with pytest.raises(ValueError, match="give either basis"):
        HermiteAccumulator(1)
    with pytest.raises(ValueError, match=r"P has shape \(3, 2\), expected \(d, k\) = \(4, 2\)"):
        HermiteAccumulator(1, basis=np.zeros((3, 2))).add(X, np.zeros((10, 1)))
    with pytest.raises(ValueError, match="no samples"):
        HermiteAccumulator(1, n_features=4).tensors()


def test_tensor_error_falls_like_inverse_sqrt_n():
    # Spec oracle 8 (i): over a 10x increase in N the Frobenius error ratio is in [0.2, 0.5].
    net = Network(
        np.array([[1.0, -1.2, 0.9]]),
        np.linalg.qr(np.random.default_rng(3).standard_normal((5, 3)))[0].T,
        np.array([0.4, -0.5, 0.7]),
    )
    pop = [t[0] for t in A.population_tensors(net)]
    errs = {}
    for n in (40000, 400000):
        e3, e4 = [], []
        for seed in range(3):
            X = np.random.default_rng(seed).standard_normal((n, 5))
            T = [t[0] for t in projected_hermite_moments(X, net(X))]
            e3.append(np.linalg.norm(T[3] - pop[3]))
            e4.append(np.linalg.norm(T[4] - pop[4]))
        errs[n] = (np.mean(e3), np.mean(e4))
    for j in range(2):
        ratio = errs[400000][j] / errs[40000][j]
        assert 0.2 <= ratio <= 0.5, ratio


# ---- Algorithm 6 on exact tensors -------------------------------------------------------


def test_exact_tensors_recover_every_unit_including_invisible_ones():
    # Spec oracle 5: b = 0 is invisible in T_3 and b = 1 in T_4; the union sees all four.
    rng = np.random.default_rng(0)
    W = rng.standard_normal((4, 6))
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    a = np.array([1.2, -0.7, 0.9, -1.5])
    b = np.array([0.0, 1.0, -1.2, 0.4])
    net = Network(a[None, :], W, b, np.array([0.3]))
    T = [t[0] for t in A.population_tensors(net)]
    ah, Vh, bh, c0, diag = A.recover_from_tensors(T, 4, random_state=0)
    perm = np.argmax(Vh @ W.T, axis=1)
    assert sorted(perm) == [0, 1, 2, 3]
    err = np.abs(ah - a[perm]) + np.abs(bh - b[perm]) + np.linalg.norm(Vh - W[perm], axis=1)
    assert err.max() <= EXACT_TOL
    assert abs(c0 - 0.3) <= EXACT_TOL
    assert diag["flattening_rank_T3"] == 3 and diag["flattening_rank_T4"] == 3
    inv = np.argsort(perm)
    assert not diag["visible_T3"][inv[0]] and diag["visible_T4"][inv[0]]
    assert diag["visible_T3"][inv[1]] and not diag["visible_T4"][inv[1]]
    # FixSigns: z_i = xi_i Phi(b_i) (before the flip).
    from scipy.special import ndtr

    np.testing.assert_allclose(np.abs(diag["fixsigns_z"]), ndtr(bh), atol=1e-12)


def test_recover_from_tensors_validation():
    with pytest.raises(ValueError, match=r"T_0..T_4"):
        A.recover_from_tensors([np.zeros(())] * 3, 1)
    T = [np.zeros(()), np.zeros(2), np.zeros((2, 2)), np.zeros((2,) * 3), np.zeros((2,) * 4)]
    with pytest.raises(ValueError, match="at most the dimension p = 2"):
        A.recover_from_tensors(T, 3)


# ---- sampled data: exact after refinement -------------------------------------------------

CASES = {
    "m1-biased": (6, 3, 1, 100000, None, None),
    "m3-offset": (8, 4, 3, 100000, None, 0.7),
    "m1-zero-bias": (6, 3, 1, 100000, 0.0, None),
    "m1-offset": (7, 3, 1, 100000, None, -1.3),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sampled_recovery_is_exact(case):
    d, k, m, n, b, c = CASES[case]
    net = bounded_network(d, k, m, 1, b=b, c=c)
    X, Y = net.sample(n, random_state=2)
    if m == 1:
        Y = Y[:, 0]  # 1-D outputs are accepted
    res = rf.recover(X, Y, n_hidden=k, method="atv21", random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.status == "exact" and res.exact and res.residual <= EXACT_TOL
    assert max(err.U, err.V, err.b, err.c) <= EXACT_TOL
    assert res.b.shape == (k,) and res.c.shape == (m,)
    np.testing.assert_allclose(res.predict(X[:100]).reshape(100, m), net(X[:100]), atol=1e-10)
    assert res.diagnostics["refine_rounds"] >= 1 and not res.diagnostics["undetermined_units"]


def test_without_refinement_the_estimate_is_approximate():
    net = bounded_network(6, 3, 1, 1)
    X, Y = net.sample(100000, random_state=2)
    res = quiet(A.atv21, X, Y, 3, refine=False, random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.status == "approximate" and not res.exact
    # Spec oracle 8 measured ~0.1-0.6 at N = 1e5-1e6 on a similar instance.
    assert err.max_angle < 0.5 and res.residual < 0.2


def test_outside_the_basin_fails_with_a_clear_message():
    # 3000 samples for d = 10, k = 5: the tensor estimate is far off.
    net = bounded_network(10, 5, 1, 4)
    X, Y = net.sample(3000, random_state=5)
    with pytest.warns(rf.RelufastWarning, match="outside the basin"):
        res = A.atv21(X, Y, 5, random_state=0)
    assert res.status == "failed" and not res.exact


def test_never_exact_on_a_wrong_network():
    # Noisy outputs and a wrong k: the residual certificate cannot pass.
    net = bounded_network(6, 3, 2, 6, c=0.4)
    X, Y = net.sample(60000, random_state=7, noise=1e-3)
    res = quiet(A.atv21, X, Y, 3, random_state=0)
    assert not res.exact and res.status != "exact"
    X, Y = net.sample(60000, random_state=7)
    res = quiet(A.atv21, X, Y, 2, random_state=0)
    assert not res.exact and res.residual > 1e-6


def test_bad_input():
    X = np.random.default_rng(0).standard_normal((500, 4))
    with pytest.raises(ValueError, match="n_hidden must be at most the input dimension d = 4"):
        A.atv21(X, X[:, 0], 5)
    with pytest.raises(ValueError, match="same number of samples"):
        A.atv21(X, X[:-1, 0], 2)
    with pytest.raises(ValueError, match="at least max"):
        A.atv21(X[:20], X[:20, 0], 2)
    with pytest.raises(ValueError, match="tol must be a positive number"):
        A.atv21(X, X[:, 0], 2, tol=-1.0)
    with pytest.raises(ValueError, match="margin must be a number >= 0"):
        A.atv21(X, X[:, 0], 2, margin=-1.0)
    Xn = X.copy()
    Xn[0, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        A.atv21(Xn, X[:, 0], 2)
    with pytest.raises(TypeError, match="n_hidden must be an integer"):
        A.atv21(X, X[:, 0], 2.5)


def test_bias_free_method_names_the_offset():
    net = rf.planted.two_layer(8, 3, 4, random_state=0, offset="random")
    X, Y = net.sample(20000, random_state=1)
    with pytest.warns(rf.RelufastWarning, match="output offset or hidden biases.*method='atv21'"):
        res = rf.recover(X, Y, n_hidden=3, method="bjw19-gaussian")
    assert not res.exact


def test_auto_routes_biases_and_single_outputs_to_atv21():
    net = bounded_network(6, 3, 4, 2, c=0.5)
    X, Y = net.sample(60000, random_state=3)
    res = rf.recover(X, Y, n_hidden=3)
    assert res.method == "atv21" and "offset or hidden biases" in res.diagnostics["auto"] and res.exact
    net = rf.planted.two_layer(6, 3, 1, random_state=0)  # bias-free, m = 1 < k
    X, Y = net.sample(10, random_state=1)
    from relufast._auto import _choose

    assert _choose(X, Y, 3)[0] in ("atv21", ("bjw19-fpt", "atv21"))
    X, Y = net.sample(20000, random_state=1)
    assert _choose(X, Y, 3)[0] == "atv21"


# ---- population L2 distance ---------------------------------------------------------------


def test_relu_kernel_spot_values():
    # Spec oracle 11.
    K = rf.metrics.relu_kernel
    assert abs(K(0.3, -0.5, 0.4) - 0.198975781072744) < 1e-13
    assert abs(K(-1, 1.2, -0.7) - 0.0214567686447997) < 1e-13
    assert abs(K(0, 0, 0) - 1 / (2 * np.pi)) < 1e-14
    assert abs(K(1.5, 0.2, 0.9) - 1.28167661678790) < 1e-12
    assert abs(K(0.4, 0.9, 1) - 1.22281669486303) < 1e-12
    assert abs(K(0.4, 0.9, -1) - 0.136205791823812) < 1e-12
    # Continuous at rho = +-1.
    assert abs(K(0.4, 0.9, 0.999999) - K(0.4, 0.9, 1)) < 1e-5
    assert abs(K(0.4, 0.9, -0.999999) - K(0.4, 0.9, -1)) < 1e-5


def test_population_l2_against_monte_carlo():
    a = rf.planted.two_layer(4, 3, 2, random_state=0, bias="random", offset="random")
    b = rf.planted.two_layer(4, 2, 2, random_state=1, bias="random", offset="random")
    X = np.random.default_rng(0).standard_normal((400000, 4))
    D = np.sum((a(X) - b(X)) ** 2, axis=1)
    exact = rf.metrics.population_l2(a, b)
    # Monte Carlo standard error of E[D] from the sample spread; 5 sigma.
    se = D.std() / np.sqrt(len(D))
    assert abs(exact**2 - D.mean()) < 5 * se
    assert rf.metrics.population_l2(a, a) == 0.0
    with pytest.raises(ValueError, match="same input and output dimensions"):
        rf.metrics.population_l2(a, rf.planted.two_layer(5, 2, 2, random_state=0))


# ---- Theorem 3.2: l = 2, signs ambiguous; Algorithm 5 -------------------------------------


def _overcomplete(seed=1, d=5, k=9):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((k, d))
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    b = rng.uniform(-1.5, 1.5, k)
    b[0], b[1] = np.sqrt(3 - np.sqrt(6)), 0.0  # roots of He_4 (invisible in T_6) and He_3 (in T_5)
    a = rng.choice([-1.0, 1.0], k) * rng.uniform(0.5, 2.0, k)
    return PlantedNetwork(U=a[None, :], V=W, b=b, c=np.zeros(1))


def test_exact_tensors_overcomplete_up_to_sign():
    # Spec oracle 6: d = 5, k = 9 > d; recovery up to a per-unit sign of (w, b), exact a.
    net = _overcomplete()
    T = [t[0] for t in A.population_tensors(net, order=6)]
    a, V, b, _ = A.recover_general_from_tensors(T, 9, random_state=0)
    C = V @ net.V.T
    perm = np.argmax(np.abs(C), axis=1)
    xi = np.sign(C[np.arange(9), perm])
    assert sorted(perm) == list(range(9))
    err = (
        np.abs(a - net.U[0, perm])
        + np.abs(xi * b - net.b[perm])
        + np.linalg.norm(xi[:, None] * V - net.V[perm], axis=1)
    )
    assert err.max() <= EXACT_TOL


def test_algorithm5_fits_k_plus_two_units():
    # Spec oracle 10: exact units with ambiguous signs, 2 features per unit + (x, 1).
    net = _overcomplete(seed=2, k=8)
    T = [t[0] for t in A.population_tensors(net, order=6)]
    _, V, b, _ = A.recover_general_from_tensors(T, 8, random_state=0)
    X, Y = net.sample(100000, random_state=3)
    U2, V2, b2, c2 = A.fit_network(X, Y, V, b)
    assert V2.shape[0] <= 8 + 2
    Xt, Yt = net.sample(10000, random_state=4)
    pred = np.maximum(Xt @ V2.T + b2, 0.0) @ U2.T + c2
    # Machine precision squared (prototype: 2.4e-29); 1e-20 leaves room for conditioning.
    assert np.mean((pred - Yt) ** 2) <= 1e-20


def test_general_sampled_states_the_sign_ambiguity():
    rng = np.random.default_rng(5)
    V = rng.standard_normal((6, 4))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    net = PlantedNetwork(
        U=np.array([[1.0, -1.2, 0.9, 1.1, -0.8, 1.3]]),
        V=V,
        b=np.array([0.3, -0.5, 0.2, 0.6, -0.2, 0.1]),
        c=np.array([0.2]),
    )
    X, Y = net.sample(400000, random_state=5)
    res = quiet(rf.recover, X, Y, n_hidden=6, method="atv21-general", random_state=0)
    # Without fit=True the sign-ambiguous units are oriented by the linear term of a
    # least-squares fit and U, c fitted (issue 31 item 12: before, T_2 / phi(b) with
    # arbitrary signs fitted Y worse than its mean, residual ~31, `failed`).
    assert res.status == "approximate" and "sign" in res.message
    assert 0 < res.residual < 1 and "not a useful fit" not in res.message
    assert res.diagnostics["sign_ambiguous"] == tuple(range(6)) and res.V.shape == (6, 4)
    # Directions (sign-free) are estimated; sampled l = 2 is sample-hungry, so only a loose check.
    assert np.median(np.abs(res.V @ net.V.T).max(axis=1)) > 0.9
    fit = quiet(rf.recover, X, Y, n_hidden=6, method="atv21-general", fit=True, random_state=0)
    assert fit.V.shape[0] <= 6 + 2 and fit.status == "approximate"
    # Algorithm 5's network is a useful function estimate: L2 error well below ||f||.
    zero = Network(net.U * 0, net.V, net.b, np.zeros(1))
    assert rf.metrics.population_l2(fit, net) < 0.3 * rf.metrics.population_l2(net, zero)


def test_general_validation():
    X = np.random.default_rng(0).standard_normal((2000, 3))
    with pytest.raises(ValueError, match=r"n_hidden <= d \(d \+ 1\) / 2 = 6"):
        A.atv21_general(X, X[:, 0], 7)
    with pytest.raises(ValueError, match="needs at least"):
        A.atv21_general(X[:100], X[:100, 0], 5)
    with pytest.raises(ValueError, match=r"T_0..T_6"):
        A.recover_general_from_tensors([np.zeros(())] * 5, 2)


def test_unit_with_large_bias_is_reported_not_dropped():
    # Spec oracle 13 (c): b = 6 makes a unit active on every sample (phi(6) ~ 6e-9 in every
    # tensor): it cannot be recovered, and the result says so instead of dropping it.
    r = np.random.default_rng(0)
    V = r.standard_normal((3, 6))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    net = PlantedNetwork(U=np.array([[1.0, -0.9, 1.1]]), V=V, b=np.array([0.3, -0.4, 6.0]), c=np.zeros(1))
    X, Y = net.sample(100000, random_state=1)
    with pytest.warns(rf.RelufastWarning, match="detection limit"):
        res = A.atv21(X, Y, 3, random_state=0)
    assert not res.exact and res.V.shape == (3, 6)
    assert res.diagnostics["units_below_noise"] or res.diagnostics["units_large_bias"]


def test_error_is_linear_in_tensor_perturbation():
    # Spec oracle 7 (l = 1): exact tensors plus symmetric noise of Frobenius norm eta; the
    # parameter error is <= C eta with C stable (prototype: 45-72; bound 300), slope ~1.
    from relufast.stages.moments import _symmetrize

    rng = np.random.default_rng(7)
    W = rng.standard_normal((4, 6))
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    net = Network(np.array([[1.2, -0.7, 0.9, -1.5]]), W, np.array([0.3, -0.8, 1.2, -0.4]))
    T = [t[0] for t in A.population_tensors(net)]
    etas = [1e-4, 1e-5, 1e-6]
    errs = []
    for eta in etas:
        trial = []
        for _ in range(5):
            noisy = []
            for r, t in enumerate(T):
                E = rng.standard_normal(t.shape)
                E = _symmetrize(E[None])[0] if r >= 2 else E
                noisy.append(t + eta * E / max(np.linalg.norm(E), 1e-300))
            a, V, b, _, _ = A.recover_from_tensors(noisy, 4, random_state=0)
            perm = np.argmax(V @ W.T, axis=1)
            trial.append(
                np.max(np.abs(a - net.U[0, perm]) + np.abs(b - net.b[perm]) + np.linalg.norm(V - W[perm], axis=1))
            )
        errs.append(np.median(trial))
    errs = np.array(errs)
    assert np.all(errs / etas <= 300)
    slope = np.polyfit(np.log(etas), np.log(errs), 1)[0]
    assert 0.8 <= slope <= 1.2


# ---- several outputs: directions from the output pencil (relufast's own) ----------------


def test_output_pencil_recovers_exact_directions():
    # P2[q] = sum_i C_qi w_i w_i^T and T_2 = sum_i beta_i w_i w_i^T: Jennrich with T_2 as the
    # second matrix gives the w_i (up to sign) from two outputs on.
    rng = np.random.default_rng(3)
    k, q = 5, 2
    Wt = rng.standard_normal((k, k))
    Wt /= np.linalg.norm(Wt, axis=0)
    C, beta = rng.standard_normal((q, k)), rng.uniform(0.5, 1.5, k)
    P2 = np.einsum("qi,ai,bi->qab", C, Wt, Wt)
    T2 = (Wt * beta) @ Wt.T
    for polish in ("cp", "jennrich"):
        Z, diag = A.tensors._output_pencil(P2, T2, np.random.default_rng(0), 10, polish)
        cos = np.abs(Z.T @ Wt).max(axis=0)
        assert np.all(1.0 - cos < 1e-10), (polish, cos)
        assert "output pencil" in diag["directions_from"]


def test_several_outputs_start_from_the_output_pencil():
    net = bounded_network(10, 5, 6, 2, c=0.3)
    X, Y = net.sample(60000, random_state=3)
    res = rf.recover(X, Y, n_hidden=5, method="atv21", random_state=0)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and max(err.U, err.V, err.b, err.c) <= EXACT_TOL
    assert res.diagnostics["restarts"] == 1 and "output pencil" in res.diagnostics["directions_from"]
    # 2 <= m < k: T_3/T_4 first; one output: only T_3/T_4; refine=False: the paper's estimate.
    for Ys in (Y[:, :3], Y[:, 0]):
        first = quiet(A.atv21, X, Ys, 5, random_state=0)
        assert first.diagnostics["restart_residuals"].size >= 1
        if first.diagnostics["restarts"] == 1:
            assert "T_3 and T_4" in first.diagnostics["directions_from"]
    paper = quiet(A.atv21, X, Y, 5, random_state=0, refine=False)
    assert "T_3 and T_4" in paper.diagnostics["directions_from"]


def test_too_many_regions_refines_on_fewer_rows(monkeypatch):
    # More populated activation regions than the region pass allows (at k near 20 nearly
    # every sample has its own): the refinement runs on REGION_ROWS rows (never more regions
    # than rows) instead of raising, and the certificate still reads every sample.
    from relufast.stages import refine as R

    calls = []

    def small_limit(X, Y, V, b, **kw):
        calls.append(len(X))
        return R.region_refine(X, Y, V, b, max_regions=LIMIT, **kw)

    LIMIT = 300
    monkeypatch.setattr(A.pipeline, "region_refine", small_limit)
    monkeypatch.setattr(A.pipeline, "REGION_ROWS", LIMIT)
    monkeypatch.setattr(A.lift, "LM_MAX_PARAMS", 0)  # the region pass, not Levenberg-Marquardt
    net = bounded_network(12, 9, 3, 1)
    X, Y = net.sample(60000, random_state=2)
    res = quiet(A.atv21, X, Y, 9, random_state=0, n_estimate="all")
    assert calls[0] > LIMIT and LIMIT in calls  # the fallback ran
    assert res.status in ("exact", "failed", "non_identifiable")
    assert not res.exact or rf.metrics.parameter_error(res, net).V <= EXACT_TOL
    with pytest.raises(R.TooManyRegions, match="max_regions"):
        R.region_refine(X, Y, net.V, net.b, max_regions=5)
