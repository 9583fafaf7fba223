"""BJW19 Theorem 11, Algorithm 7: exact recovery for Gaussian X when U has fewer rows than
hidden units (m < k allowed), with the corrections in ``docs/bjw19.md`` (pairwise
independent columns of U, m >= 2).
"""

from __future__ import annotations

import numpy as np

from ..._protocol import recovery_method
from ..._result import DOCS_URL, Run, Status
from ..._validation import check_n_hidden, check_positive_int, check_random_state, resolve_n_jobs
from ...stages.fit import check_finite_once, fit_and_certify
from ...stages.precision import polish_at_precision, resolve_precision
from ...stages.reduce import GrowingSample, Samples, check_n_estimate

__all__ = ["fpt"]


def _classes(Y, m, min_size, class_tol, rng):
    """Alg. 7 steps 1-2: indices of the samples grouped by identical output direction."""
    norms = np.linalg.norm(Y, axis=1)
    keep = np.flatnonzero(norms > 1e-12 * norms.max()) if len(norms) and norms.max() > 0 else np.array([], int)
    A = Y[keep] / norms[keep, None]
    order = np.argsort(A @ rng.standard_normal(m), kind="stable")
    A = A[order]
    breaks = np.flatnonzero(np.linalg.norm(np.diff(A, axis=0), axis=1) >= class_tol) + 1
    runs = np.split(np.arange(len(A)), breaks)
    return [keep[order[r]] for r in runs if len(r) >= min_size]


@recovery_method("bjw19-fpt")
def fpt(
    X,
    Y,
    n_hidden,
    *,
    tol=1e-10,
    class_tol=1e-9,
    min_class_size=None,
    random_state=None,
    n_estimate=None,
    n_jobs=None,
    comm=None,
    precision=None,
):
    """Exact recovery when U is rank-deficient or has fewer rows than k (BJW19 Thm 11, Alg. 7).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Gaussian inputs (the sample bound of Lemma 21 is for Gaussian X; the algorithm
        itself only needs samples where exactly one unit is active).
    Y : array-like of shape (n_samples, n_outputs)
        Noiseless outputs; n_outputs >= 2.
    n_hidden : int
        Number of hidden units k (rank V = k, k <= d).
    tol : float, default=1e-10
        Largest relative residual accepted as exact.
    class_tol : float, default=1e-9
        Unit output directions closer than this are the same class.
    min_class_size : int, optional
        Smallest class kept (default d: the row is then determined, Lemma 21).
    random_state : None, int or numpy Generator
    n_estimate : None, int or "all", default=None
        Samples grouped into classes (steps 1-4): None starts from
        ``max(2000, 4 min_class_size 2^k)`` random samples and doubles until k classes are
        found; "all" groups every sample. The samples grouped are held in memory; the
        certificate (step 5) reads every sample in one pass.
    n_jobs : int or None, default=None
        Threads of the certificate pass (None or -1: all cores).
    comm : mpi4py communicator, optional
        Each rank passes its own samples; every rank returns the same result.
    precision : None, str or float, optional
        Precision of the outputs (default: from Y's dtype). Below float64, ``tol``,
        ``class_tol`` and the class residual test are raised to the rounding floor
        (:mod:`relufast.stages.precision`) and an exact result is polished in float64.

    Returns
    -------
    RecoveryResult
        ``non_identifiable`` when a class is polluted (the paper's claim that
        antiparallel columns [u, -u] are allowed is false: samples with both units active
        are parallel to +-u too; docs/bjw19.md, erratum 7), ``unsupported`` for m = 1 with k >= 2.

    Notes
    -----
    Algorithm 7 with the corrections of docs/bjw19.md (erratum 7):

    1. Drop samples with zero output; normalise the others.
    2. Group samples with identical output directions (positive multiples only): sort by
       a random projection, compare neighbours. A sample with exactly one active unit i
       has output parallel to U_i. Keep classes of at least d samples; expect k.
    3. Class i: U_i = a representative output; c_j = <y_j, U_i> / |U_i|^2 = relu(V_i x_j).
    4. Solve X_S w = c (least squares); its residual must vanish, else the class is
       polluted and the network is not identifiable from this construction.
    5. V_i = w / |w|; U by least squares on relu(X V^T) (unique when it has rank k).

    Requires the columns of U pairwise linearly independent and m >= 2. Time
    O(n m log n + k n d^2).
    """
    prec = resolve_precision(Y, precision)
    return _fpt(X, Y, n_hidden, tol, class_tol, min_class_size, random_state, n_estimate, comm, prec, n_jobs)


