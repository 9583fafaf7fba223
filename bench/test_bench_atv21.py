"""ATV21 benchmarks: projected Hermite moment throughput by order; error and time vs n with
and without the activation-region refinement; refinement rounds and time vs (d, k);
success on random teachers; adaptive estimation against the moments over every sample.

Run: python -m pytest bench/test_bench_atv21.py --benchmark-only. Threads: the C++ kernels
use all cores (n_jobs=None) unless a test says otherwise; NumPy runs single-threaded
inside the pipelines. Every benchmark records its quality figure in ``extra_info``.
"""

import warnings

import numpy as np
import pytest

import relufast as rf
from relufast.algorithms import atv21 as A
from relufast.planted import PlantedNetwork
from relufast.stages.moments import HermiteAccumulator, projected_hermite_reference
from relufast.stages.refine import region_refine


def bounded_network(d, k, m, seed, c=0.0):
    r = np.random.default_rng(seed)
    V = r.standard_normal((k, d))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    U = r.choice([-1.0, 1.0], size=(m, k)) * r.uniform(0.5, 1.5, (m, k))
    return PlantedNetwork(U=U, V=V, b=r.uniform(-1, 1, k), c=np.full(m, c))


def fit_each(benchmark, data, k, **options):
    """One benchmarked round of ``atv21`` on every (X, Y) of ``data`` (random_state = its
    index, warnings silenced); returns the results."""
    results = []

    def run():
        results.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rf.RelufastWarning)
            for s, (X, Y) in enumerate(data):
                results.append(A.atv21(X, Y, k, random_state=s, **options))

    benchmark.pedantic(run, rounds=1, warmup_rounds=0)
    return results


@pytest.mark.parametrize("order", [2, 3, 4])
@pytest.mark.parametrize("threads", [1, 2])
def test_moment_throughput(benchmark, machine, order, threads):
    """n = 1e6 samples, d = 50 projected to k = 10, m = 1: samples per second by order."""
    n, d, k = 1_000_000, 50, 10
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d))
    y = rng.standard_normal((n, 1))
    P = np.linalg.qr(rng.standard_normal((d, k)))[0]

    def run():
        return HermiteAccumulator(1, order=order, basis=P, n_jobs=threads).add(X, y).tensors()

    T = benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    ref = projected_hermite_reference(X[:2000], y[:2000], P, order=order)
    got = HermiteAccumulator(1, order=order, basis=P).add(X[:2000], y[:2000]).tensors()
    flops = 2.0 * n * (d * k + sum(k**r for r in range(1, order + 1)))
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "threads": threads,
            "order": order,
            "samples_per_s": n / benchmark.stats.stats.min,
            "gflops": flops / benchmark.stats.stats.min / 1e9,
            "max_abs_diff_vs_numpy": float(max(np.abs(a - b).max() for a, b in zip(got, ref))),
            "shape_T_top": T[-1].shape,
        }
    )


@pytest.mark.parametrize("refine", [False, True])
@pytest.mark.parametrize("n", [30_000, 100_000, 300_000, 1_000_000])
def test_error_and_time_vs_n(benchmark, machine, n, refine):
    """d = 10, k = 5, m = 1, B-bounded teacher with offset 0.5 (3 seeds: median error)."""
    nets = [bounded_network(10, 5, 1, s, c=0.5) for s in range(3)]
    data = [net.sample(n, random_state=100 + s) for s, net in enumerate(nets)]
    results = fit_each(benchmark, data, 5, refine=refine)
    errs = [rf.metrics.parameter_error(r, net) for r, net in zip(results, nets)]
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "n": n,
            "refine": refine,
            "seconds_per_fit": benchmark.stats.stats.min / 3,
            "median_V_error": float(np.median([e.V for e in errs])),
            "median_b_error": float(np.median([e.b for e in errs])),
            "median_max_angle": float(np.median([e.max_angle for e in errs])),
            "statuses": [r.status.value for r in results],
            "median_residual": float(np.median([r.residual for r in results])),
        }
    )


