"""Sign-pattern stage: candidate positive sets of vectors in the row span of the outputs.

BJW19 Lemma 1 enumerates, for the k x n basis B of the output span (samples are columns),
every set S that is the positive set of some vector ``w B``: each such set is the positive
set of a vertex of the LP ``{w : (wB)_j >= 1 on S, (wB)_j <= 0 off S}``, found by solving
a k x k system for a k-subset of tight constraints. The rows of ``relu(X V^T)`` are, in
addition, extreme rays of the cone ``{w : w B >= 0}`` (Lemma 10), found from (k-1)-subsets;
those are tried first. Both enumerations run in C++ over ranges of subsets, so callers can
stream them in chunks (:class:`PatternStream`) with progress, limits and early stopping.

References
----------
.. [1] A. Bakshi, R. Jayaram, D. P. Woodruff. Learning two layer rectified neural networks
   in polynomial time. COLT 2019. Lemma 1, Lemma 10.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np

from .._native import core
from .._progress import Progress as _Progress
from .reduce import allgather_checked

__all__ = ["unpack_patterns", "sign_patterns", "sign_patterns_reference", "cell_count", "PatternStream"]


def unpack_patterns(words, n):
    """Bit-packed patterns (count, n_words) uint64 -> boolean array (count, n)."""
    words = np.ascontiguousarray(words, dtype="<u8")
    if words.shape[0] == 0:
        return np.zeros((0, n), dtype=bool)
    bits = np.unpackbits(words.view(np.uint8).reshape(words.shape[0], -1), axis=1, bitorder="little")
    return bits[:, :n].astype(bool)


def sign_patterns(B, *, mode="vertices", tol=1e-9, begin=0, end=None, n_jobs=0, time_limit=None):
    """Positive sets of vectors in the row span of B (k, n), from subsets of rank [begin, end).

    Parameters
    ----------
    B : ndarray of shape (k, n)
    mode : {"vertices", "rays"}
        "vertices": BJW19 Lemma 1 (all realizable positive sets; C(n, k) subsets).
        "rays": supports of extreme rays of ``{w : w B >= 0}`` (C(n, k-1) subsets).
    tol : float
        Entries with ``r_j <= tol * max|r|`` count as zero (ties are never positive).
    time_limit : float, optional
        Seconds; the C++ enumeration raises ``TimeoutError`` once they have passed.

    Returns
    -------
    patterns : ndarray of bool, shape (c, n)
    coeffs : ndarray of shape (c, k)
        ``coeffs[i] @ B`` has positive set ``patterns[i]``.
    systems : int
        Linear systems solved.
    """
    B = np.ascontiguousarray(B, dtype=np.float64)
    k, n = B.shape
    total = core.pattern_subset_count(n, k, mode)
    end = total if end is None else min(end, total)
    out = core.enumerate_patterns(B, mode, int(begin), int(end), float(tol), int(n_jobs), _seconds(time_limit))
    return unpack_patterns(out["words"], n), out["coeffs"], int(out["systems"])


def _seconds(time_limit):
    """The C++ kernels' time limit: 0 means none; an exhausted budget still stops at once."""
    return 0.0 if time_limit is None else max(float(time_limit), 1e-9)


def sign_patterns_reference(B, *, mode="vertices", tol=1e-9):
    """Pure NumPy version of :func:`sign_patterns` over all subsets (small n only, for tests)."""
    k, n = B.shape
    found: dict[bytes, np.ndarray] = {}
    if mode == "vertices":
        for J in itertools.combinations(range(n), k):
            M = B[:, J].T
            if abs(np.linalg.det(M)) <= 1e-12 * np.prod(np.linalg.norm(M, axis=1)):
                continue
            for bits in itertools.product((0.0, 1.0), repeat=k):
                if not any(bits):
                    continue
                r = np.linalg.solve(M, np.array(bits)) @ B
                S = r > tol * np.abs(r).max()
                found.setdefault(S.tobytes(), S)
    else:
        for J in itertools.combinations(range(n), k - 1):
            if k == 1:
                z = np.ones(1)
            else:
                Uj, s, _ = np.linalg.svd(B[:, J], full_matrices=True)
                if s[0] <= 0 or s[-1] < 1e-10 * s[0]:
                    continue
                z = Uj[:, k - 1]
            for zz in (z, -z):
                r = zz @ B
                if r.min() >= -tol * np.abs(r).max():
                    S = r > tol * np.abs(r).max()
                    if S.any():
                        found.setdefault(S.tobytes(), S)
    return np.array(list(found.values()), dtype=np.bool_).reshape(-1, n)


