"""The memory a step may use: what the machine has available, read before a large allocation.

Kernels whose arrays grow like k^4 (ATV21's fourth Hermite tensors) check their need
against :func:`available_bytes` first and end with a status naming both figures instead
of failing inside C++ (``std::bad_alloc``) or swapping.
"""

from __future__ import annotations

import os

__all__ = ["available_bytes", "gigabytes"]


def available_bytes() -> float:
    """Bytes of memory available to new allocations: ``MemAvailable`` of /proc/meminfo on
    Linux, else the free physical pages; infinity where neither can be read."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return float("inf")


def gigabytes(n_bytes: float) -> str:
    """``n_bytes`` in GB for messages (two significant digits)."""
    return f"{n_bytes / 1e9:.2g} GB"
