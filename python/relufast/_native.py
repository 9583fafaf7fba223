"""Loads the compiled kernels: the AVX-512 build where the CPU has it, else the AVX2/FMA
build, else the baseline.

Set the environment variable ``RELUFAST_BACKEND`` to ``baseline``, ``avx2`` or ``avx512`` to
choose a build (one the CPU lacks falls back to the next one down); ``auto`` (the default)
takes the widest the CPU supports.
"""

import os

from . import _core as _baseline

core = _baseline
BACKEND = "baseline"
_WANT = os.environ.get("RELUFAST_BACKEND", "auto")
if _WANT not in ("auto", "baseline", "avx2", "avx512"):
    raise ImportError(f"RELUFAST_BACKEND must be auto, baseline, avx2 or avx512; got {_WANT!r}")


def _load(name):
    """The compiled variant ``name`` or None (built without dispatch: non-x86 or
    RELUFAST_DISPATCH=OFF)."""
    try:
        return __import__(f"{__name__.rsplit('.', 1)[0]}.{name}", fromlist=["_"])
    except ImportError:
        return None


if _WANT in ("auto", "avx512") and _baseline.cpu_has_avx512():
    _mod = _load("_core_avx512")
    if _mod is not None:
        # The variants are the same API (their stubs re-export _core's); mypy sees several modules.
        core, BACKEND = _mod, "avx512"
if BACKEND == "baseline" and _WANT != "baseline" and _baseline.cpu_has_avx2_fma():
    _mod = _load("_core_avx2")
    if _mod is not None:
        core, BACKEND = _mod, "avx2"

__all__ = ["core", "BACKEND"]
