"""Samples and label oracles of GP19: in memory, streamed, or on MPI ranks; the band oracle."""

from __future__ import annotations

import numpy as np

from ...stages.moments import Hermite4Accumulator, hermite4_statistics
from ...stages.reduce import is_dask
from .coefficients import _BACKGROUND_SHIFT


class _Data:
    """A GP19 run's samples or drawn queries, with the constant c0 and the total count N.

    The rows are a :class:`relufast.stages.reduce.Samples` (NumPy, memmap, dask, and each
    MPI rank's own rows); every statistic is one streamed pass of the C++ contraction
    kernel whose sums are reduced over blocks and ranks, so every rank gets the same bits.
    """

    def __init__(self, samples, c0, n_total=None, n_jobs=None):
        self.samples, self.c0 = samples, float(c0)
        self.N = samples.n if n_total is None else int(n_total)
        self.n_jobs = n_jobs
        self.n = samples.d

    def stats(self, Z, *, second=False, pairs=False, active_tol=0.0):
        acc = Hermite4Accumulator(
            Z, offset=self.c0, active_tol=active_tol, second=second, pairs=pairs, n_jobs=self.n_jobs
        )
        sums = self.samples.accumulate(acc).sums()
        sums["count"] = float(self.N)  # rows dropped before the kernel (query mode) were inactive
        st = hermite4_statistics(sums, Z)
        st["sums"] = sums
        return st


def _mean(samples):
    """The mean of the outputs over every rank (the same bits as np.mean on one process)."""
    total = samples.map_reduce(lambda Xb, Yb: {"s": float(np.sum(Yb[:, 0]))}, bounded=False)["s"]
    return float(total / samples.n)


class _BandData:
    """EstimateTanAlpha and the Stein direction from samples (Sec. 2.2, dataset mode).

    For the current z each rank keeps the sorted projections ``z . x >= lo_cut`` of its own
    rows, their labels ``f > c0 + tau`` and row numbers. A band's counts are integers summed
    over the ranks, so every rank (and one process on all rows) sees the same ratios; the
    Stein sums are added in rank order.
    """

    def __init__(self, samples, c0, tau, eps, min_band, t):
        self.samples, self.c0, self.tau = samples, c0, tau
        self.eps, self.min_band = eps, min_band
        self.lo_cut = t - _BACKGROUND_SHIFT - 0.5  # no band below this is ever probed
        self.counts = []

    def prepare(self, z, rng):
        parts, start = [], 0
        for Xb, Yb in self.samples.blocks():
            a = Xb @ z
            rows = np.flatnonzero(a >= self.lo_cut)
            parts.append((a[rows], np.asarray(Yb[rows, 0]) > self.c0 + self.tau, rows + start))
            start += len(Xb)
        a, active, rows = (np.concatenate([p[i] for p in parts]) for i in range(3))
        order = np.argsort(a)
        self.a, self.rows, self.active = a[order], rows[order], active[order]
        self.cum = np.concatenate([[0], np.cumsum(self.active)])
        tops = np.sort(np.concatenate(self.samples.allgather(self.a[-self.min_band :])))
        self.s_max = tops[max(len(tops) - self.min_band, 0)] if len(tops) else -np.inf

    def p_hat(self, s):
        lo = np.searchsorted(self.a, s - self.eps, side="left")
        hi = np.searchsorted(self.a, s, side="right")
        parts = self.samples.allgather((int(hi - lo), int(self.cum[hi] - self.cum[lo])))
        cnt, act = sum(p[0] for p in parts), sum(p[1] for p in parts)
        self.counts.append(cnt)
        return np.nan if cnt == 0 else act / cnt

    def _mean_perp(self, z, lo_s, hi_s):
        lo = np.searchsorted(self.a, lo_s, side="left")
        hi = np.searchsorted(self.a, hi_s, side="right")
        idx = self.rows[lo:hi][self.active[lo:hi]]
        X = self.samples.X
        rows = np.asarray(X[idx].compute()) if is_dask(X) else X[idx]  # y may be the lazy one
        parts = self.samples.allgather((int(hi - lo), rows.sum(axis=0)))
        count = sum(p[0] for p in parts)
        if count == 0:
            return np.zeros_like(z)
        g = parts[0][1]
        for p in parts[1:]:
            g = g + p[1]
        g = g / count
        return g - (g @ z) * z

    def stein(self, z, s, rng, width):
        # Band mean minus a background band lower down, where the nearest unit is off and
        # the other units (nearly orthogonal to z) are active as often as at s.
        return self._mean_perp(z, s - width, s + width) - self._mean_perp(
            z, s - _BACKGROUND_SHIFT - 0.25, s - _BACKGROUND_SHIFT + 0.25
        )


class _BandQueries:
    """EstimateTanAlpha and the Stein direction by queries ``x = (s - eps v) z + (I - z z^T) g``."""

    def __init__(self, f, c0, tau, m, eps):
        self.f, self.c0, self.tau, self.m, self.eps = f, c0, tau, m, eps
        self.counts = []
        self.s_max = None

    def prepare(self, z, rng):
        g = rng.standard_normal((self.m, len(z)))
        g -= np.outer(g @ z, z)
        self.g = g
        self.base = g - np.outer(self.eps * rng.random(self.m), z)
        self.z = z

    def _active(self, Xq):
        return np.asarray(self.f(Xq), dtype=np.float64).reshape(-1) > self.c0 + self.tau

    def p_hat(self, s):
        self.counts.append(self.m)
        return float(np.mean(self._active(self.base + s * self.z)))

    def stein(self, z, s, rng, width):
        # Same draws at s and lower down (common random numbers): the other units' share cancels.
        act = self._active(self.base + s * self.z).astype(np.float64)
        low = self._active(self.base + (s - _BACKGROUND_SHIFT) * self.z).astype(np.float64)
        return (act - low) @ self.g / self.m
