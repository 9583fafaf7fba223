"""atv21 at size with m >= k outputs (relufast, beyond the paper): the directions of the
units from the outputs' second moments in the span of V, BJW19 Algorithm 5 on the affine
lift ``[x, 1]`` for each row ``(v_i, b_i)``, and (U, c) by least squares, certified over
every sample.

For ``y = U relu(V x + b) + c`` and x ~ N(0, I) (unit rows v_i):

- ``E[y x^T] = U diag(Phi(b_i)) V``: the first moment spans the rows of V;
- ``E[y (x x^T - I)] = sum_i phi(b_i) U_i v_i v_i^T``: the same rank-k tensor as without
  biases, with positive weights phi(b_i).

So the candidate stage of bjw19-gaussian (:func:`relufast.stages.candidates.certify_candidates`)
applies unchanged; only the refinement works on the lift, where the columns of ``[Y, 1]``
span ``relu(X v_i + b_i)`` and the constant vector. No third or fourth Hermite moment is
computed (their cost grows like k^3 and k^4 per sample), and the biases come out of the
exact refinement instead of ATV21's Algorithm 2.
"""

from __future__ import annotations

import numpy as np

from ..._deadline import check as check_deadline
from ...activations import RELU
from ...stages.candidates import OVERCOMPLETE_MIN_K, certify_candidates
from ...stages.moments import moment_span, use_mean_span
from ...stages.reduce import GrowingSample
from ...stages.refine import DEFAULT_MARGINS, output_basis
from .lift import _certify_all, _lifted_fit

__all__ = ["applies", "size_start", "estimate_at_size"]


def applies(d, k, m, refine, n_estimate):
    """Whether :func:`atv21` takes this path: refinement on, m >= k, k >= 20, and the sizes
    where the moment in the span is cheaper than the full one
    (:func:`relufast.stages.moments.use_mean_span`)."""
    return bool(refine) and m >= k >= OVERCOMPLETE_MIN_K and use_mean_span(d, k, k) and n_estimate != "all"


def size_start(d, k):
    """First estimation size: ``max(4000, min(20 d k, 4 k^2 + 40 d))``, twice that of
    bjw19-gaussian (a unit with bias b enters the moment with weight phi(b) < phi(0))."""
    return max(4000, min(20 * d * k, 4 * k * k + 40 * d))


def _refinement_rows(d, k):
    """Rows of the lifted Alg. 5: its support solves need d + 1, its probes 2 (k + 1) + 5
    confidently-off samples also for a unit with b = 2 ||v|| (off on 2.3% of the samples
    beyond the margin 2.0)."""
    return max(2000, 25 * (d + 1), 200 * (k + 1))


#: Margins of the lifted Alg. 5: each candidate enters as (v, 0), so the margin must also
#: pass the unit's bias; beyond the default schedule (up to 1.6) two more cover units with
#: b up to about 2.3 ||v|| (measured: a unit with b = 1.87 ||v|| failed every margin up to 1.6
#: at (60, 30, 30)).
LIFT_MARGINS = DEFAULT_MARGINS + (2.0, 2.4)


def estimate_at_size(run, data, s):
    """The whole estimate on a growing random sample: moments in the span, candidates,
    lifted Alg. 5, (U, c) on the gathered rows and the certificate over all samples; the
    sample doubles while rows are missing. Returns a :class:`RegionRefinement` whose
    residual is over every sample, or None (not all rows certified on every sample, or
    ``[Y, 1]`` of rank <= k), when the caller runs ATV21's own pipeline."""
    n, d, m, k = data.n, data.d, data.m, s.k
    start = s.n_estimate if s.n_estimate is not None else size_start(d, k)
    sample = GrowingSample(data, min(n, start), s.rng)
    ell = min(n, _refinement_rows(d, k), s.n_refine or n)
    threads = data.n_jobs or 0
    while True:
        check_deadline("in an atv21 estimation round")
        size = sample.size
        X, Y = sample.rows(max(size, ell))
        Y = Y.reshape(len(Y), -1)
        Xr, Yr = X[:ell], Y[:ell]
        run.counts.update(n_estimate=size, n_refine=ell)
        with run.stage("moments"):
            Q = None
            if m > k:
                _, _, Vt = np.linalg.svd(Yr - Yr.mean(axis=0), full_matrices=False)
                Q = np.ascontiguousarray(Vt[:k].T)
            W, P, _ = moment_span(X[:size], Y[:size], k, Q, threads, s.block_size, mean_span=True)
            B, sv, _ = output_basis(np.column_stack([Yr, np.ones(ell)]), k + 1)
        if len(sv) < k + 1 or not sv[k] > 1e-8 * sv[0]:
            return None  # [Y, 1] of rank <= k: its span does not hold each unit's vector
        X1 = np.column_stack([Xr, np.ones(ell)])
        pool, _, _ = certify_candidates(
            run,
            P,
            W,
            B,
            X1,
            lambda R: R,
            k,
            s.n_restarts,
            s.rng,
            threads,
            RELU,
            False,
            tols={"margins": LIFT_MARGINS},
            lift=True,
        )
        if pool.full:
            R = np.array(pool.rows)
            norms = np.linalg.norm(R[:, :d], axis=1)
            with run.stage("fit"):
                rr = _lifted_fit(X, Y, R[:, :d] / norms[:, None], R[:, d] / norms)
                if rr.residual <= s.tol:  # the certificate: one pass over every sample
                    rr = _certify_all(data, rr)
                    run.counts["certify_passes"] += 1
            if rr.residual <= s.tol:
                return rr
        if size >= n or not sample.double():
            return None
        run.counts["doublings"] += 1
        ell = min(n, 2 * ell)
