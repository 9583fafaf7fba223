"""Figure of ``bench/test_bench_chosen_size.py`` for docs/chosen.md.

Usage::

    python -m pytest bench/test_bench_chosen_size.py --benchmark-only --benchmark-json=chosen.json
    python bench/plot_chosen_size.py chosen.json docs/img/chosen_size.png

Queries and seconds of chosen-query extraction against the number of parameters P on
log-log axes, one hidden layer and several marked apart, each quantity with its
least-squares line over the networks that ended exact (the exponents the bench prints),
and the issue's bar of 30 queries a parameter. Networks that did not end exact are drawn
as open markers. Prints the exponents.
"""

import json
import sys

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from plot_size import exponent  # noqa: E402  (the least-squares slope on log-log axes; run from bench/)


def rows(path):
    with open(path) as fh:
        return [b["extra_info"] for b in json.load(fh)["benchmarks"] if "parameters" in b["extra_info"]]


def plot(info, out):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    exact = [r for r in info if r.get("status") == "exact"]
    fits = {}
    for ax, key, label in ((axes[0], "queries", "queries"), (axes[1], "seconds", "seconds (2 cores)")):
        for i, r in enumerate(sorted((r for r in info if key in r), key=lambda r: r["parameters"])):
            deep = r["network"].count("-") > 2
            marker = "s" if deep else "o"
            face = ("C1" if deep else "C0") if r.get("status") == "exact" else "none"
            ax.loglog(r["parameters"], r[key], marker, mfc=face, mec="C1" if deep else "C0")
            ax.annotate(
                r["network"],
                (r["parameters"], r[key]),
                fontsize=6,
                xytext=(4, -9 if i % 2 else 4),
                textcoords="offset points",
            )
        P = np.array([r["parameters"] for r in exact], dtype=float)
        y = np.array([r[key] for r in exact], dtype=float)
        p, c = exponent(P, y)
        fits[key] = p
        grid = np.geomspace(P.min(), P.max(), 50)
        ax.loglog(grid, np.exp(c) * grid**p, "-", color="k", lw=1, label=f"exact runs: {key} ~ P^{p:.2f}")
        if key == "queries":
            ax.loglog(grid, 30 * grid, ":", color="C3", lw=1, label="30 queries a parameter")
        ax.plot([], [], "o", color="C0", label="one hidden layer")
        ax.plot([], [], "s", color="C1", label="two hidden layers")
        ax.plot([], [], "o", mfc="none", mec="grey", label="not exact")
        ax.set_xlabel("parameters P")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.suptitle("Chosen-query extraction of planted networks (float64 unless marked)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return fits


if __name__ == "__main__":
    for key, p in plot(rows(sys.argv[1]), sys.argv[2]).items():
        print(f"{key}: exponent {p:.2f}")