@pytest.mark.parametrize("d,k", [(10, 4), (20, 6), (50, 10), (100, 12)])
def test_refinement_rounds_vs_dk(benchmark, machine, d, k):
    """Region refinement from a 0.2 rad estimate, m = 1, n = 2e5."""
    rng = np.random.default_rng(0)
    net = bounded_network(d, k, 1, 0, c=0.3)
    X, Y = net.sample(200_000, random_state=1)
    E = rng.standard_normal(net.V.shape)
    E -= np.sum(E * net.V, axis=1, keepdims=True) * net.V
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    Vp = np.cos(0.2) * net.V + np.sin(0.2) * E
    bp = net.b + 0.2 * rng.standard_normal(k)
    out = benchmark.pedantic(region_refine, args=(X, Y, Vp, bp), rounds=1, warmup_rounds=0)
    err = rf.metrics.parameter_error((out.U, out.V, out.b, out.c), net)
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "d": d,
            "k": k,
            "rounds": out.rounds,
            "history": list(out.history),
            "residual": out.residual,
            "V_error": err.V,
            "b_error": err.b,
            "regions": out.n_regions,
        }
    )


#: Exact recoveries of 10 random teachers (seeds 0..9, measure below) before the control-variate
#: moments and 8 restarts (commit 00268a5 of main, n_restarts = 4, plain estimator).
SUCCESS_BEFORE = {(10, 5, 1): 8, (20, 8, 2): 1}


@pytest.mark.parametrize("d,k,m", [(10, 5, 1), (20, 8, 2)])
def test_success_on_random_teachers(benchmark, machine, d, k, m):
    """``two_layer(d, k, m, bias="random", offset="random")`` (U ~ N(0, 1): some |a| of a few
    hundredths), n = 2e5, seeds 0..9: how many are exact, and that none is exact but wrong."""
    seeds = range(10)
    cases = []
    for s in seeds:
        net = rf.planted.two_layer(d, k, m, random_state=s, bias="random", offset="random")
        cases.append((net, *net.sample(200_000, random_state=1000 + s)))
    results = fit_each(benchmark, [(X, Y) for _, X, Y in cases], k)
    errs = [rf.metrics.parameter_error(r, net) for r, (net, _, _) in zip(results, cases)]
    right = [r.exact and max(e.U, e.V, e.b, e.c) < 1e-8 for r, e in zip(results, errs)]
    wrong_exact = sum(r.exact and not ok for r, ok in zip(results, right))
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "d": d,
            "k": k,
            "m": m,
            "exact": int(sum(right)),
            "exact_before": SUCCESS_BEFORE[(d, k, m)],
            "of": len(results),
            "wrong_exact": int(wrong_exact),
            "restarts": [r.diagnostics.get("restarts") for r in results],
            "seconds_per_fit": benchmark.stats.stats.min / len(results),
        }
    )
    assert wrong_exact == 0


@pytest.mark.parametrize("mode", [None, "all"], ids=["adaptive", "all"])
@pytest.mark.parametrize("n", [200_000, 1_000_000, 3_000_000])
def test_adaptive_vs_all(benchmark, machine, n, mode):
    """Adaptive estimation (moments on a growing random sample, certificate over all
    samples) against the moments over every sample: random teachers
    ``two_layer(20, 8, 2, bias="random", offset="random")``, seeds 0..4, kernels on all
    cores, NumPy single-threaded inside the pipeline. Recorded: time per fit, statuses,
    errors, estimation sizes, doublings and tensor steps."""
    d, k, m = 20, 8, 2
    nets = [rf.planted.two_layer(d, k, m, random_state=s, bias="random", offset="random") for s in range(5)]
    data = [net.sample(n, random_state=2000 + s) for s, net in enumerate(nets)]
    results = fit_each(benchmark, data, k, n_estimate=mode)
    errs = [rf.metrics.parameter_error(r, net) for r, net in zip(results, nets)]
    right = [r.exact and max(e.U, e.V, e.b, e.c) < 1e-8 for r, e in zip(results, errs)]
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "n": n,
            "mode": mode or "adaptive",
            "seconds_per_fit": benchmark.stats.stats.min / len(results),
            "exact": int(sum(right)),
            "of": len(results),
            "max_error": float(max(max(e.U, e.V, e.b, e.c) for e in errs)),
            "n_estimate": [r.counts["n_estimate"] for r in results],
            "doublings": [r.counts["doublings"] for r in results],
            "tensor_steps": [r.counts["restarts"] for r in results],
            "seconds_by_stage": [dict(r.seconds) for r in results],
        }
    )
    assert all(r.exact for r in results) and not any(r.exact and not ok for r, ok in zip(results, right))


def fewer_outputs_teacher(d, k, m, seed):
    """Hidden biases N(0, 1/4), an offset N(0, 1), |U| uniform in [0.5, 2] of random sign."""
    r = np.random.default_rng(seed)
    V = r.standard_normal((k, d))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    U = r.choice([-1.0, 1.0], (m, k)) * r.uniform(0.5, 2.0, (m, k))
    return PlantedNetwork(U=U, V=V, b=0.5 * r.standard_normal(k), c=r.standard_normal(m))


