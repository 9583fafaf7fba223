"""Figure of ``bench/test_bench_extract.py::test_fewer_outputs_vs_distill`` for docs/extract.md.

Usage::

    python -m pytest bench/test_bench_extract.py -k fewer --benchmark-only --benchmark-json=fewer.json
    python bench/plot_fewer_outputs.py fewer.json docs/img/extract_fewer_outputs.png

Left: queries used against k for m = 1, 2, 3 (Gaussian queries with n_hidden given, and
chosen queries); the marker is filled when the result is exact. Right: weight error of V
against k for both routes and for Adam on the Gaussian queries.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(path):
    with open(path) as fh:
        return [b["extra_info"] for b in json.load(fh)["benchmarks"] if "gaussian_queries" in b["extra_info"]]


def plot(info, out):
    fig, (ax_q, ax_e) = plt.subplots(1, 2, figsize=(10, 4))
    for m, colour in zip((1, 2, 3), ("C0", "C1", "C2")):
        sel = sorted((r for r in info if r["m"] == m), key=lambda r: r["k"])
        ks = [r["k"] for r in sel]
        for route, style in (("gaussian", "-"), ("chosen", "--")):
            q = [r[f"{route}_queries"] for r in sel]
            ax_q.plot(ks, q, style, color=colour, label=f"m = {m}, {route}")
            exact = [r[f"{route}_status"] == "exact" for r in sel]
            ax_q.scatter(ks, q, color=colour, facecolors=[colour if e else "none" for e in exact])
            ax_e.semilogy(ks, [max(r[f"{route}_V_error"], 1e-17) for r in sel], style, marker="o", color=colour)
        ax_e.semilogy(ks, [r["distill_V_error"] for r in sel], ":", marker="x", color=colour, label=f"m = {m}, Adam")
    ax_q.set(xlabel="hidden units k (d = 2k)", ylabel="queries", yscale="log", title="queries used (filled: exact)")
    ax_e.set(xlabel="hidden units k (d = 2k)", ylabel="weight error of V", title="error: relufast (-, --) and Adam (:)")
    ax_q.legend(fontsize=7)
    ax_e.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    plot(rows(sys.argv[1]), sys.argv[2])