def _fpt(X, Y, n_hidden, tol, class_tol, min_class_size, random_state, n_estimate, comm, prec, n_jobs=None):
    """The body of :func:`fpt`: validation, then Alg. 7 steps 1-2 (:func:`_group`), 3-4
    (:func:`_rows_from_classes`) and 5 (:func:`_certify`), stopping with the status the
    data call for (m = 1, a wrong number of classes, a polluted class)."""
    run = Run("bjw19-fpt")
    data = Samples.from_arrays(
        X, Y, comm=comm, n_jobs=resolve_n_jobs(n_jobs), check_finite=isinstance(n_estimate, str) and n_estimate == "all"
    )
    n, d, m = data.n, data.d, data.m
    k = check_n_hidden(n_hidden, d)
    run.precision = prec.name
    tol, class_tol = prec.tol(tol, d, k), prec.tol(class_tol, d, k)
    rng = check_random_state(random_state)
    min_size = d if min_class_size is None else check_positive_int(min_class_size, "min_class_size")
    n_estimate = check_n_estimate(n_estimate, 1)
    run.counts.update(n_samples=n, n_hidden=k)
    if m == 1 and k >= 2:
        check_finite_once(data)
        return run.result(
            Status.UNSUPPORTED,
            f"bjw19-fpt needs at least 2 outputs when k >= 2: with m = 1 every output is "
            f"parallel to the single column of U and the units cannot be told apart "
            f"({DOCS_URL}/bjw19.md, erratum 7); got m = 1, k = {k}",
        )
    Xe, Ye, classes = _group(run, data, k, min_size, class_tol, rng, n_estimate)
    if len(classes) > k:
        classes = _single_unit_classes(run, Xe, Ye, classes, prec.tol(1e-9, d, k), prec.tol(1e-6, d, k))
    if len(classes) != k:
        check_finite_once(data)
        return run.result(
            Status.INSUFFICIENT_SAMPLES if len(classes) < k else Status.FAILED,
            f"found {len(classes)} classes of at least {min_size} samples with parallel "
            f"outputs, expected k = {k}: "
            + (
                f"either the outputs come from only {len(classes)} hidden unit(s) (n_hidden "
                "too large), or too few samples have a single active unit (Lemma 21 needs n of "
                "order d (k kappa)^(2k): add samples). Noisy outputs also give no classes: "
                "Alg. 7 needs outputs that are exactly parallel"
                if len(classes) < k
                else f"{len(classes)} of them give distinct rows, each explained by one unit: n_hidden may be too "
                "small, or the outputs too imprecise or noisy for classes of exactly parallel outputs"
            ),
        )
    V, class_res = _rows_from_classes(Xe, Ye, classes)
    run.diag["class_residuals"] = class_res
    if max(class_res) > prec.tol(1e-9, d, k):
        check_finite_once(data)
        return run.result(
            Status.NON_IDENTIFIABLE,
            f"a class of parallel outputs is not produced by one unit (least-squares "
            f"residual {max(class_res):.2e}): U has linearly dependent columns, e.g. an "
            f"antiparallel pair [u, -u], which BJW19 Alg. 7 cannot separate ({DOCS_URL}/bjw19.md, erratum 7)",
        )
    return _certify(run, data, Xe, Ye, V, len(classes), tol, prec, resolve_n_jobs(n_jobs))


