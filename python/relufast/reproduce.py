"""Reproduction of the experiments of GKLW19 (Section 4, Figures 2-4) to CSV and PNG.

Every point is summarised over ``trials`` runs (mean, median and quartiles in the CSV; the
figure shows the median with the interquartile band, since one bad trial can move the
mean far from the typical error) of the paper's practical variant
(``gklw19.recover(practical=True)``) on fresh planted networks, with the paper's metric
(:func:`relufast.metrics.matched_squared_error`) and the mean squared error on 5000 fresh
samples, against the noisy labels (``mse``) and the clean ones (``mse_clean``).

The paper leaves the grids unstated; the defaults here are small enough for a few minutes
on 2 cores, ``full=True`` uses the paper's sizes (10 x 10 and 32 x 32, n up to 50,000).
"""

from __future__ import annotations

import csv
import os
import time
from typing import Any

import numpy as np

from . import metrics, planted
from ._progress import Progress
from .algorithms import gklw19

__all__ = ["EXPERIMENTS", "run", "write_csv", "plot", "figure"]

TEST_SAMPLES = 5000

#: The quantity on each x axis.
AXIS_LABELS = {
    "n": "number of training samples n",
    "dimension": "input dimension d = hidden units k = outputs m",
    "noise": "standard deviation of the label noise",
    "kappa": "condition number",
}


def _trial(d, n, seed, *, input="gaussian", noise=0.0, condition_A=None, condition_W=None):
    net = planted.gklw19_network(d, condition_A=condition_A, condition_W=condition_W, random_state=seed)
    X, Y = net.sample(n, random_state=seed + 10_000, noise=noise, input=input)
    t = time.perf_counter()
    import warnings

    from ._result import RelufastWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RelufastWarning)
        # The paper's method only: relufast's exact region refinement would hide its error curve.
        res = gklw19.recover(X, Y, d, practical=True, refine=False, random_state=seed)
    seconds = time.perf_counter() - t
    Xt, Yt_clean = net.sample(TEST_SAMPLES, random_state=seed + 20_000, input=input)
    Yt = Yt_clean + noise * np.random.default_rng(seed + 30_000).standard_normal(Yt_clean.shape)
    if res.V is None:
        return dict(error_W=np.nan, error_A=np.nan, mse=np.nan, mse_clean=np.nan, seconds=seconds)
    err_W, err_A = metrics.matched_squared_error(res, net)
    P = res.predict(Xt)
    return dict(
        error_W=err_W,
        error_A=err_A,
        mse=float(np.mean((P - Yt) ** 2)),
        mse_clean=float(np.mean((P - Yt_clean) ** 2)),
        seconds=seconds,
    )


def _grid(name, full):
    """The list of (panel, x-name, x, trial-kwargs) points of one figure."""
    pts: list[tuple[str, str, float, dict[str, Any]]] = []
    if name == "gklw19-fig2":  # sample efficiency, Gaussian input
        sizes = (
            [(10, [500, 1000, 2000, 5000, 10000, 20000, 50000]), (32, [2000, 5000, 10000, 20000, 50000])]
            if full
            else [(10, [500, 1000, 2000, 5000, 10000])]
        )
        for d, ns in sizes:
            pts += [(f"{d}x{d}", "n", n, dict(d=d, n=n)) for n in ns]
        dims = [10, 14, 18, 22, 26, 32] if full else [10, 16, 24]
        pts += [("dimension (n = 10000)", "dimension", d, dict(d=d, n=10000)) for d in dims]
    elif name == "gklw19-fig3":  # label noise, 10 x 10, n = 10000
        sig = [0.0, 0.1, 0.2, 0.5, 1.0]
        for law in ("gaussian", "mixture"):
            pts += [(law, "noise", s, dict(d=10, n=10000, noise=s, input=law)) for s in sig]
    elif name == "gklw19-fig4":  # condition number, mixture input, n = 20000
        kap = [1, 2, 5, 10, 20, 50]
        pts += [
            ("kappa(W)", "kappa", c, dict(d=10, n=20000, input="mixture", condition_W=c if c > 1 else None))
            for c in kap
        ]
        pts += [
            ("kappa(A)", "kappa", c, dict(d=10, n=20000, input="mixture", condition_A=c if c > 1 else None))
            for c in kap
        ]
    else:
        raise ValueError(f"unknown experiment {name!r}; choose one of {sorted(EXPERIMENTS)}")
    return pts


