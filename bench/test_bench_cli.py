"""Start-up of the command line: ``relufast --help`` in a fresh interpreter (target: under
0.3 s; the suite checks that it imports neither NumPy nor the algorithms, which is what
keeps it fast). Run: python -m pytest bench/test_bench_cli.py --benchmark-only"""

import subprocess
import sys

HELP_TARGET_S = 0.3


def _help():
    return subprocess.run([sys.executable, "-m", "relufast", "--help"], capture_output=True, text=True, check=True)


def test_help_start_up(benchmark, machine):
    out = benchmark.pedantic(_help, rounds=5, warmup_rounds=1)
    assert "extract" in out.stdout
    best = benchmark.stats.stats.min
    benchmark.extra_info.update(machine)
    benchmark.extra_info["best_s"] = best
    assert best < HELP_TARGET_S, f"relufast --help took {best:.2f} s at best; target {HELP_TARGET_S} s"