@pytest.mark.parametrize("d,k,m,n_seeds", [(20, 10, 1, 4), (20, 12, 3, 4), (40, 20, 1, 3), (30, 25, 1, 2)])
def test_fewer_outputs_than_units(benchmark, machine, d, k, m, n_seeds):
    """m < k with biases and an offset, n = 1e6: exact fits of random teachers (seeds
    0..n_seeds-1), seconds per fit and per stage; the Levenberg-Marquardt stage and, for k
    above 12, the deflation (units the tensor step missed, from the residual's tensors)."""
    cases = []
    for s in range(n_seeds):
        net = fewer_outputs_teacher(d, k, m, s)
        X, Y = net.sample(1_000_000, random_state=50 + s)
        cases.append((net, X, Y[:, 0] if m == 1 else Y))
    results = fit_each(benchmark, [(X, Y) for _, X, Y in cases], k)
    errs = [rf.metrics.parameter_error(r, net) for r, (net, _, _) in zip(results, cases)]
    right = [r.exact and max(e.U, e.V, e.b, e.c) < 1e-8 for r, e in zip(results, errs)]
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "d": d,
            "k": k,
            "m": m,
            "n": 1_000_000,
            "exact": int(sum(right)),
            "of": len(results),
            "wrong_exact": int(sum(r.exact and not ok for r, ok in zip(results, right))),
            "seconds": [round(r.seconds["total"], 2) for r in results],
            "stage_seconds": [{s: round(t, 2) for s, t in r.seconds.items()} for r in results],
            "deflations": [r.counts.get("deflations", 0) for r in results],
            "max_weight_error": float(max(max(e.U, e.V) for e in errs)),
        }
    )
    assert not any(r.exact and not ok for r, ok in zip(results, right))


def _trained(kind, X, y, k, seed=0):
    """A network ``Linear -> ReLU -> Linear`` trained by scikit-learn (MLPRegressor, 400
    iterations) or torch (Adam, lr 1e-2, 500 full-batch steps) on (X, y)."""
    if kind == "sklearn":
        from sklearn.neural_network import MLPRegressor

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mlp = MLPRegressor(hidden_layer_sizes=(k,), max_iter=400, random_state=seed).fit(X, y)
        (W1, W2), (b1, b2) = mlp.coefs_, mlp.intercepts_
        return PlantedNetwork(U=W2.T, V=W1.T, b=b1, c=b2)
    torch = pytest.importorskip("torch")
    torch.manual_seed(seed)
    Xt, Yt = torch.tensor(X), torch.tensor(y).reshape(len(X), -1)
    net = torch.nn.Sequential(torch.nn.Linear(X.shape[1], k), torch.nn.ReLU(), torch.nn.Linear(k, Yt.shape[1])).double()
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    for _ in range(500):
        opt.zero_grad()
        loss = ((net(Xt) - Yt) ** 2).mean()
        loss.backward()
        opt.step()
    first, last = net[0], net[2]
    return PlantedNetwork(
        U=last.weight.detach().numpy(),
        V=first.weight.detach().numpy(),
        b=first.bias.detach().numpy(),
        c=last.bias.detach().numpy(),
    )


def _training_data(name, d, m):
    """Standardised diabetes / breast_cancer, or 5,000 Gaussian inputs labelled by a random
    network twice as wide (targets with many directions)."""
    from sklearn.datasets import load_breast_cancer, load_diabetes
    from sklearn.preprocessing import StandardScaler

    if name in ("diabetes", "breast_cancer"):
        X, y = (load_diabetes if name == "diabetes" else load_breast_cancer)(return_X_y=True)
        y = (y - y.mean()) / y.std() if name == "diabetes" else y.astype(float)
        return StandardScaler().fit_transform(X), y
    X = np.random.default_rng(0).standard_normal((5000, d))
    Y = fewer_outputs_teacher(d, 2 * d, m, 7).predict(X)
    return X, Y[:, 0] if m == 1 else Y


