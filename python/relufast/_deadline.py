"""The ``time_limit`` of a method run, seen by every stage.

:func:`limit` sets a deadline for the code it wraps (the method protocol wraps every method
in it, :mod:`relufast._protocol`). Stages call :func:`check` at their boundaries and inside
their loops (restarts, rounds, doublings, iterations); C++ kernels started while a deadline
is set stop at it (the thread's deadline in ``_core``). Either way a :class:`TimeLimitReached`
(a ``TimeoutError``) ends the method, and the protocol returns a ``failed`` result with
``diagnostics["stopped_by"] = "time_limit"``.

Deadlines nest: an inner limit never extends an outer one. They belong to the thread (and
context) that set them, so simulated MPI ranks in threads each keep their own.

Under an MPI ``comm`` the ranks must stop together, or one rank would wait forever in a
collective the others left: :func:`check` then asks every rank (one ``allgather`` of a
flag) and all stop when the first one's deadline passed; kernels and LP solves, which run
on one rank's share alone, get no deadline of their own there.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
from typing import Optional

__all__ = ["TimeLimitReached", "limit", "check", "remaining", "check_time_limit"]


class TimeLimitReached(TimeoutError):
    """The ``time_limit`` of a method run passed; ``where`` names the stage it stopped in."""

    def __init__(self, seconds: float, where: str):
        super().__init__(f"the time_limit of {seconds:g} s passed {where}")
        self.seconds = seconds
        self.where = where


#: (monotonic end, the limit in seconds as given, the comm or None) of the innermost limit.
_DEADLINE: contextvars.ContextVar[Optional[tuple]] = contextvars.ContextVar("relufast_deadline", default=None)


def check_time_limit(time_limit) -> Optional[float]:
    """``time_limit`` as float seconds (None: no limit); raises ``ValueError`` otherwise."""
    if time_limit is None:
        return None
    ok = isinstance(time_limit, (int, float)) and not isinstance(time_limit, bool)
    if not ok or not math.isfinite(time_limit) or time_limit <= 0:
        raise ValueError(f"time_limit must be a positive number of seconds or None; got {time_limit!r}")
    return float(time_limit)


def _set_kernel_deadline(seconds: float) -> None:
    from ._native import core

    core._set_deadline(seconds)


@contextlib.contextmanager
def limit(time_limit, comm=None):
    """Run the block under a deadline ``time_limit`` seconds from now (None: unchanged);
    ``comm``: the MPI communicator of the ranks that must stop together."""
    seconds = check_time_limit(time_limit)
    if seconds is None:
        yield
        return
    outer = _DEADLINE.get()
    end = time.monotonic() + seconds
    if outer is not None and outer[0] <= end:
        end, seconds = outer[0], outer[1]
    comm = comm if comm is not None else (None if outer is None else outer[2])
    token = _DEADLINE.set((end, seconds, comm))
    local = comm is None
    if local:
        _set_kernel_deadline(max(end - time.monotonic(), 1e-9))
    try:
        yield
    finally:
        _DEADLINE.reset(token)
        if local:
            if outer is None or outer[2] is not None:
                _set_kernel_deadline(0.0)
            else:
                _set_kernel_deadline(max(outer[0] - time.monotonic(), 1e-9))


def remaining() -> Optional[float]:
    """Seconds left before the deadline (0 once it passed), or None without one."""
    now = _DEADLINE.get()
    return None if now is None else max(now[0] - time.monotonic(), 0.0)


def passed() -> bool:
    """Whether a deadline is set and has passed."""
    left = remaining()
    return left is not None and left <= 0.0


def check(where: str) -> None:
    """Raise :class:`TimeLimitReached` if the deadline passed (``where``: the stage, for the message)."""
    now = _DEADLINE.get()
    if now is None:
        return
    late = time.monotonic() >= now[0]
    if now[2] is not None:  # every rank stops, or none
        late = any(now[2].allgather(late))
    if late:
        raise TimeLimitReached(now[1], where)


def capped(seconds: Optional[float]) -> Optional[float]:
    """A stage's own time limit (None: none) capped by the time left before the deadline."""
    now = _DEADLINE.get()
    if now is None or now[2] is not None:  # under comm a solve on one rank gets no deadline
        return seconds
    left = remaining()
    if left is None:
        return seconds
    left = max(left, 1e-9)
    return left if seconds is None else min(float(seconds), left)
