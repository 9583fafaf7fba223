"""Units the data cannot see, and units the data can hardly tell apart.

A unit that is never active on the inputs (a dead unit: ``v . x + b < 0`` on every
sample) or whose output column is zero (a pruned unit) has no effect on the outputs: no
method can recover it, and asking for ``n_hidden`` units including it makes an exact
method fail. :func:`visible_units` counts the units the outputs show, from the rank of the
centred outputs (exact when m exceeds the number of visible units) and from the spectrum
of the second Hermite moments ``T_2(y_j) = E[y_j (x x^T - I)]`` of the outputs, stacked
(Gaussian inputs). :func:`near_duplicates` names pairs of recovered rows that are nearly
parallel and the samples that separate them; :func:`merge_near_duplicates` replaces each
such pair by one effective unit fitted to the data (the network with fewer units that the
samples can resolve).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ._blas import add_in_order, product_blocks, thread_map
from .stages.diagnostics import RANK_TOL, gram_full_rank
from .stages.fit import max_abs, power_of_two_scale, scaled_norm
from .stages.precision import resolve_precision

__all__ = [
    "Visibility",
    "visible_units",
    "near_duplicates",
    "merge_near_duplicates",
    "merged_result",
    "Merged",
    "NEAR_DUPLICATE_COS",
    "undetermined_units",
    "undetermined_message",
    "UnitCheck",
]

#: Recovered rows with |cos| above this are reported as a near-duplicate pair.
NEAR_DUPLICATE_COS = 0.98
#: The merged residual is accepted up to the pair's angle, or this when the rows coincide.
MERGE_MIN_ANGLE = 1e-3
#: Output columns whose second moments are stacked (cost O(n d^2) each).
MOMENT_OUTPUTS = 16
#: Rows sampled for the estimate (the rank and the moment are cheap on this many).
VISIBLE_ROWS = 50000


class Visibility(NamedTuple):
    """Visible hidden units of (X, Y).

    Attributes
    ----------
    count : int or float
        Estimated number of units the outputs show; ``math.inf`` when both statistics are
        full (rank(Y) = m and d directions in the second moments): they cannot count more
        than max(d, m) units, so no unit is shown to be invisible.
    output_rank : int
        Numerical rank of the centred outputs (at the outputs' precision).
    moment_count : int or None
        Singular values of the stacked moments above their sampling floor (None when m <= output_rank does not
        need it).
    moment_spectrum : ndarray
        Singular values of the stacked moments ``[T_2(y_1) ... T_2(y_m)]``, decreasing.
    """

    # The field shadows tuple.count (public name, kept); mypy flags the override.
    count: float  # type: ignore[assignment]
    output_rank: int
    moment_count: int | None
    moment_spectrum: np.ndarray


def visible_units(X, Y, *, precision=None, random_state=0) -> Visibility:
    """Estimate the number of hidden units visible in the outputs.

    Parameters
    ----------
    X : array-like of shape (n, d)
    Y : array-like of shape (n, m) or (n,)
    precision : None, str or float
        Precision of Y (default: from its dtype); sets the rank threshold.
    random_state : int or Generator
        Unused (kept for compatibility: the moments of all outputs are stacked).

    Returns
    -------
    Visibility

    Notes
    -----
    With m outputs and k_v visible units, the centred outputs have rank min(m, k_v) for
    generic U (the features relu(X V^T + b) are linearly independent), so a rank below m
    is the count. Otherwise the count is the number of singular values of the stacked
    moments ``[T_2(y_1) ... T_2(y_m)]`` (first 16 outputs) above the sampling floor
    ``4 sqrt(sum_j var(y_j)) (sqrt(d/n) + d/n)`` (the edge of a Wishart-like noise
    spectrum, with margin); units whose ``phi(b_i)`` is tiny (very negative biases) fall
    below it, as they should: the data then hardly see them.
    """
    prec = resolve_precision(Y, precision)
    X = np.asarray(X, dtype=np.float64)[:VISIBLE_ROWS]
    Y = np.asarray(Y, dtype=np.float64).reshape(len(np.asarray(Y)), -1)[:VISIBLE_ROWS]
    n, d = X.shape
    m = Y.shape[1]
    # Every test below is invariant to the scale of Y: scale it (exactly) to avoid overflow.
    Y = Y * power_of_two_scale(max_abs(Y))
    Yc = Y - Y.mean(axis=0)
    sv = np.linalg.svd(Yc, compute_uv=False)
    rank_tol = prec.tol(RANK_TOL, d, 0)
    rank = int(np.sum(sv > rank_tol * sv[0])) if sv.size and sv[0] > 0 else 0
    # Every output's moment T_j, stacked: a unit shows in [T_1 ... T_m] unless its whole
    # output column (times phi(b)) vanishes; one random combination of the outputs could
    # cancel it (the centred logits of a softmax classifier did).
    del random_state  # kept for compatibility: no random combination any more
    cols = Yc[:, : min(m, MOMENT_OUTPUTS)]
    T = np.hstack([(X * y[:, None]).T @ X / n for y in cols.T])
    ev = np.linalg.svd(T, compute_uv=False)
    floor = 4.0 * float(np.sqrt(np.sum(np.var(cols, axis=0)))) * (math.sqrt(d / n) + d / n)
    moment = int(np.sum(ev > floor))
    count = rank if rank < min(m, n - 1) else max(moment, rank)
    if rank >= n - 1 or (rank >= m and moment >= d):
        # A statistic is full: the centred outputs of n samples have rank at most n - 1, the
        # stacked second moments span at most d directions and the outputs at most m, so
        # more units than that cannot be counted here, and none is shown to be invisible.
        count = math.inf
    return Visibility(count, rank, moment, ev)


def invisible_message(visible: int, n_hidden: int) -> str:
    """The message when fewer units are visible than asked for (empty otherwise)."""
    if visible >= n_hidden:
        return ""
    return (
        f"{n_hidden - visible} of {n_hidden} units are never active on these inputs or have a zero "
        f"output column (dead or pruned units leave no trace in the outputs); n_hidden={visible} "
        "recovers the rest"
    )


def near_duplicates(V, n_features=None, *, threshold=NEAR_DUPLICATE_COS):
    """Pairs of rows of V with |cos| >= threshold, and the samples that separate them.

    Two units at angle theta differ only on the inputs between their hyperplanes, a
    fraction ``theta / pi`` of Gaussian inputs, and a moment estimate must be accurate to
    well below theta: ``n ~ d / theta^2`` samples (order of magnitude, constant 10).

    Returns a list of (i, j, cos, samples_needed).
    """
    V = np.asarray(V, dtype=np.float64)
    if V.ndim != 2 or V.shape[0] < 2:
        return []
    d = V.shape[1] if n_features is None else n_features
    W = V / np.maximum(np.linalg.norm(V, axis=1, keepdims=True), 1e-300)
    C = W @ W.T
    out = []
    for i in range(len(W)):
        for j in range(i + 1, len(W)):
            c = float(C[i, j])
            if c >= threshold:
                theta = math.acos(min(c, 1.0))
                need = int(10 * d / max(theta, 1e-8) ** 2)
                out.append((i, j, c, need))
    return out


def near_duplicate_message(pairs) -> str:
    if not pairs:
        return ""
    parts = [
        f"units {i} and {j} are near-duplicates (recovered rows at cos {c:.5f}: the pair "
        f"separates only with at least about {need:.1e} samples, more if the true rows are closer)"
        for i, j, c, need in pairs
    ]
    return "; ".join(parts)


class Merged(NamedTuple):
    """A network with near-duplicate pairs merged (:func:`merge_near_duplicates`).

    Attributes
    ----------
    network : Network
        The effective network (k - len(pairs) units).
    residual : float
        Its relative residual ``||Y - network(X)||_F / ||Y||_F`` over all samples.
    pairs : tuple of (int, int, float)
        The merged pairs (i, j, cos) in the indices of the input network; unit j went into i.
    """

    network: Any
    residual: float
    pairs: tuple


def _merge_rows(net, pairs):
    """Each pair (i, j) -> one unit on the bisector (weighted by the output columns' norms),
    bias averaged likewise and output columns summed: relu(v_i x + b_i) ~ relu(v_j x + b_j)."""
    U, V, b = np.array(net.U), np.array(net.V), np.array(net.b)
    gone = set()
    for i, j, _c in pairs:
        if i in gone or j in gone:
            continue
        wi, wj = np.linalg.norm(U[:, i]), np.linalg.norm(U[:, j])
        w = wi + wj if wi + wj > 0 else 1.0
        V[i] = (wi * V[i] + wj * V[j]) / w
        b[i] = (wi * b[i] + wj * b[j]) / w
        s = np.linalg.norm(V[i])
        V[i], b[i] = V[i] / s, b[i] / s
        U[:, i] = (U[:, i] + U[:, j]) * s
        gone.add(j)
    keep = [t for t in range(V.shape[0]) if t not in gone]
    return U[:, keep], V[keep], b[keep]


def merge_near_duplicates(X, Y, network, *, threshold=NEAR_DUPLICATE_COS, n_jobs=None):
    """Replace near-duplicate units by one effective unit each, fitted to (X, Y).

    Two units at angle theta differ only on a fraction ``theta / pi`` of Gaussian inputs:
    with too few samples no method can tell them apart, but the network with the pair
    merged into one unit fits the data almost as well. This returns that network: each pair
    of rows with ``cos >= threshold`` becomes one unit (their bisector, weighted by the norms
    of the output columns), the output layer (and offset, for biased networks) is refitted by
    least squares, and the whole network is polished in float64 (Gauss-Newton jointly in
    (U, V) for bias-free networks, activation-region refinement for biased ones; beyond the
    papers). The residual says how well k - 1 units reproduce Y.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    Y : array-like of shape (n_samples, n_outputs) or (n_samples,)
    network : Network, RecoveryResult or tuple (U, V[, b[, c]])
        A recovered network whose rows include near-duplicates.
    threshold : float, default=NEAR_DUPLICATE_COS
        Rows with cosine at least this are merged.
    n_jobs : int or None
        Threads for the C++ kernels.

    Returns
    -------
    Merged or None
        None when no pair reaches the threshold.
    """
    from ._validation import resolve_n_jobs
    from .network import Network, as_network
    from .stages.fit import fit_network
    from .stages.precision import polish_at_precision

    net = as_network(network)
    if net.activation is not None:
        raise ValueError("merge_near_duplicates handles ReLU networks only; got a network with another activation")
    X = np.ascontiguousarray(np.asarray(X, dtype=np.float64))
    Y = np.asarray(Y, dtype=np.float64)
    Y = np.ascontiguousarray(Y.reshape(len(Y), -1))
    if X.ndim != 2 or X.shape[1] != net.n_features or Y.shape != (len(X), net.n_outputs):
        raise ValueError(
            f"expected X of shape (n, {net.n_features}) and Y of shape (n, {net.n_outputs}); "
            f"got X {X.shape} and Y {Y.shape}"
        )
    pairs = tuple((i, j, c) for i, j, c, _ in near_duplicates(net.V, threshold=threshold))
    if not pairs:
        return None
    threads = resolve_n_jobs(n_jobs)
    U, V, b = _merge_rows(net, pairs)
    biased = net.has_bias
    fit = fit_network(X, Y, V, b if biased else None, intercept=biased, threads=threads)
    U, c = fit.U, fit.c
    U, V, b2, c2, residual = polish_at_precision(
        X, Y, U, V, b if biased else None, c, threads=threads, n_iter=10, how="gauss-newton"
    )
    return Merged(Network(U, V, b2, c2), float(residual), pairs)


def merged_result(res, X, Y, *, n_jobs=None):
    """A non-exact result whose rows include near-duplicates, replaced by the merged
    effective network (:func:`merge_near_duplicates`) when that fits Y better; else None.

    The returned result has status ``approximate``, ``n_hidden`` one less per merged pair,
    a message naming the pairs, the residual and the samples that would separate them, and
    ``diagnostics["merged_pairs"]`` and ``diagnostics["unmerged"]`` (status, residual and
    parameters of the result before merging).
    """
    import dataclasses

    from ._result import Status

    if res.exact or res.V is None or not res.has_finite_parameters or res.activation is not None:
        return None
    pairs = near_duplicates(res.V)
    if not pairs:
        return None
    try:
        merged = merge_near_duplicates(X, Y, res, n_jobs=n_jobs)
    except (ValueError, np.linalg.LinAlgError):
        return None
    before = res.residual if np.isfinite(res.residual) else np.inf
    if merged is None or not (np.isfinite(merged.residual) and merged.residual < before):
        return None
    # Two unit rows at angle theta have features that differ by about theta in relative RMS
    # (Gaussian inputs), so merging a true pair costs a relative residual below theta. A
    # larger one means the rows are not a resolved pair but a crude estimate: no merge.
    theta = max(math.acos(min(c, 1.0)) for _, _, c in merged.pairs)
    if merged.residual > max(theta, MERGE_MIN_ANGLE):
        return None
    net = merged.network
    need = {(i, j): n for i, j, _, n in pairs}
    named = "; ".join(
        f"units {i} and {j} (recovered rows at cos {c:.5f}; about {need[(i, j)]:.1e} samples would separate them)"
        for i, j, c in merged.pairs
    )
    message = (
        f"{res.message}. Merged near-duplicates: {named}. Returned the effective network with "
        f"{net.n_hidden} of {res.V.shape[0]} units (each pair replaced by one unit fitted to the data), "
        f"relative residual {merged.residual:.2e} (was {res.residual:.2e}); the unmerged result is in "
        "diagnostics['unmerged']"
    )
    diag = dict(
        res.diagnostics,
        merged_pairs=tuple((i, j) for i, j, _ in merged.pairs),
        unmerged={"status": res.status.value, "residual": res.residual, "U": res.U, "V": res.V, "b": res.b, "c": res.c},
    )
    return dataclasses.replace(
        res,
        U=net.U,
        V=net.V,
        b=net.b,
        c=net.c,
        status=Status.APPROXIMATE,
        exact=False,
        residual=merged.residual,
        message=message,
        diagnostics=diag,
    )


#: A unit needs at least this many active samples (times d + 1) before its row is taken
#: as seen: fewer, and the rank test on its active samples decides alone.
UNIT_HEAD_ROWS = 65536


class UnitCheck(NamedTuple):
    """Why each unit of a fit is or is not determined by the samples (:func:`undetermined_units`).

    Attributes
    ----------
    units : tuple of int
        The units the samples cannot determine.
    reasons : dict
        unit -> why (never active, zero contribution, active on samples spanning fewer
        than d dimensions, always active with an output offset in the model).
    active : ndarray
        Active samples per unit (over the samples read: the first UNIT_HEAD_ROWS, or all of
        them for the units the first rows left in doubt).
    """

    units: tuple
    reasons: dict
    active: np.ndarray


def _unit_sums(Xb, V, b, U, units, intercept):
    """Per unit in ``units``: active count, ``||U_i|| ||relu(z_i)||^2`` terms and the Gram
    matrix of its active samples (with a constant column when ``intercept``)."""
    Z = np.asarray(Xb, dtype=np.float64) @ V[units].T + b[units]
    A = Z > 0
    F = np.where(A, Z, 0.0)
    Xa = np.column_stack([Xb, np.ones(len(Xb))]) if intercept else np.asarray(Xb, dtype=np.float64)
    grams = np.stack([Xa[A[:, j]].T @ Xa[A[:, j]] for j in range(len(units))]) if len(units) else np.zeros((0,))
    return {"count": A.sum(axis=0).astype(np.float64), "sq": (F**2).sum(axis=0), "gram": grams}


def _gram_rank(gram, tol=1e-12):
    """Eigenvalues of a Gram matrix above tol times its largest (rounding of the sums
    leaves about 1e-16 in a missing direction)."""
    if gram.size == 0:
        return 0
    ev = np.linalg.eigvalsh(gram)
    return int(np.sum(ev > tol * ev[-1])) if ev[-1] > 0 else 0


def _spans(X, active, need, tol=1e-10, intercept=False):
    """True when the first 2 need rows of X (with a constant column when ``intercept``)
    where ``active`` holds have rank >= need (one small SVD; rows in general position span
    with the first need of them, and False only sends the unit to the exact check over all
    samples)."""
    rows = np.flatnonzero(active)[: 2 * need]
    if len(rows) < need:
        return False
    M = np.column_stack([X[rows], np.ones(len(rows))]) if intercept else X[rows]
    if need >= SPAN_GRAM_MIN:
        # At large d the SVD of each unit's rows dominates the whole fit (21 s for 128
        # units at d = 784). LAPACK's condition estimate of the Gram matrix of need + 16 of
        # the rows (a subset has no larger sigma_min) decides most units at a fraction of
        # its cost: an estimated 1/cond(G) above SPAN_GRAM_RATIO (a singular-value ratio
        # of 1e-4, six orders above tol, beyond the estimate's known underestimation by a
        # small factor) means full rank; anything else goes to the exact SVD.
        if gram_full_rank(M[: need + SPAN_GRAM_EXTRA], SPAN_GRAM_RATIO):
            return True
    s = np.linalg.svd(M, compute_uv=False)
    return bool(s[0] > 0 and np.sum(s > tol * s[0]) >= need)


#: From this many columns :func:`_spans` tries the condition estimate before the SVD.
SPAN_GRAM_MIN = 128
#: Rows beyond ``need`` in the Gram matrix of that estimate (fewer rows only lower sigma_min).
SPAN_GRAM_EXTRA = 16
#: Estimated 1/cond of the Gram matrix above which the estimate decides: 1e-8 is a
#: singular-value ratio of 1e-4, six orders above the rank tolerance.
SPAN_GRAM_RATIO = 1e-8


def _head_activity(Xh, V, b):
    """(A, count, sq) of the head rows: where each unit is active (Z = Xh V^T + b > 0), its
    active count and ``sum relu(Z)^2``; by the row blocks of :func:`relufast._blas.matmul` on
    the method's threads, the sums added in block order (the same bits on any number of
    threads). On the 2-core VM at 65,536 x 200 inputs and 100 units (ad-hoc): 0.09-0.20 s
    as a threaded product then whole-array passes on one thread, 0.05-0.07 s this way."""
    n, k = Xh.shape[0], V.shape[0]
    A = np.empty((n, k), dtype=bool)
    rows, starts = product_blocks(n, Xh.shape[1] * k)

    def part(a):
        Z = Xh[a : a + rows] @ V.T
        Z += b
        Ab = np.greater(Z, 0, out=A[a : a + rows])
        return Ab.sum(axis=0), (np.where(Ab, Z, 0.0) ** 2).sum(axis=0)

    count, sq = add_in_order(thread_map(part, starts) or [(np.zeros(k, dtype=np.int64), np.zeros(k))])
    return A, np.asarray(count, dtype=np.float64), sq


def undetermined_units(
    samples, U, V, b=None, c=None, *, y_norm, threshold, intercept=None, input_rank=None, rank_tol=1e-10
):
    """The units of a fitted network ``Y = relu(X V^T + b) U^T + c`` that the samples cannot
    determine (a necessary condition for identifiability, checked for every method).

    A unit i is undetermined when

    * it is never active on the samples (a dead unit: any row that stays inactive fits),
    * its contribution ``||U_i|| ||relu(X v_i + b_i)||`` is at most ``threshold ||Y||``
      (a zero output column, or a unit the certificate cannot see),
    * its active samples (with a constant coordinate when the model has biases) span fewer
      than d (d + 1) dimensions: the row can move along the missing directions, or
    * the model has an output offset and the unit is active on every sample: the unit is
      linear there, and its bias trades against the offset ``c``.

    ``samples`` is a :class:`relufast.stages.reduce.Samples` (any layout); the first
    UNIT_HEAD_ROWS samples settle most units (cost O(rows k d) and an SVD of 2 (d + 1)
    active rows per unit), and one pass over all samples (a reduction under MPI) decides the
    units they leave in doubt. ``y_norm`` is ||Y||_F over all samples, or a function that
    returns it (asked only when some unit is in doubt: the first rows are judged against
    their own outputs' norm); ``intercept``
    (default: ``c`` given) says whether the model has an offset; ``input_rank`` (default d)
    the rank of X (inputs in a subspace are reported by :mod:`relufast.subspace`);
    ``rank_tol`` the relative singular value below which a direction of the active samples
    is unseen (raised to the rounding floor for float32 outputs).
    """
    V = np.asarray(V, dtype=np.float64)
    k, d = V.shape
    U = np.asarray(U, dtype=np.float64)
    b = np.zeros(k) if b is None else np.asarray(b, dtype=np.float64)
    intercept = c is not None if intercept is None else bool(intercept)
    su = power_of_two_scale(max_abs(U)) if U.size and np.all(np.isfinite(U)) and max_abs(U) > 0 else 1.0
    un = np.linalg.norm(U * su, axis=0) / su  # exact scaling: U of 1e-200 does not underflow
    n = samples.n
    head_n = min(n, UNIT_HEAD_ROWS)
    Xh, Yh = samples.take(np.arange(head_n))
    A, count, sq = _head_activity(Xh, V, b)
    y_head = scaled_norm(Yh)  # the head's own outputs (the same rows on every rank)
    need = (d if input_rank is None else int(input_rank)) + int(intercept)
    weak = {
        i for i in range(k) if un[i] * math.sqrt(sq[i]) <= 4 * threshold * y_head or (intercept and count[i] == head_n)
    }
    rest = [i for i in range(k) if i not in weak]
    # k rank tests of 2 (d + 1) rows each, one unit a task on the method's threads (each on
    # one BLAS thread: a threaded BLAS only spins on matrices this small, 10x slower here).
    spans = thread_map(lambda i: _spans(Xh, A[:, i], need, rank_tol, intercept), rest)
    doubt = sorted(weak | {i for i, ok in zip(rest, spans) if not ok})
    grams = {i: np.zeros((d + int(intercept),) * 2) for i in doubt}
    if doubt:
        units = np.array(doubt)
        if n > head_n:
            full = samples.map_reduce(lambda Xb, _Yb: _unit_sums(Xb, V, b, U, units, intercept))
        else:
            full = _unit_sums(Xh, V, b, U, units, intercept)
        for j, i in enumerate(doubt):
            count[i], sq[i], grams[i] = full["count"][j], full["sq"][j], full["gram"][j]
    if doubt and callable(y_norm):
        y_norm = float(y_norm())
    reasons = {}
    for i in doubt:
        contribution = un[i] * math.sqrt(sq[i])
        if count[i] == 0:
            reasons[i] = "never active on the samples"
        elif not (contribution > threshold * y_norm):
            reasons[i] = f"its contribution to the outputs is {contribution / max(y_norm, 1e-300):.1e} of ||Y||"
        elif _gram_rank(grams[i], max(1e-12, rank_tol**2)) < need:
            reasons[i] = f"its {int(count[i])} active samples span fewer than {need} dimensions"
        elif intercept and count[i] == n:
            reasons[i] = "active on every sample, so its bias trades against the output offset c"
    return UnitCheck(tuple(sorted(reasons)), reasons, count)


def undetermined_message(check) -> str:
    """The message naming the undetermined units of a :class:`UnitCheck` (empty if none)."""
    if not check.units:
        return ""
    why = "; ".join(f"unit {i}: {check.reasons[i]}" for i in check.units)
    return (
        f"the samples do not determine {len(check.units)} hidden unit(s) ({why}): the fit is not "
        "unique, those units are listed in result.undetermined_units"
    )
