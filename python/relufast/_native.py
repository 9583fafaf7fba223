"""Loads the compiled kernels: the AVX2/FMA build where the CPU has it, else the baseline.

Set the environment variable ``RELUFAST_BACKEND=baseline`` to force the portable build.
"""

import os

from . import _core as _baseline

core = _baseline
BACKEND = "baseline"
if os.environ.get("RELUFAST_BACKEND", "auto") != "baseline" and _baseline.cpu_has_avx2_fma():
    try:
        from . import _core_avx2 as _avx2
    except ImportError:  # built without dispatch (non-x86 or RELUFAST_DISPATCH=OFF)
        pass
    else:
        # The AVX2 build is the same API (its stub re-exports _core's); mypy sees two modules.
        core = _avx2  # type: ignore[misc]
        BACKEND = "avx2"

__all__ = ["core", "BACKEND"]