@pytest.mark.parametrize("kind", ["sklearn", "torch"])
@pytest.mark.parametrize(
    "name,d,k,m",
    [
        ("diabetes", 10, 8, 1),
        ("teacher", 20, 10, 1),
        ("teacher", 20, 12, 3),
        ("teacher", 40, 20, 1),
        ("breast_cancer", 30, 25, 1),
    ],
)
def test_trained_networks_fewer_outputs(benchmark, machine, kind, name, d, k, m):
    """Networks trained by scikit-learn and torch with fewer outputs than hidden units,
    queried on n = 1e6 Gaussian inputs and recovered by ``atv21`` with n_hidden given."""
    X, y = _training_data(name, d, m)
    net = _trained(kind, X, y, k)
    Xq, Yq = net.sample(1_000_000, random_state=1)
    res = fit_each(benchmark, [(Xq, Yq[:, 0] if m == 1 else Yq)], k)[0]
    err = rf.metrics.parameter_error(res, net)
    Vn = net.V / np.linalg.norm(net.V, axis=1, keepdims=True)
    C = np.abs(Vn @ Vn.T)
    np.fill_diagonal(C, 0.0)
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "trained_by": kind,
            "data": name,
            "d": d,
            "k": k,
            "m": m,
            "status": res.status.value,
            "seconds": round(res.seconds["total"], 2),
            "weight_error": float(max(err.U, err.V)),
            "max_cos_between_units": float(C.max()),
            "deflations": res.counts.get("deflations", 0),
        }
    )
    assert not (res.exact and max(err.U, err.V) > 1e-8)


@pytest.mark.parametrize("k", [5, 10, 20])
@pytest.mark.parametrize("n", [100_000, 300_000, 1_000_000])
def test_estimate_angle_fewer_outputs(benchmark, machine, n, k):
    """Where the paper's estimate breaks with one output: ``refine=False``, one tensor step,
    d = 2k, teachers of ``fewer_outputs_teacher`` (seeds 0, 1). Recorded: median and largest
    angle from an estimated row to its nearest true row, and the true rows farther than
    0.3 rad from every estimate (units the tensor step missed or found twice)."""
    d = 2 * k
    nets = [fewer_outputs_teacher(d, k, 1, s) for s in (0, 1)]
    data = []
    for s, net in enumerate(nets):
        X, Y = net.sample(n, random_state=50 + s)
        data.append((X, Y[:, 0]))
    results = fit_each(benchmark, data, k, refine=False, n_restarts=1)
    angles, missed = [], []
    for res, net in zip(results, nets):
        Vt = net.V / np.linalg.norm(net.V, axis=1, keepdims=True)
        C = np.clip(np.abs(res.V @ Vt.T), 0.0, 1.0)
        angles.append(np.arccos(C.max(axis=1)))
        missed.append(int(np.sum(np.arccos(C.max(axis=0)) > 0.3)))
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "d": d,
            "k": k,
            "n": n,
            "median_angle": float(np.median(np.concatenate(angles))),
            "max_angle": [float(a.max()) for a in angles],
            "true_rows_missed": missed,
        }
    )


MEMORY_CHILD = r"""
import json, resource, sys, warnings
import numpy as np, relufast as rf
from relufast.algorithms.atv21 import pipeline
d, k, n = json.loads(sys.argv[1])
r = np.random.default_rng(0)
V = r.standard_normal((k, d)); V /= np.linalg.norm(V, axis=1, keepdims=True)
net = rf.planted.PlantedNetwork(U=r.uniform(0.5, 1.5, (1, k)), V=V, b=r.uniform(-1, 1, k), c=np.zeros(1))
X = r.standard_normal((n, d)); Y = net.predict(X)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    res = rf.recover(X, Y, n_hidden=k, method="atv21", time_limit=120, n_jobs=2)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
print(json.dumps(dict(status=res.status.value, measured=peak - base, estimate=pipeline.tensor_memory(k, 2))))
"""


@pytest.mark.parametrize("d,k,n", [(40, 36, 30_000)])
def test_tensor_memory_estimate(benchmark, machine, d, k, n):
    """atv21's stated memory of its order-4 tensors (:func:`pipeline.tensor_memory`, the
    figure it refuses on) against the peak resident memory a run adds, in a child process."""
    import json
    import subprocess
    import sys

    def run():
        r = subprocess.run([sys.executable, "-c", MEMORY_CHILD, json.dumps([d, k, n])], capture_output=True, text=True)
        return json.loads(r.stdout.strip().splitlines()[-1])

    out = benchmark.pedantic(run, rounds=1)
    benchmark.extra_info.update(dict(machine, d=d, k=k, n=n, **out, ratio=out["estimate"] / out["measured"]))
    print(out)
    assert out["estimate"] >= 0.8 * out["measured"]
