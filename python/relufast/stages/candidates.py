"""BJW19 Alg. 4 step 4 with Alg. 5: candidate rows from the projected moment tensor, certified
by the exact refinement and pooled until every hidden unit has its row (bjw19-gaussian;
atv21 at size on the affine lift).

Departures from the paper (relufast; ``docs/bjw19.md``, "Candidates at size"):

- At k >= :data:`OVERCOMPLETE_MIN_K` a draw is CP-ALS from a random start with a few
  components more than k, not from Jennrich's eigenvectors, whose eigen-gaps vanish there.
- Completion rounds: CP-ALS with the certified rows fixed proposes the units still
  missing, instead of a new draw of all k.
- Candidates near a certified row, or near another candidate of the same draw, are not
  refined again.
"""

from __future__ import annotations

import numpy as np

from .._deadline import check as check_deadline
from .pool import CERT_FIELDS, RowPool
from .refine import refine_rows
from .tensor import cp_als, draw_candidates, merge_symmetric_factors

__all__ = ["certify_candidates"]

#: Jennrich's minimum relative eigen-gap below which its own candidates are not refined
#: (they are the polish's starting point; at k = 50 the gap is ~0 and they miss by ~1 rad).
JENNRICH_GAP = 1e-3
#: A candidate within this |cosine| of a row already certified in the same coordinates is
#: the same unit again: it is not refined (relufast; the paper refines every candidate).
RETIRE_COS = 0.98
#: Two candidates of one draw within this |cosine| are one unit found twice: the second
#: is refined only if the first does not certify.
DUPLICATE_DRAW_COS = 0.9
#: CP-ALS stops once no factor column moves by more than this (1 - |cos|): the exact
#: refinement needs angles of about 0.3 rad, not a converged fit.
FACTOR_TOL = 1e-6
#: At size (a draw or completion with components beyond the units), CP-ALS stops once as
#: many free columns as there are units moved by no more than this; the extra components
#: follow the noise and never settle, so the rule above ran all 100 sweeps. Planted
#: (200, 100, 100), n = 4e5, three draws, 2 threads: the tensor stage 0.27-0.32 s instead
#: of 1.4-1.6 s, every unit certified from the first draw as before, the refinement
#: unchanged; 1e-3 needed a completion round at each (ad-hoc runs of ``recover``).
SETTLE_TOL = 1e-4
#: Completion rounds in a row that add no row before a new Jennrich draw (each starts the
#: free components afresh; far cheaper than a draw of all k components).
COMPLETION_STALLS = 3
#: Free components of a draw or completion beyond the units missing (up to k / 5): they
#: take up the noise of the tensor, which a lone free component follows instead of a
#: weak unit.
COMPLETION_EXTRA = 10
#: From this k on a draw is CP-ALS from a random start (:func:`_random_draw`), not from
#: Jennrich's eigenvectors (better below it, with few samples).
OVERCOMPLETE_MIN_K = 20


def _unretired(cand, known):
    """Mask of the candidates (unit rows) not within RETIRE_COS of a certified row (``known``:
    unit directions)."""
    if not known:
        return np.ones(len(cand), dtype=bool)
    return np.max(np.abs(cand @ np.array(known).T), axis=1) < RETIRE_COS


def _representatives(cand, cos=DUPLICATE_DRAW_COS):
    """Mask of the first candidate of each group of near-parallel ones (|cosine| above
    ``cos``): CP-ALS often returns one unit twice, and refining both is wasted work."""
    keep = np.zeros(len(cand), dtype=bool)
    reps: list = []
    for i, c in enumerate(cand):
        if not reps or np.max(np.abs(np.array(reps) @ c)) < cos:
            keep[i] = True
            reps.append(c)
    return keep