EXPERIMENTS = {
    "gklw19-fig2": "sample efficiency (Gaussian input): error of W, A and MSE vs n; sqrt(error/dim) vs dim",
    "gklw19-fig3": "robustness to label noise (10 x 10, n = 10000, Gaussian and +-1 mixture input)",
    "gklw19-fig4": "robustness to the condition number of W and A (+-1 mixture input, n = 20000)",
}


def run(name, *, full=False, trials=5, seed=0, progress=None):
    """Run one experiment; returns a list of dict rows (one per point, means over trials)."""
    pts = _grid(name, full)
    bar = Progress(len(pts) * trials, name, progress)
    rows, done = [], 0
    try:
        for panel, xname, x, kw in pts:
            outs = []
            for t in range(trials):
                outs.append(_trial(seed=seed + 1000 * t + 17, **kw))
                done += 1
                bar.update(done)
            row = {"panel": panel, "x_name": xname, "x": x, "trials": trials}
            d = kw["d"]
            for o in outs:
                o["sqrt_error_W_per_dim"] = float(np.sqrt(o["error_W"] / d))
                o["sqrt_error_A_per_dim"] = float(np.sqrt(o["error_A"] / d))
            for key in (
                "error_W",
                "error_A",
                "mse",
                "mse_clean",
                "seconds",
                "sqrt_error_W_per_dim",
                "sqrt_error_A_per_dim",
            ):
                vals = np.array([o[key] for o in outs], dtype=float)
                row[key] = float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")
                q = np.nanquantile(vals, [0.25, 0.5, 0.75]) if np.isfinite(vals).any() else [np.nan] * 3
                row[key + "_q25"], row[key + "_median"], row[key + "_q75"] = (float(v) for v in q)
            row["failed_trials"] = int(sum(not np.isfinite(o["error_W"]) for o in outs))
            rows.append(row)
    finally:
        bar.close()
    return rows


def write_csv(rows, path):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def plot(rows, name, path):
    """Write the figure as PNG; returns False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return False
    fig = figure(rows, name, plt)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def figure(rows, name, plt=None):
    """The matplotlib figure of one experiment: per panel, the median of each quantity over
    the trials with its interquartile band, every axis labelled with its quantity."""
    import matplotlib.ticker

    if plt is None:
        import matplotlib.pyplot as plt
    panels = list(dict.fromkeys(r["panel"] for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        pr = [r for r in rows if r["panel"] == panel]
        x = np.array([r["x"] for r in pr], dtype=float)
        xname = pr[0]["x_name"]
        if xname == "dimension":
            series = [
                ("sqrt_error_W_per_dim", "o", "sqrt(error(W) / d)"),
                ("sqrt_error_A_per_dim", "s", "sqrt(error(A) / d)"),
            ]
            ylabel = "sqrt(squared parameter error / d)"
        else:
            series = [
                ("error_W", "o", "error(W)"),
                ("error_A", "s", "error(A)"),
                ("mse", "^", "test MSE (noisy labels)"),
            ]
            ylabel = "squared error (GKLW19 metric) / test MSE"
        for key, marker, label in series:
            med = np.array([r[key + "_median"] for r in pr])
            lo = np.array([r[key + "_q25"] for r in pr])
            hi = np.array([r[key + "_q75"] for r in pr])
            (line,) = ax.plot(x, med, marker + "-", label=f"{label}: median")
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        if xname in ("n", "kappa"):
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_yscale("log")
        ax.set_xlabel(AXIS_LABELS.get(xname, xname) + (f" {panel}" if xname == "kappa" else ""))
        ax.set_ylabel(ylabel)
        ax.set_title(f"{panel}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"{name}: {EXPERIMENTS[name]}\nmedian and interquartile band over {rows[0]['trials']} trials", fontsize=9
    )
    fig.tight_layout()
    return fig


def main(name, *, full=False, trials=5, out=".", seed=0, progress=None):
    rows = run(name, full=full, trials=trials, seed=seed, progress=progress)
    os.makedirs(out, exist_ok=True)
    csv_path = os.path.join(out, f"{name}.csv")
    write_csv(rows, csv_path)
    print(f"wrote {csv_path}")
    png = os.path.join(out, f"{name}.png")
    if plot(rows, name, png):
        print(f"wrote {png}")
    else:
        print(
            "matplotlib is not installed: no figure. Install it with  pip install '.[plot]'  "
            "(or pip install matplotlib) and rerun."
        )
    for r in rows:
        print(
            f"  {r['panel']:>22}  {r['x_name']}={r['x']:<7}  median error(W) {r['error_W_median']:.4f}  "
            f"error(A) {r['error_A_median']:.4f}  MSE {r['mse_median']:.5f}"
        )
    return rows
