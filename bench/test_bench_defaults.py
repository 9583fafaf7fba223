"""What ``relufast.extract(model, n_features)`` does by default on models as users hold them.

Fitted scikit-learn MLPs (sklearn's default initialisation, ``max_iter=50``,
``random_state=0``; ConvergenceWarning ignored) on the bundled data sets, standardised:
diabetes (``MLPRegressor``, 10 inputs, 1 output), breast_cancer (binary ``MLPClassifier``, 30
inputs) and digits (10-class ``MLPClassifier``, 64 inputs), with 1, 2 and 3 hidden layers of
widths 16/8/8 and of sklearn's default width 100. Each cell calls ``extract(mlp, d,
random_state=0)`` (no ``n_hidden``, no ``queries``) in a child process stopped after
``RELUFAST_DEFAULTS_BUDGET`` seconds (default 240). Recorded in ``extra_info``: status (or the
exception's name, or ``stopped``), queries, query mode, where the widths came from, seconds.

Run: python -m pytest bench/test_bench_defaults.py --benchmark-only -s
"""

import multiprocessing as mp
import os
import time
import warnings

import numpy as np
import pytest

DATASETS = ("diabetes", "breast_cancer", "digits")
WIDTHS = ((16,), (16, 8), (16, 8, 8), (100,), (100, 100), (100, 100, 100))


def fitted(name, widths):
    """The MLP of one cell and its number of inputs."""
    from sklearn import datasets
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    sd = X.std(axis=0)
    X = (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
    est = MLPRegressor if name == "diabetes" else MLPClassifier
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est(hidden_layer_sizes=widths, max_iter=50, random_state=0).fit(X, y), X.shape[1]


def _cell(name, widths, queue):
    import relufast as rf

    mlp, d = fitted(name, widths)
    warnings.simplefilter("ignore")
    t = time.perf_counter()
    try:
        res = rf.extract(mlp, d, random_state=0)
        out = {
            "status": res.status.value,
            "queries": int(res.counts.get("queries", 0)),
            "mode": res.diagnostics.get("queries", "random"),
            "widths_from": res.diagnostics.get("widths_from"),
            "residual": float(res.residual),
        }
    except Exception as exc:  # the table records what the user would see
        out = {"status": type(exc).__name__, "message": str(exc)[:300]}
    out["seconds"] = time.perf_counter() - t
    queue.put(out)


@pytest.mark.parametrize("widths", WIDTHS, ids=lambda w: "-".join(map(str, w)))
@pytest.mark.parametrize("name", DATASETS)
def test_extract_default(benchmark, machine, name, widths):
    pytest.importorskip("sklearn")
    budget = float(os.environ.get("RELUFAST_DEFAULTS_BUDGET", "240"))

    def run():
        queue = mp.get_context("spawn").Queue()
        proc = mp.get_context("spawn").Process(target=_cell, args=(name, widths, queue))
        proc.start()
        proc.join(budget)
        if proc.is_alive():
            proc.terminate()
            proc.join()
            return {"status": "stopped", "seconds": budget}
        return queue.get(timeout=10)

    out = benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(machine)
    benchmark.extra_info.update(out, dataset=name, widths=str(widths))
    print(name, widths, out)