class _Refiner:
    """Alg. 5 on batches of candidate rows, pooling the certified ones (state of one
    :func:`certify_candidates` run)."""

    def __init__(self, run, B, Xref, to_x, k, threads, act, whitened, tols, lift=False):
        self.run, self.B, self.Xref, self.to_x = run, B, Xref, to_x
        self.threads, self.act, self.whitened, self.tols = threads, act, whitened, tols or {}
        self.lift = lift
        self.d = Xref.shape[1] - int(lift)
        self.pool = RowPool(k)
        self.known: list = []  #: certified directions (unit, in the coordinates of Xref)
        self.approx_rows = None
        self.failed = np.zeros((0, self.d))  #: candidates refined without a certificate
        self.min_null = np.inf
        self.n_candidates = 0

    def refine(self, part, *, everything=False, estimate=None):
        """Refine the candidates ``part`` (unit rows) not retired by a certified row (all of
        them with ``everything``); returns the number of rows added to the pool.

        ``estimate`` (the first draw's k polished candidates, of which ``part`` is a subset
        given by the mask ``estimate[1]``) also sets the approximate rows of a noisy run."""
        keep = np.ones(len(part), dtype=bool) if everything else _unretired(part, self.known)
        if not keep.any():
            return 0
        before = len(self.pool)
        cand = part[keep]
        if self.lift:  # rows (v, b) on the lift [x, 1]: b = 0 and the margins cover |b|
            cand = np.column_stack([cand, np.zeros(len(cand))])
        with self.run.stage("refine"):
            out = refine_rows(
                self.B,
                self.Xref,
                cand,
                n_jobs=self.threads,
                activation=self.act,
                approximate=estimate is not None,
                **self.tols,
            )
        rows_x = self.to_x(out["rows"])
        if self.act.homogeneous and self.whitened:
            rows_x = rows_x / np.linalg.norm(rows_x, axis=1, keepdims=True)
        self.n_candidates += int(keep.sum())
        self.min_null = min(self.min_null, float(np.min(out["null_ratio"])))
        if estimate is not None and keep.all() and self.approx_rows is None:
            # Noise-tolerant estimate from the first draw (its k polished candidates):
            # near-null-vector rows where solved, else the tensor direction with the
            # better-supported sign (candidates not refined keep their direction).
            polished, mask = estimate
            rows = np.where(out["solved"][:, None], out["rows"], np.where(out["sign"][:, None] < 0, -1.0, 1.0) * part)
            approx = polished.copy()
            approx[mask] = rows
            self.approx_rows = self.to_x(approx)
        self.failed = np.vstack([part[keep][~out["certified"]], self.failed])[: self.pool.k]
        for i in np.flatnonzero(out["certified"]):
            if self.pool.add(rows_x[i], {key: out[key][i] for key in CERT_FIELDS}):
                v = out["rows"][i][: self.d]
                self.known.append(v / max(np.linalg.norm(v), 1e-300))
        return len(self.pool) - before


