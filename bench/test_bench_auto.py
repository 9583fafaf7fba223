"""``method="auto"``'s routing of Gaussian data with fewer outputs than hidden units:
bjw19-fpt against atv21 on planted networks, d = 10, k = 5, n = 1e5,
m = 1 (atv21 only), 2 and 3, several seeds. Each run records its status and the error of V
beside the time, so the rule in docs/results.md ("bjw19-fpt first when m >= 2, then atv21")
can be checked against the evidence. Threads: the machine's default (BLAS and kernels).
"""

import warnings

import pytest

import relufast as rf

D, K, N = 10, 5, 100_000
SEEDS = range(5)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("method", ["bjw19-fpt", "atv21", "auto"])
def test_fewer_outputs_than_units(benchmark, method, m, seed, machine):
    if method == "bjw19-fpt" and m == 1:
        pytest.skip("bjw19-fpt needs m >= 2 (pairs of outputs)")
    net = rf.planted.two_layer(d=D, k=K, m=m, random_state=seed)
    X, Y = net.sample(N, random_state=100 + seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rf.RelufastWarning)
        res = benchmark.pedantic(
            rf.recover, args=(X, Y), kwargs={"n_hidden": K, "method": method, "random_state": 0}, rounds=1
        )
    err = rf.metrics.parameter_error(res, net) if res.V is not None else None
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(
        {
            "method": method,
            "chosen": res.diagnostics.get("auto", method),
            "d": D,
            "k": K,
            "m": m,
            "n": N,
            "seed": seed,
            "status": res.status.value,
            "exact": bool(res.exact),
            "error_V": None if err is None else err.V,
        }
    )
