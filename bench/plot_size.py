"""Figure of ``bench/test_bench_size.py::test_size_sweep`` for docs/scale.md.

Usage::

    python -m pytest bench/test_bench_size.py -k sweep --benchmark-only --benchmark-json=sweep.json
    python bench/plot_size.py sweep.json docs/img/size_sweep.png

Seconds per fit against k (d = 784, m = k, n = 200,000) on log-log axes, bias-free
(bjw19-gaussian) and biased (atv21), each with its least-squares line and fitted exponent;
the checking pass of the true network for comparison. Prints the exponents.
"""

import json
import sys

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(path):
    with open(path) as fh:
        return [b["extra_info"] for b in json.load(fh)["benchmarks"] if "ratio_to_checking_pass" in b["extra_info"]]


def exponent(k, t):
    """Slope and intercept of log t against log k (least squares)."""
    p, c = np.polyfit(np.log(k), np.log(t), 1)
    return float(p), float(c)


def plot(info, out):
    fig, ax = plt.subplots(figsize=(6, 4.2))
    fits = {}
    for bias, colour, label in ((False, "C0", "bias-free, bjw19-gaussian"), (True, "C1", "biased, atv21")):
        sel = sorted((r for r in info if r["bias"] == bias and r["d"] == 784), key=lambda r: r["k"])
        if not sel:
            continue
        k = np.array([r["k"] for r in sel], dtype=float)
        t = np.array([r["seconds_total"] for r in sel])
        p, c = exponent(k, t)
        fits[label] = p
        ax.loglog(k, t, "o", color=colour, label=f"{label}: time ~ k^{p:.2f}")
        ax.loglog(k, np.exp(c) * k**p, "-", color=colour, lw=1)
        chk = np.array([r["checking_pass_seconds"] for r in sel])
        ax.loglog(k, chk, "x--", color=colour, lw=0.8, label=f"checking pass ({'biased' if bias else 'bias-free'})")
    ax.set_xlabel("hidden units k (d = 784, m = k, n = 200,000)")
    ax.set_ylabel("seconds per exact recovery")
    ax.set_title("Exact recovery at size (2 cores)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return fits


if __name__ == "__main__":
    for label, p in plot(rows(sys.argv[1]), sys.argv[2]).items():
        print(f"{label}: exponent {p:.2f}")