def _extra_components(k):
    """Free CP components beyond k in a draw at size and in every completion (0 below
    :data:`OVERCOMPLETE_MIN_K`, where they would take the place of units)."""
    return 0 if k < OVERCOMPLETE_MIN_K else min(COMPLETION_EXTRA, k // 5)


def _random_draw(P, W, k, rng):
    """A draw at size (k >= OVERCOMPLETE_MIN_K): CP-ALS on P from a random start with
    ``k + _extra_components(k)`` components (relufast, not in the paper). Jennrich's
    eigen-gaps vanish at such k and its start led CP-ALS to 21-34 of 50 units (k = 50,
    27,000 samples) and 61-66 of 100 (k = 100, 100,000 samples); a random start with a few
    components more than k, which take up the noise, to 49-50 and 98-100
    (``bench/test_bench_size.py::test_draw_start``, 3 starts each). Returns unit
    candidate rows."""
    return _cp_candidates(P, W, rng.standard_normal((P.shape[1], k + _extra_components(k))), units=k)


def _cp_candidates(P, W, B0, fixed=None, units=None):
    """CP-ALS on P from the input factors B0 (any norm; with ``fixed`` components), the
    free components mapped through the span W: unit candidate rows. ``units``: free
    components that stand for units (the rest take up noise); CP-ALS stops once that many
    have settled to SETTLE_TOL."""
    B0 = B0 / np.maximum(np.linalg.norm(B0, axis=0), 1e-300)
    tol = FACTOR_TOL if units is None else SETTLE_TOL
    _, Bf, Cf = cp_als(P, B0, fixed=fixed, factor_tol=tol, settle=units)
    cand = (W @ merge_symmetric_factors(Bf, Cf)).T
    return cand / np.maximum(np.linalg.norm(cand, axis=1, keepdims=True), 1e-300)


def _completion(P, W, known, failed, k, rng, extra=0):
    """Candidates for the units still missing (relufast, not in the paper): CP-ALS on P with
    the certified rows fixed (their input-mode factors, in the coordinates of the span W)
    and ``k - len(known) + extra`` free components, started at the candidates that failed
    (``failed``) and at random. The fixed components
    explain their part of the noisy tensor exactly, so the free ones are drawn to the
    missing units (at k = 50 one completion after the first draw finds nearly all of
    them). Returns unit candidate rows (r, d)."""
    F = W.T @ np.array(known).T
    F /= np.maximum(np.linalg.norm(F, axis=0), 1e-300)
    r = k - F.shape[1] + extra
    # Start the free components at the candidates that failed to certify (the latest
    # first: often a unit still missing, at 0.3-0.5 rad), the rest at random.
    B0 = rng.standard_normal((P.shape[1], r))
    start = W.T @ failed[:r].T
    B0[:, : start.shape[1]] = start
    return _cp_candidates(P, W, B0, fixed=F, units=r - extra if extra else None)


def certify_candidates(run, P, W, B, Xref, to_x, k, n_restarts, rng, threads, act, whitened, tols=None, lift=False):
    """Alg. 4 step 4 + Alg. 5: Jennrich/CP-ALS draws whose candidates are certified and
    pooled until k distinct rows are found.

    Each draw gives k CP-ALS-polished candidates and k from Jennrich alone. The polished
    ones are refined first, one per group of near-parallel ones, then the rest that no
    certified row retires (a candidate near a certified row would certify the same unit
    again). Jennrich's own are refined only when the polished ones added no row. While
    rows are missing, completion rounds (:func:`_completion`: CP-ALS with the certified
    rows fixed) propose the missing units; a new draw comes only when a completion adds
    nothing. The last draw refines every candidate.

    With ``lift`` (biased networks, relufast) ``Xref`` is the affine lift ``[x, 1]`` and B
    spans ``[Y, 1]``: each candidate v is refined as the row (v, 0), the margins of Alg. 5
    covering the unknown bias, and the certified rows are (v, b); there are no approximate
    rows then.

    Returns (pool, approximate rows from the first draw, smallest null-space ratio seen).
    """
    ref = _Refiner(run, B, Xref, to_x, k, threads, act, whitened, tols, lift=lift)
    gaps: list = []
    restarts = completions = 0
    for restarts in range(1, n_restarts + 1):
        check_deadline("in a tensor restart")
        last = restarts == n_restarts
        with run.stage("tensor"):
            if k >= OVERCOMPLETE_MIN_K:
                polished, gap = _random_draw(P, W, k, rng), np.nan
                jennrich_only = polished[:0]
            else:
                cand, gap, _ = draw_candidates(P, W, rng, factor_tol=0.0 if last else FACTOR_TOL)
                polished, jennrich_only = cand[:k], cand[k:]
        gaps.append(gap)
        before = len(ref.pool)
        if last:
            everyone = None if lift else (polished, np.ones(len(polished), dtype=bool))
            ref.refine(polished, everything=True, estimate=everyone)
        else:
            reps = _representatives(polished)
            first = ref.approx_rows is None and not lift
            ref.refine(polished[reps], everything=first, estimate=(polished, reps) if first else None)
            if not ref.pool.full:
                ref.refine(polished[~reps])
        if len(jennrich_only) and not ref.pool.full and (last or (len(ref.pool) == before and gap >= JENNRICH_GAP)):
            ref.refine(jennrich_only, everything=last)
        stalls, extra = 0, _extra_components(k)
        while not ref.pool.full and ref.known and k > 1 and stalls < COMPLETION_STALLS:
            check_deadline("in a completion round")
            completions += 1
            with run.stage("tensor"):
                cand = _completion(P, W, ref.known, ref.failed if stalls == 0 else ref.failed[:0], k, rng, extra)
            added = ref.refine(cand)
            stalls = 0 if added else stalls + 1
        if ref.pool.full:
            break
    run.counts.update(candidates=ref.n_candidates, restarts=restarts, completions=completions)
    run.diag["jennrich_gaps"] = np.array(gaps)
    return ref.pool, ref.approx_rows, ref.min_null