def cell_count(n, k):
    """Full-dimensional cells of a central arrangement of n generic hyperplanes in R^k."""
    return 2 * sum(math.comb(n - 1, i) for i in range(k))


class PatternStream:
    """Stream deduplicated candidate patterns: extreme-ray supports first, then Lemma 1.

    Iterating yields ``(pattern, coeff, source)`` with ``pattern`` a boolean (n,) array,
    ``coeff @ B`` a vector with that positive set, and ``source`` "rays" or "vertices".
    Enumeration runs in chunks of ``chunk`` subsets; ``max_patterns`` and ``time_limit``
    end the stream early (see :attr:`exhausted` and :attr:`stopped_by`).

    With ``comm`` (an mpi4py communicator; every rank holds the same B and ``random_state``)
    each chunk's subsets are split into contiguous shares, one per rank; the shares'
    patterns are gathered in rank order, which is subset order, so every rank streams the
    same patterns as one process (the kernel keeps first occurrences in subset order, and so
    does the deduplication here). Time limits are agreed: a rank out of time stops them all.
    """

    def __init__(
        self,
        B,
        *,
        tol=1e-9,
        n_jobs=0,
        chunk=20000,
        max_patterns=None,
        time_limit=None,
        progress=None,
        phases=("random", "rays", "vertices"),
        n_random=None,
        random_state=None,
        comm=None,
    ):
        self.comm = comm
        self.B = np.ascontiguousarray(B, dtype=np.float64)
        self.k, self.n = self.B.shape
        self.tol, self.n_jobs, self.chunk = tol, n_jobs, chunk
        self.max_patterns, self.time_limit = max_patterns, time_limit
        self.phases = phases
        rays_total = core.pattern_subset_count(self.n, self.k, "rays")
        # Random (k-1)-subsets first: each lies in the zero set of a given rectified row with
        # probability about 2^-(k-1), so these find the rows of relu(V X) in a few hundred
        # systems, where the lexicographic order can spend millions on subsets sharing a
        # sample at which a row is positive (measured: n = 2000, k = 4 took 8e6 systems).
        self.n_random = min(rays_total, 64 * self.k * 2 ** (self.k - 1)) if n_random is None else int(n_random)
        self.rng = np.random.default_rng(random_state)
        self.totals = {
            p: (self.n_random if p == "random" else core.pattern_subset_count(self.n, self.k, p)) for p in phases
        }
        self.progress = progress
        self.systems = 0
        self.yielded = 0
        self.exhausted = False
        self.stopped_by = None
        self._seen = set()
        self._deadline = None

    def chunks(self):
        """Yield lists of new ``(pattern, coeff, source)``, one list per enumerated chunk.

        Chunks start small (early stopping is cheap when the first patterns suffice) and
        double up to ``chunk`` subsets.
        """
        start = time.monotonic()
        self._deadline = None if self.time_limit is None else start + self.time_limit
        total = sum(self.totals.values())
        bar = _Progress(total, "sign patterns", self.progress)
        done = 0
        size = min(2000, self.chunk)
        try:
            for phase in self.phases:
                begin = 0
                while begin < self.totals[phase]:
                    end = min(begin + size, self.totals[phase])
                    pats, coeffs, systems, timed_out = self._enumerate(phase, begin, end)
                    if timed_out:  # the deadline passed inside the C++ enumeration (on some rank)
                        self.stopped_by = "time_limit"
                        return
                    self.systems += systems
                    done += end - begin
                    begin = end
                    size = min(2 * size, self.chunk)
                    new = []
                    for S, c in zip(pats, coeffs):
                        key = S.tobytes()
                        if key in self._seen:
                            continue
                        if self.max_patterns is not None and self.yielded >= self.max_patterns:
                            self.stopped_by = "max_patterns"
                            break
                        self._seen.add(key)
                        self.yielded += 1
                        new.append((S, c, phase))
                    bar.update(done, f"{self.yielded} patterns")
                    if new:
                        yield new
                    if self.stopped_by:
                        return
                    if self._agree(self._deadline is not None and time.monotonic() > self._deadline):
                        self.stopped_by = "time_limit"
                        return
            self.exhausted = True
        finally:
            bar.close()

    def _remaining(self):
        """Seconds left before the stream's deadline (None without a time limit)."""
        return None if self._deadline is None else self._deadline - time.monotonic()

    def _agree(self, flag):
        """True on every rank when ``flag`` is true on any rank (the flag itself without comm)."""
        return bool(flag) if self.comm is None else any(self.comm.allgather(bool(flag)))

    def _enumerate(self, phase, begin, end):
        """Subsets [begin, end) of a phase: (patterns, coeffs, systems, timed_out), this rank's
        share enumerated here and the shares gathered in rank order."""
        if phase == "random":
            subsets = self._random_subsets(end - begin)  # drawn on every rank alike
        size = 1 if self.comm is None else int(self.comm.Get_size())
        rank = 0 if self.comm is None else int(self.comm.Get_rank())
        count = len(subsets) if phase == "random" else end - begin
        lo, hi = count * rank // size, count * (rank + 1) // size
        n_words = (self.n + 63) // 64

        def share():
            if hi <= lo:
                return np.zeros((0, n_words), np.uint64), np.zeros((0, self.k)), 0, False
            try:
                if phase == "random":
                    out = core.enumerate_patterns_for(
                        self.B, "rays", subsets[lo:hi], self.tol, self.n_jobs, _seconds(self._remaining())
                    )
                else:
                    out = core.enumerate_patterns(
                        self.B,
                        phase,
                        int(begin + lo),
                        int(begin + hi),
                        float(self.tol),
                        int(self.n_jobs),
                        _seconds(self._remaining()),
                    )
            except TimeoutError:
                return np.zeros((0, n_words), np.uint64), np.zeros((0, self.k)), 0, True
            return out["words"], out["coeffs"], int(out["systems"]), False

        if self.comm is None:
            words, coeffs, systems, timed_out = share()
        else:  # an error on one rank (bad workspace, interrupt) is raised on every rank
            parts = allgather_checked(self.comm, share)
            words = np.concatenate([np.asarray(w, dtype=np.uint64).reshape(-1, n_words) for w, _, _, _ in parts])
            coeffs = np.concatenate([np.asarray(c, dtype=np.float64).reshape(-1, self.k) for _, c, _, _ in parts])
            systems = sum(sy for _, _, sy, _ in parts)
            timed_out = any(t for _, _, _, t in parts)
        return unpack_patterns(words, self.n), coeffs, systems, timed_out

    def _random_subsets(self, count):
        """``count`` random (k-1)-subsets of the samples (sorted rows, distinct entries)."""
        r = self.k - 1
        if r == 0:
            return np.zeros((count, 0), dtype=np.int64)
        subsets = np.sort(self.rng.integers(0, self.n, size=(2 * count + 16, r)), axis=1)
        distinct = np.all(np.diff(subsets, axis=1) > 0, axis=1) if r > 1 else np.ones(len(subsets), bool)
        return np.ascontiguousarray(subsets[distinct][:count], dtype=np.int64)

    def __iter__(self):
        for chunk in self.chunks():
            yield from chunk