def _group(run, data, k, min_size, class_tol, rng, n_estimate):
    """Alg. 7 steps 1-2 on a growing random sample (relufast: about k 2^-k of the samples
    have a single active unit, so the sample doubles until k classes are found; only the
    certificate reads every sample). Returns (X_e, Y_e, classes of sample indices)."""
    n = data.n
    start = n if n_estimate == "all" else (n_estimate or max(2000, 4 * min_size * 2 ** min(k, 20)))
    sample = GrowingSample(data, start, rng)
    whole = sample.final and not (data.distributed or data.lazy)
    Xe, Ye = (data.X, data.Y) if whole else sample.rows()
    while True:
        classes = _classes(Ye, data.m, min_size, class_tol, rng)
        if len(classes) >= k or len(Xe) >= n:
            break
        sample.double()
        Xe, Ye = sample.rows()
    doublings = sample.doublings
    run.counts.update(classes=len(classes), n_estimate=len(Xe), doublings=doublings, n_certify=n)
    run.diag["class_sizes"] = tuple(len(c) for c in classes)
    return Xe, Ye, classes


def _single_unit_classes(run, Xe, Ye, classes, res_tol, row_tol):
    """More classes than k: keep those one unit explains (class residual at most ``res_tol``)
    and one class per row (relufast). Samples where a weak unit (an output column of 1e-8)
    is active beside a strong one, or outputs with noise, split into runs of nearly
    parallel outputs that Alg. 7 would count as units: a run of two units leaves a class
    residual, and the runs of one unit give one row. Returns the classes kept, largest
    first (their count is the number of distinct rows, apart by more than ``1 - |cos| = row_tol``)."""
    classes = sorted(classes, key=len, reverse=True)
    V, class_res = _rows_from_classes(Xe, Ye, classes)
    kept, rows = [], []
    for S, v, r in zip(classes, V, class_res):
        if r > res_tol or (rows and np.max(np.abs(np.array(rows) @ v)) >= 1.0 - row_tol):
            continue
        kept.append(S)
        rows.append(v)
    run.diag["classes_before_merge"] = len(classes)
    return kept


def _rows_from_classes(Xe, Ye, classes):
    """Alg. 7 steps 3-4: per class, U_i = a representative output, c_j = relu(V_i x_j) from
    the projections on it, and V_i from ``X_S w = c`` by least squares. Returns V (unit
    rows) and the relative residual of each class (nonzero: the class is polluted)."""
    V = np.empty((len(classes), Xe.shape[1]))
    class_res = []
    for i, S in enumerate(classes):
        u = Ye[S[0]]
        c = Ye[S] @ u / (u @ u)
        w = np.linalg.lstsq(Xe[S], c, rcond=None)[0]
        class_res.append(float(np.linalg.norm(Xe[S] @ w - c) / np.linalg.norm(c)))
        V[i] = w / np.linalg.norm(w)
    return V, tuple(class_res)


def _certify(run, data, Xe, Ye, V, n_classes, tol, prec, threads=0):
    """Alg. 7 step 5: U by least squares on the grouped samples and the residual certificate
    over all samples; an exact result below float64 is polished in float64."""
    d, k = data.d, V.shape[0]
    U, residual, _ = fit_and_certify(data, None, V, subset=(Xe, Ye), threads=threads)
    run.counts["certify_passes"] = 1
    if residual <= tol:
        note = ""
        if not prec.is_double and not (data.distributed or data.lazy):
            U, V, _, _, residual = polish_at_precision(data.X, data.Y, U, V)
            note = f" (certified at {prec.name} precision, floor {prec.floor(d, k):.1e}; polished in float64)"
        return run.result(
            Status.EXACT,
            f"recovered {k} hidden units from {n_classes} single-unit classes; relative residual {residual:.2e}{note}",
            U=U,
            V=V,
            exact=True,
            residual=residual,
        )
    return run.result(
        Status.FAILED,
        f"rows recovered but the fit of U leaves residual {residual:.2e} > tol = {tol:.1e}",
        U=U,
        V=V,
        residual=residual,
    )
