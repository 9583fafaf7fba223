"""Stress tests of the block pipeline that every accumulating kernel shares
(``accumulate_blocks`` in the C++ core): an exception raised in any step (creating a
partial, zeroing it, a block, the ordered merge) must end every thread and reach Python,
on 1, 2 and 8 threads and on a single core, every time. Each run happens in a child
process with a timeout, so a deadlock fails the test instead of hanging the suite."""

import os
import subprocess
import sys
import textwrap

import pytest

from relufast._native import core

STAGES = ("make_local", "zero", "per_block", "merge")

_STRESS_CHILD = """
import os, sys
from relufast._native import core

if {one_core}:
    os.sched_setaffinity(0, {{0}})
stages = {stages!r}
n, block = 20000, 64  # 313 blocks, 79 groups of 4 blocks (256 samples)
expected = n * (n - 1) / 2
runs = 0
for rep in range({reps}):
    for n_jobs in (1, 2, 8):
        assert core._fault_pipeline(n, block, n_jobs, "none") == expected
        for stage in stages:
            # Partials are recycled: make_local runs once per buffer, so only its
            # first call happens on every thread count.
            for at in (0,) if stage == "make_local" else (0, 1, 5, 17, 39):
                # Every other repetition makes the first blocks slow, so that threads
                # holding later groups run ahead and wait for a buffer when the fault hits.
                slow = 1000 if rep % 2 else 0
                try:
                    core._fault_pipeline(n, block, n_jobs, stage, at, sleep_us=slow, slow_until=(at + 1) * 256)
                except RuntimeError as e:
                    assert "injected fault in " + stage in str(e), str(e)
                else:
                    raise AssertionError(f"no error from {{stage}} at {{at}} on {{n_jobs}} threads")
                runs += 1
print("RUNS", runs)
"""


def _run_stress(one_core, reps, timeout=240):
    code = _STRESS_CHILD.format(one_core=one_core, stages=STAGES, reps=reps)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(proc.stdout.split("RUNS")[1])


@pytest.mark.parametrize("one_core", [False, True], ids=["all-cores", "one-core"])
def test_a_fault_in_any_step_reaches_python_and_never_hangs(one_core):
    if one_core and not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity on this platform")
    # (1 + 3 x 5 positions) x 3 thread counts x 10 repetitions = 480 faulty runs.
    assert _run_stress(one_core, reps=10) == 480


def test_fault_pipeline_sums_exactly_without_a_fault():
    n = 12345
    for n_jobs in (1, 2, 8):
        for block in (1, 7, 1000, 10**9):
            assert core._fault_pipeline(n, block, n_jobs) == n * (n - 1) / 2


def test_a_fault_after_the_last_call_is_not_raised():
    # The at-th call never happens: the pipeline completes with the exact sum.
    assert core._fault_pipeline(1000, 100, 2, "merge", at=10**6) == 1000 * 999 / 2


def test_time_limit_ends_a_pipeline_whose_threads_wait_for_buffers():
    # Slow blocks on 8 threads: most threads wait for a partial while the deadline passes.
    with pytest.raises(TimeoutError):
        core._fault_pipeline(200000, 16, 8, "none", sleep_us=2000, time_limit=0.2)


def test_unknown_stage_is_a_clear_error():
    with pytest.raises(ValueError, match="stage must be"):
        core._fault_pipeline(10, 1, 1, "bogus")


_REGIONS_CHILD = """
import os
import numpy as np
from relufast._native import core

os.sched_setaffinity(0, {0})
rng = np.random.default_rng(0)
n, d, k = 40000, 6, 5
X = rng.standard_normal((n, d))
V = rng.standard_normal((k, d)); b = rng.standard_normal(k); U = rng.standard_normal((2, k)); c = np.zeros(2)
Y = np.maximum(X @ V.T + b, 0) @ U.T
for rep in range(20):
    for n_jobs in (1, 2, 8):
        try:
            core.region_systems(X, Y, V, b, U, c, np.full(k, 1e-3), None, 3, n_jobs, 256)
        except ValueError as e:
            assert "more than max_regions" in str(e), str(e)
        else:
            raise AssertionError("more regions than allowed did not raise")
print("OK")
"""


def test_too_many_regions_on_one_core_raises_every_time():
    # The region kernel raises from its merge step when the regions exceed max_regions:
    # this hung 2 times in 4 on one core before the merge step aborted the pipeline.
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity on this platform")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_REGIONS_CHILD)], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-2000:]
