"""A dependency-free progress bar for long work."""

from __future__ import annotations

import time


class Progress:
    """A one-line progress report on stderr for terminals; silent otherwise."""

    def __init__(self, total, label, enabled):
        import sys

        self.stream = sys.stderr
        # True: always; None: only on a terminal; False: never.
        self.enabled = enabled is True or (enabled is None and getattr(self.stream, "isatty", lambda: False)())
        self.total, self.label, self.last = total, label, 0.0

    def update(self, done, extra="", force=False):
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.last < 0.2 and done < self.total and not force:
            return
        self.last = now
        frac = done / self.total if self.total else 1.0
        bar = "#" * int(30 * frac)
        self.stream.write(f"\r{self.label} [{bar:<30}] {100 * frac:5.1f}% {extra}")
        self.stream.flush()

    def close(self):
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
