"""BJW19 under noise and beyond ReLU: error curves, PCP cost, and each method's time.

Every entry records its quality figure (errors, residual, slope) in extra_info.
"""

import numpy as np
import pytest

import relufast as rf
from relufast.stages.robust_pca import principal_component_pursuit


def _net(seed):
    return rf.planted.two_layer(
        d=8, k=3, m=6, random_state=seed, max_condition=3.0, max_cos=0.7, max_output_condition=10.0
    )


def _noisy_errors(n, sigma, seeds, polish_steps=0):
    errs = []
    for seed in seeds:
        net = _net(seed)
        X, Y = net.sample(n, random_state=seed + 100, noise=sigma)
        res = rf.recover(X, Y, n_hidden=3, method="bjw19-noisy", random_state=0, polish_steps=polish_steps)
        e = rf.metrics.parameter_error(res, net)
        errs.append((np.linalg.norm(res.V - net.V[e.permutation]), e.U))
    return np.median(np.array(errs), axis=0)


@pytest.mark.parametrize("polish_steps", [0, 5])
def test_noisy_error_vs_n(benchmark, polish_steps):
    """Median |V - V*|_F over 5 seeds vs n at sigma = 0.5, and the fitted log-log slope."""
    ns = [10_000, 30_000, 100_000, 300_000]
    table = benchmark.pedantic(
        lambda: [_noisy_errors(n, 0.5, range(5), polish_steps) for n in ns], rounds=1, iterations=1
    )
    v = np.array([t[0] for t in table])
    slope = float(np.polyfit(np.log(ns), np.log(v), 1)[0])
    benchmark.extra_info.update(
        {
            "n": ns,
            "median_V_error": v.tolist(),
            "median_U_rel_error": [float(t[1]) for t in table],
            "loglog_slope_V": slope,
            "sigma": 0.5,
            "polish_steps": polish_steps,
        }
    )
    assert -0.8 < slope < -0.3  # n^-1/2


def test_noisy_error_vs_sigma(benchmark):
    sigmas = [0.0, 0.1, 0.3, 1.0, 3.0]
    table = benchmark.pedantic(lambda: [_noisy_errors(50_000, s, range(5)) for s in sigmas], rounds=1, iterations=1)
    benchmark.extra_info.update(
        {
            "sigma": sigmas,
            "n": 50_000,
            "median_V_error": [float(t[0]) for t in table],
            "median_U_rel_error": [float(t[1]) for t in table],
        }
    )


@pytest.mark.parametrize("m,n", [(100, 2000), (100, 8000), (400, 2000), (200, 3000)])
def test_pcp_time_and_iterations(benchmark, m, n):
    net = rf.planted.two_layer(d=5, k=3, m=m, random_state=0, orthonormal_U=True)
    X, Y0 = net.sample(n, random_state=1)
    Y, support = rf.planted.sparse_corruption(Y0, 0.05, random_state=2)
    r = benchmark.pedantic(principal_component_pursuit, args=(Y,), rounds=2, iterations=1)
    benchmark.extra_info.update(
        {
            "iterations": r.iterations,
            "rank": r.rank,
            "rel_error_L": float(np.linalg.norm(r.L - Y0) / np.linalg.norm(Y0)),
            "support_exact": bool(np.array_equal(np.abs(r.S) > 1e-7 * np.abs(Y).max(), support)),
        }
    )


METHODS = {
    "bjw19-gaussian": dict(d=20, k=5, m=8, n=100_000, noise=0.0),
    "bjw19-noisy": dict(d=20, k=5, m=8, n=100_000, noise=0.3),
    "bjw19-ica": dict(d=20, k=5, m=8, n=100_000, noise=0.0, orthonormal_V=True),
    "bjw19-sparse-noise": dict(d=5, k=3, m=100, n=2000, noise=0.0, orthonormal_U=True),
    "bjw19-independent-noise": dict(d=5, k=2, m=4, n=200_000, noise=0.3),
    "bjw19-fpt": dict(d=8, k=6, m=2, n=20_000, noise=0.0),
    "bjw19-enumeration": dict(d=4, k=3, m=3, n=400, noise=0.0, input="laplace"),
    "relu2 (bjw19-gaussian)": dict(d=20, k=5, m=8, n=100_000, noise=0.0, activation="relu2"),
    "expm1 (bjw19-gaussian)": dict(d=8, k=4, m=6, n=50_000, noise=0.0, activation="expm1"),
}


@pytest.mark.parametrize("name", list(METHODS))
def test_method_time(benchmark, name):
    cfg = dict(METHODS[name])
    n, noise, law = cfg.pop("n"), cfg.pop("noise"), cfg.pop("input", "gaussian")
    act = cfg.get("activation")
    net = rf.planted.two_layer(random_state=0, max_cos=0.8, **cfg)
    X, Y = net.sample(n, random_state=1, noise=noise, input=law)
    method = name.split("(")[-1].rstrip(")") if "(" in name else name
    kwargs = {"n_hidden": cfg["k"], "method": method, "random_state": 0}
    if act is not None:
        kwargs["activation"] = act
    if method == "bjw19-sparse-noise":
        Y, _ = rf.planted.sparse_corruption(Y, 0.05, random_state=2)
    if method == "bjw19-independent-noise":
        kwargs["given_M"] = np.linalg.pinv(net.U) + 1e-3 * np.random.default_rng(0).standard_normal(
            (cfg["k"], cfg["m"])
        )
    res = benchmark.pedantic(rf.recover, args=(X, Y), kwargs=kwargs, rounds=3, iterations=1)
    err = rf.metrics.parameter_error(res, net)
    benchmark.extra_info.update(
        {
            "shape": {"n": n, **{k: v for k, v in cfg.items() if k in "dkm"}},
            "noise": noise,
            "status": res.status.value,
            "error_U": err.U,
            "error_V": err.V,
            "residual": res.residual,
        }
    )
