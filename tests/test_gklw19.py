"""GKLW19: symmetric inputs (Algorithms 1-4, the practical variant, the detector)."""

import warnings

import numpy as np
import pytest

import relufast as rf
from relufast.algorithms.gklw19 import (
    detector_matrix,
    detector_matrix_reference,
    population_detector,
    single_neuron,
)

#: Symmetrised samples make every GKLW19 identity hold exactly on the data (issue: 1e-9).
SYM_TOL = 1e-9


def _quiet(X, Y, k, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", rf.RelufastWarning)
        return rf.recover(X, Y, n_hidden=k, method="gklw19", random_state=0, **kw)


@pytest.mark.parametrize("law", ["gaussian", "mixture", "laplace", "uniform", "discrete"])
def test_exact_recovery_on_symmetrised_samples(law):
    net = rf.planted.gklw19_network(6, random_state=1)
    if law == "discrete":  # a discrete symmetric law: coordinates uniform on {-2, -1, 1, 2}
        X = np.random.default_rng(2).choice([-2.0, -1.0, 1.0, 2.0], size=(20000, 6))
        X = np.vstack([X, -X])
        Y = net(X)
    else:
        X, Y = net.sample(20000, random_state=2, input=law, symmetrize=True)
    res = _quiet(X, Y, 6)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.U < SYM_TOL and err.V < SYM_TOL


def test_k_smaller_than_d_and_non_square_A():
    net = rf.planted.gklw19_network(8, k=5, m=9, random_state=0)
    X, Y = net.sample(20000, random_state=1, input="mixture", symmetrize=True)
    res = _quiet(X, Y, 5)
    err = rf.metrics.parameter_error(res, net)
    assert res.exact and err.U < SYM_TOL and err.V < SYM_TOL
    assert res.U.shape == (9, 5)


@pytest.mark.parametrize("practical", [False, True])
def test_unsymmetrised_gaussian_10x10_is_accurate(practical):
    # The paper: n = 10,000, 10 x 10 orthonormal, Gaussian: average error ~0.15, MSE ~0.
    errs = []
    for seed in range(3):
        net = rf.planted.gklw19_network(10, random_state=seed)
        X, Y = net.sample(10000, random_state=seed + 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rf.RelufastWarning)
            res = rf.recover(X, Y, n_hidden=10, method="gklw19", practical=practical, random_state=0)
        errs.append(sum(rf.metrics.matched_squared_error(res, net)))
    assert np.median(errs) < 0.15


def test_single_neuron_algorithm_1():
    rng = np.random.default_rng(3)
    w = rng.standard_normal(7)
    X = rng.laplace(size=(5000, 7))
    X = np.vstack([X, -X])
    y = np.maximum(X @ w, 0)
    np.testing.assert_allclose(single_neuron(X, y), w, rtol=1e-10)


def test_detector_kernel_matches_numpy_and_merges():
    from relufast._native import core

    rng = np.random.default_rng(4)
    X = rng.standard_normal((3000, 5))
    Y = rng.standard_normal((3000, 4))
    for centred in (True, False):
        T, C, P = detector_matrix(X, Y, centred=centred)
        R, _, _ = detector_matrix_reference(X, Y, centred=centred)
        np.testing.assert_allclose(T, R, atol=1e-12 * np.abs(R).max())
    M = np.ascontiguousarray(np.linalg.solve(C, P.T).T)
    a, b = core.DetectorMoment(M), core.DetectorMoment(M)
    a.update(X[:1000], Y[:1000], 1, 64)
    b.update(X[1000:], Y[1000:], 2, 64)
    a.merge(b)
    np.testing.assert_allclose(a.matrix(True), detector_matrix(X, Y)[0], atol=1e-12)


def test_detector_population_value_for_orthonormal_W_gaussian_input():
    # Lemma 19 closed form vs Monte Carlo (MC error ~ n^-1/2).
    net = rf.planted.gklw19_network(4, random_state=5)
    X, Y = net.sample(1_000_000, random_state=6)
    T, _, _ = detector_matrix(X, Y)
    T0 = population_detector(net.V, net.U)
    assert np.abs(T - T0).max() < 0.02 * np.abs(T0).max()
    # The null space of the population detector is span{vec*(z z^T)}, z rows of A^{-1}.
    Z = np.linalg.inv(net.U)
    iu = np.triu_indices(4)
    for z in Z:
        assert np.linalg.norm(T0 @ np.outer(z, z)[iu]) < 1e-12 * np.linalg.norm(T0)


def test_noise_corrected_detector_is_unbiased_where_the_uncorrected_plateaus():
    # Spec Sec. 3.6: d = k = 8, sigma = 0.5: centred error falls with n, uncentred stays ~0.34.
    net = rf.planted.gklw19_network(8, random_state=7)
    Z = np.linalg.inv(net.U)
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    iu = np.triu_indices(8)
    S0 = np.linalg.qr(np.array([np.outer(z, z)[iu] for z in Z]).T)[0]
    errs = {True: [], False: []}
    for n in (20_000, 400_000):
        X, Y = net.sample(n, random_state=8, noise=0.5)
        for centred in (True, False):
            T, _, _ = detector_matrix(X, Y, centred=centred)
            S = np.linalg.svd(T)[2][-8:].T
            errs[centred].append(np.linalg.norm(S @ S.T - S0 @ S0.T, 2))
    assert errs[True][1] < errs[True][0] / 2 and errs[True][1] < 0.05
    assert errs[False][1] > 0.2  # biased plateau


def test_degenerate_cases():
    net = rf.planted.gklw19_network(4, random_state=0)
    X, Y = net.sample(2000, random_state=1)
    with pytest.raises(ValueError, match="n_hidden must be at most the input dimension d = 4"):
        rf.recover(X, Y, n_hidden=5, method="gklw19")
    # Asymmetric input: a warning that names the assumption.
    Xa = np.abs(X) + 0.5
    # (the failed fit warns too: every RelufastWarning is recorded, one must name symmetry)
    with pytest.warns(rf.RelufastWarning) as record:
        res = rf.recover(Xa, net(Xa), n_hidden=4, method="gklw19")
    assert any("does not look symmetric" in str(w.message) for w in record)
    assert not res.exact
    # Rank-deficient distinguishing matrix: W with two equal rows never separates them.
    W = net.V.copy()
    W[1] = W[0]
    bad = rf.planted.PlantedNetwork(U=net.U, V=W)
    Xb, Yb = bad.sample(20000, random_state=2, symmetrize=True)
    with pytest.warns(rf.RelufastWarning, match="distinguishing matrix is rank-deficient"):
        res = rf.recover(Xb, Yb, n_hidden=4, method="gklw19")
    assert res.status == "non_identifiable" and res.diagnostics["distinguishing_sigma"] < 1e-10


def test_planted_families():
    net = rf.planted.gklw19_network(10, condition_W=10.0, random_state=0)
    s = np.linalg.svd(net.V, compute_uv=False)
    assert s[0] / s[-1] == pytest.approx(10.0)
    p = rf.planted.smoothed_perturbation(net, 0.1, random_state=1)
    assert 0 < np.linalg.norm(p.V - net.V) < 2
    X = np.random.default_rng(2).standard_normal((1000, 10))
    Xq, Q = rf.planted.q_lambda_perturbation(X, 0.3, random_state=3)
    changed = np.any(Xq != X, axis=1).mean()
    assert 0.2 < changed < 0.4 and Q.shape == (10, 10)
    Xm, _ = net.sample(100000, random_state=4, input="mixture")
    np.testing.assert_allclose(np.cov(Xm.T), np.eye(10) + 1.0, atol=0.05)


def test_reproduce_writes_csv_and_png(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from relufast import reproduce

    monkeypatch.setattr(reproduce, "_grid", lambda name, full: [("10x10", "n", 3000, dict(d=10, n=3000))])
    rows = reproduce.main("gklw19-fig2", trials=1, out=str(tmp_path), progress=False)
    assert (tmp_path / "gklw19-fig2.csv").stat().st_size > 0
    assert (tmp_path / "gklw19-fig2.png").stat().st_size > 0
    assert rows[0]["error_W"] < 0.1


def test_reproduce_figure_labels_axes_and_shows_the_spread():
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    from relufast import reproduce

    rows = []
    for x, bad in ((500, 0.25), (1000, 0.1)):
        row = {"panel": "10x10", "x_name": "n", "x": x, "trials": 5}
        for key in ("error_W", "error_A", "mse"):
            row.update({key: bad, key + "_q25": 0.04, key + "_median": 0.05, key + "_q75": 0.06})
        rows.append(row)
    fig = reproduce.figure(rows, "gklw19-fig2")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "number of training samples n" and ax.get_ylabel()
    assert len(ax.collections) == 3  # one interquartile band per quantity
    assert all(np.allclose(line.get_ydata(), 0.05) for line in ax.get_lines())  # medians, not means
    assert "median and interquartile band over 5 trials" in fig._suptitle.get_text()
    plt.close(fig)
