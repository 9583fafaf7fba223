"""The hyperplane of a critical point from the change of the local linear map across it.

On the two sides of a kink x* of a ReLU network the model is affine, with Jacobians J- and
J+ (m, d). A single unit switches at x*, so ``J+ - J- = a n^T`` has rank one ([CJM20]
Sec. 4.3, [RK20] Sec. 3): n is the normal of the unit's boundary at x*, and the boundary is
``{x : n.(x - x*) = 0}`` in the linear region of x*. J+ and J- are read by forward
differences from one point on each side, d + 1 queries a side for all m outputs at once
(r + 1 behind a known layer of r < d units, whose gradients span every later gradient;
fewer at a kink where only some of them are active, :class:`Spans`); all kinks of a batch
go in one model call. In exact arithmetic a piecewise-linear function
has exact forward differences, so the step is as large as the region allows (set by the
output precision, :meth:`Oracle.fd_fraction`), and the result is checked against the
slope jump measured on the line.

References
----------
.. [CJM20] N. Carlini, M. Jagielski, I. Mironov, "Cryptanalytic Extraction of Neural Network
   Models", CRYPTO 2020.
.. [RK20] D. Rolnick, K. Kording, "Reverse-Engineering Deep ReLU Networks", ICML 2020.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from .._blas import thread_map
from .nullspace import svd

__all__ = ["Normals", "Spans", "jump_normals"]


class Normals(NamedTuple):
    """Local boundaries at kinks (only those that passed the checks).

    Attributes
    ----------
    keep : ndarray of int
        Indices (into the kinks given) of the kinks kept.
    x : ndarray of shape (K, d)
    n : ndarray of shape (K, d)
        Unit normals (sign arbitrary).
    error : ndarray of shape (K,)
        Relative mismatch of the jump with the slope jump on the line.
    """

    keep: np.ndarray
    x: np.ndarray
    n: np.ndarray
    error: np.ndarray


class Spans(NamedTuple):
    """Subspaces that hold the model's gradient on both sides of each kink, of a dimension
    that varies from kink to kink (behind a known layer: the gradients of its units active
    there, :func:`.walk.downstream_basis`).

    Attributes
    ----------
    dims : callable
        Kink points (c, d) -> (c,) int, each kink's subspace dimension.
    basis : callable
        ``basis(x, r)`` -> (c, d, r) orthonormal columns whose first ``dims(x)`` span each
        kink's subspace (r >= dims(x); the others any orthonormal completion).
    layers : list of (W, b) or None
        The known layers whose boundaries these kinks lie behind (computed: the boxes of
        the low-precision affine fits are kept inside their regions, :func:`_affine_normals`).
    """

    dims: Callable
    basis: Callable
    layers: list | None = None


#: Subspace dimensions of kinks measured together are rounded up to a multiple of this (one
#: model call per group; a few wasted queries a kink).
SPAN_STEP = 8


def _shared(B):
    """Whether the bases B (K, d, r) are one basis broadcast to every kink (stride 0)."""
    return B.shape[0] > 1 and B.strides[0] == 0


def _directions(B):
    """The basis vectors as rows, (K, r, d): one contiguous transpose where B is shared
    (a strided transpose per kink reads Q column by column; the function that built these
    points took 24 s of a profile of a float32 784-64-64-10)."""
    if _shared(B):
        return np.broadcast_to(np.ascontiguousarray(B[0].T), (B.shape[0], B.shape[2], B.shape[1]))
    return np.swapaxes(B, 1, 2)


def _to_inputs(B, X):
    """``einsum("kir,krm->kmi", B, X)``: derivatives along the bases' columns taken back to
    input coordinates, (K, m, d), by BLAS (one GEMM where the basis is shared; the einsum's
    loops took 37 s of a float32 784-64-64-10)."""
    K, r, m = X.shape
    if _shared(B):
        return (B[0] @ X.transpose(1, 0, 2).reshape(r, K * m)).reshape(-1, K, m).transpose(1, 2, 0)
    return np.swapaxes(B @ X, 1, 2)


def _by_span(oracle, kinks, rng, spans):
    """:func:`jump_normals` with kinks grouped by their subspace dimension (rounded up to
    SPAN_STEP): r + 1 queries a side for a kink whose gradients span r dimensions."""
    r_of = SPAN_STEP * np.ceil(np.maximum(spans.dims(kinks.x), 1) / SPAN_STEP).astype(int)
    parts = []
    for r in np.unique(r_of):
        idx = np.nonzero(r_of == r)[0]
        nrm = jump_normals(oracle, kinks.subset(idx), rng, lambda x, r=int(r): spans.basis(x, r), spans.layers)
        parts.append(nrm._replace(keep=idx[nrm.keep]))
    keep = np.concatenate([p.keep for p in parts])
    order = np.argsort(keep, kind="stable")
    return Normals(keep[order], *(np.concatenate([getattr(p, f) for p in parts])[order] for f in ("x", "n", "error")))


def jump_normals(oracle, kinks, rng, basis=None, layers=None):
    """Normals of the kinks from one-sided Jacobians (one model call per batch of kinks).

    A kink is kept when the jump has rank one (m > 1) and reproduces the slope jump on its
    line to the finite-difference accuracy of the output precision; otherwise two units
    switched in one grid cell, or the step left the region, and the kink is dropped.

    ``basis``: None (derivatives along d random orthonormal directions), or a function of
    kink points (c, d) returning orthonormal bases (c, d, r) of a subspace that holds the
    model's gradient on both sides of each kink: behind a known layer of r < d units every
    gradient is a combination of those units' gradients (:func:`.walk.downstream_basis`),
    and r + 1 queries a side suffice instead of d + 1; or :class:`Spans` (a dimension per
    kink, kinks measured in groups of equal dimension).
    """
    K = len(kinks.t)
    d = kinks.x.shape[1] if K else oracle.d
    if K == 0:
        return Normals(np.zeros(0, int), np.zeros((0, d)), np.zeros((0, d)), np.zeros(0))
    if isinstance(basis, Spans):
        return _by_span(oracle, kinks, rng, basis)
    if basis is None:
        Q = np.linalg.qr(rng.standard_normal((d, d)))[0]
        basis = lambda x: np.broadcast_to(Q, (len(x), d, d))  # noqa: E731
    side = kinks.step * kinks.u  # one grid step along the line: linear up to there
    if layers is not None and oracle.low_precision:
        # Drawn in to AFFINE_CLEAR of the room along the line before a known boundary (a
        # step beyond it measures another region's map), to SIDE_FLOOR of a step at least.
        room = np.minimum(_crossing(layers, kinks.x, side), _crossing(layers, kinks.x, -side))
        side = side * np.clip(AFFINE_CLEAR * room, SIDE_FLOOR, 1.0)[:, None]
    h = oracle.fd_fraction() * np.linalg.norm(side, axis=1)
    r = basis(kinks.x[:1]).shape[2]
    chunk = max(1, int(FD_BATCH_BYTES // (2 * (r + 1) * d * 8)))  # kinks per model call

    def part(lo):
        """The kinks from lo: one model call; (kept or not, the slope jumps' errors and the
        finite differences' predicted ones, top right singular vectors of the kept, and at
        low precision their bases for the refinements below)."""
        sl = slice(lo, min(K, lo + chunk))
        B = _bases(basis, kinks.x[sl]) if K <= chunk else basis(kinks.x[sl])  # (c, d, r); one batch: in pieces
        c = B.shape[0]
        P = np.empty((c, 2 * (r + 1), d))  # (c, 2 (r + 1), d): each side's point, then its steps
        for i, sgn in enumerate((-1.0, 1.0)):
            _stencil(kinks.x[sl] + sgn * side[sl], h[sl, None, None], B, P[:, i * (r + 1) : (i + 1) * (r + 1)])
        Y = oracle(P.reshape(-1, d)).reshape(c, 2 * (r + 1), -1)
        Jm = (Y[:, 1 : r + 1] - Y[:, :1]) / h[sl, None, None]  # (c, r, m): derivatives along B
        Jp = (Y[:, r + 2 :] - Y[:, r + 1 : r + 2]) / h[sl, None, None]
        jump = _to_inputs(B, Jp - Jm)  # (c, m, d): J+ - J-
        _, s, Vt = svd(jump, full_matrices=False)
        along = np.einsum("kmd,kd->km", jump, kinks.u[sl])
        ref = np.maximum(np.linalg.norm(kinks.slope_jump[sl], axis=1), 1e-300)
        err = np.linalg.norm(along - kinks.slope_jump[sl], axis=1) / ref
        err = np.where(np.isnan(err), 0.0, err)  # kinks measured again off their lines: no slope to check
        fd_err = 8.0 * oracle.eps * np.abs(Y).max(axis=(1, 2)) / h[sl] / np.maximum(s[:, 0], 1e-300)
        tol = np.maximum(64.0 * fd_err * np.sqrt(r), 1e-7)
        rank1 = s[:, 1] <= tol * s[:, 0] if s.shape[1] > 1 else np.ones(c, dtype=bool)
        ok = (err <= tol) & rank1 & (s[:, 0] > 0)
        kept = B[ok] if oracle.low_precision and B.strides[0] != 0 else None  # (stride 0: one basis for all)
        return ok, err, fd_err, Vt[ok, 0, :], kept

    # The batches side by side on the method's threads (one model call at a time; the same
    # batches, so the same answers, on any number of threads).
    parts = thread_map(part, range(0, K, chunk))
    ok, err, fd_err, n = (np.concatenate([p[i] for p in parts]) for i in range(4))
    keep = np.nonzero(ok)[0]
    if oracle.low_precision and len(keep):
        # Each kept kink's basis as measured above (None: one basis shared by all), not
        # computed again (a QR or an SVD a kink: 16 s of a trained float32 784-128-128-10).
        B = None if parts[0][4] is None else np.concatenate([p[4] for p in parts])
        # The wider stencil only where the first estimate can pass its agreement test: its
        # predicted error fd_err sqrt(r) within REFINE_REACH (float32 first layers at d = 784
        # had 0 of 575 kinks refined, at 1,570 queries each: bench/test_bench_trained.py's
        # 784-64-64-10 and a planted 784-32-1, ad-hoc runs).
        near = np.nonzero(fd_err[keep] * np.sqrt(r) <= REFINE_REACH)[0]
        if len(near):
            n[near] = _refine(oracle, kinks.x[keep][near], n[near], basis, None if B is None else B[near])
        n = _affine_refine(oracle, kinks.x[keep], n, rng, basis, layers, B)
    return Normals(keep, kinks.x[keep], n, err[keep])


#: Memory of one batch of finite-difference queries (bytes of float64 inputs): at d = 3072
#: all kinks at once took 5 GB.
FD_BATCH_BYTES = 64 * 2**20
#: Pieces in which the kinks' bases (a QR or an SVD a kink) are computed side by side.
BASIS_PARTS = 4


#: Distance of that pass from the boundary, and its step (inputs of unit scale); the largest
#: predicted error of a first estimate it is run on (where its kinks were refined, the first
#: estimates' predicted errors were 0.002-0.03: planted float32 20-10-10-10 and 64-32-32-10,
#: ad-hoc runs).
REFINE_OFFSET, REFINE_STEP, REFINE_REACH = 0.02, 0.01, 0.03


def _stencil(x, h, B, out):
    """Forward-difference points into ``out`` (c, r + 1, d): each point x (c, d), then x plus
    h times each column of its basis B (c, d, r); the step written first and the point
    added in place (the numbers of ``x + h B^T``, without a temporary of the block's size)."""
    out[:, 0] = x
    np.multiply(h, _directions(B), out=out[:, 1:])
    out[:, 1:] += x[:, None, :]
    return out


def _jacobians(oracle, P, B, h):
    """Jacobians (K, m, d) at points P (K, d) from forward differences along the columns of
    the bases B (K, d, r)."""
    K, d = P.shape
    r = B.shape[2]
    pts = _stencil(P, h, B, np.empty((K, r + 1, d)))
    Y = oracle(pts.reshape(-1, d)).reshape(K, r + 1, -1)
    return _to_inputs(B, (Y[:, 1:] - Y[:, :1]) / h)


def _refine(oracle, x, n, basis, B=None):
    """Low-precision outputs: the jump measured again at REFINE_OFFSET on both sides along
    the first estimate of the normal, with the wider step REFINE_STEP (the rounding error of
    a difference is eps |f| / step). Kept where it agrees with the first estimate to the
    accuracy of that estimate (a wider stencil that crossed another boundary does not).
    ``B``: the kinks' bases where known (else from ``basis``)."""
    K, d = x.shape
    P = np.concatenate([x + REFINE_OFFSET * n, x - REFINE_OFFSET * n])
    B = _bases(basis, x) if B is None else B
    B = np.broadcast_to(B[0], (2 * K, *B.shape[1:])) if _shared(B) else np.concatenate([B, B])
    J = _jacobians(oracle, P, B, REFINE_STEP)
    _, _, Vt = svd(J[:K] - J[K:], full_matrices=False)
    n2 = Vt[:, 0, :] * np.sign(np.einsum("kd,kd->k", Vt[:, 0, :], n))[:, None]
    agree = np.linalg.norm(n2 - n, axis=1) <= oracle.normal_tol()
    return np.where(agree[:, None], n2, n)


#: Affine least-squares pass (low precision): box centres at AFFINE_OFFSET from the boundary
#: with half-width AFFINE_OFFSET / 2, tried at each offset in turn (the last one also for
#: the kinks no box fitted, measured again along the normal of the fit, see
#: :func:`_affine_refine`); points per box; the
#: largest rms residual of a fit in units of eps * max |output| (a box that crossed another
#: boundary fits far worse); the largest distance to the first estimate (other units'
#: normals are O(1) away, the first estimate can be 1e-2 off for a small jump).
AFFINE_OFFSETS, AFFINE_POINTS, AFFINE_RESIDUAL, AFFINE_AGREE = (0.05, 0.02, 0.008), 64, 4.0, 0.1
#: Inputs above which the widest boxes (the first offset) are not asked: boundaries are
#: dense there. In the second layer of a trained float32 784-128-128-10 (random state 0,
#: ad-hoc count) 18% of the boxes at 0.05 held (39% at 0.02, 49% at 0.008) and 3.5% agreed
#: with the first estimate (615,000 queries for 77 normals); without them it was exact in
#: 11.7 and 11.1 million queries at random states 0 and 1 instead of 13.3 and 13.0 (83
#: rounds of its search instead of 133 at 0). In small networks they hold more often (64%
#: in a planted float32 64-32-32-10, 71% in an 8-6-5-1, which ran out of its 2 million
#: queries without them at random state 0).
WIDE_DIMS = 100
#: Largest difference of two affine normals measured one after the other (the second from
#: boxes along the first) for the second to be taken without a first estimate to agree with.
AFFINE_SELF = 0.01


def _bases(basis, x):
    """``basis(x)`` in BASIS_PARTS pieces on the method's threads (a QR or an SVD a kink;
    each kink's basis its own, so the same numbers)."""
    if len(x) == 0:
        return basis(x)
    c = -(-len(x) // BASIS_PARTS)
    parts = thread_map(lambda lo: basis(x[lo : lo + c]), range(0, len(x), c))
    if len(parts) == 1:
        return parts[0]
    if _shared(parts[0]):
        return np.broadcast_to(parts[0][0], (len(x), *parts[0].shape[1:]))
    return np.concatenate(parts)


def _affine_refine(oracle, x, n, rng, basis, layers=None, B_all=None):
    """Low-precision outputs: the affine map on each side fitted by least squares on
    AFFINE_POINTS points spread over a box of the linear region (the network is piecewise
    linear, so the fit averages the rounding of the outputs away, [CJM20] Sec. 4.3); the
    normal is the top right singular vector of the jump. Kept where both fits stay in one
    region (rms residual at the rounding level) and agree with the first estimate; behind
    known ``layers``, where they hold but disagree, where a second fit from boxes along
    their own normal agrees with it (the first estimate too coarse to judge by).

    With the known ``layers`` given, each kink's offset is at most AFFINE_CLEAR of the
    distance along its normal to the nearest known boundary, and each box point is drawn in
    towards its centre until no known boundary lies between them (a rarely active unit's
    kinks lie within 0.005-0.04 of other boundaries: a trained float32 784-64-64-10, whose
    boxes of 0.008 and more crossed them and left normals 0.1-0.3 off)."""
    done = np.zeros(len(x), dtype=bool)
    n = n.copy()
    r = (basis(x[:1]) if B_all is None else B_all).shape[2]
    if _box_points(r, x.shape[1]) <= r + 1:
        # Fewer box points than unknowns (a first layer at d >= 64: 64 points for d + 1
        # unknowns): the fits interpolate any answers, the normal is noise, none is ever
        # taken (0 of 1,608 at d = 784, bench/test_bench_trained.py's 784-64-64-10, an
        # ad-hoc run), so no queries are spent on it.
        return n
    # The kinks' bases once (a QR or an SVD a kink behind a known layer; ``B_all`` where the
    # caller has them), each fit below taking its rows.
    B_all = _bases(basis, x) if B_all is None else B_all

    def bases(idx):
        return np.broadcast_to(B_all[0], (len(idx), *B_all.shape[1:])) if _shared(B_all) else B_all[idx]

    cap = np.full(len(x), np.inf) if layers is None else AFFINE_CLEAR * _clearance(layers, x, n)
    last = np.full(len(x), np.inf)
    # With the known layers given, a fit that holds but disagrees with the first estimate
    # ends the kink's offsets: the estimate is too coarse to judge by (below), and smaller
    # boxes along it measured the same normal again (entry-line kinks of a trained float32
    # 784-128-128-10: 3,299 of 4,344 fits that held disagreed, median 0.17 off, and then
    # were measured again from scratch: 1.1 of its 16 million queries, an ad-hoc count).
    held = np.zeros(len(x), dtype=bool)
    n_held = np.zeros_like(n)
    offsets = AFFINE_OFFSETS[1:] if x.shape[1] > WIDE_DIMS else AFFINE_OFFSETS
    for off in offsets:
        offs = np.minimum(off, cap)
        todo = np.nonzero(~done & ~held & (offs < AFFINE_AGAIN * last) & (offs > 0))[0]
        if len(todo) == 0:
            continue
        n2, ok, fit = _affine_normals(oracle, x[todo], n[todo], offs[todo], rng, bases(todo), layers)
        n[todo[ok]] = n2[ok]
        done[todo[ok]] = True
        last[todo] = offs[todo]
        if layers is not None:
            n_held[todo[fit & ~ok]] = n2[fit & ~ok]
            held[todo[fit & ~ok]] = True
    if layers is None:
        return n
    # A first estimate too coarse to judge by (a weak unit's kinks on a trained float32
    # 784-64-64-10: boxes along estimates 0.13-1.5 rad off gave normals 3e-4 to 2e-3 off,
    # refused for disagreeing with them): the normal of fits that hold (kept above, or
    # measured now where none held), measured again from boxes along it, taken where the two
    # agree within AFFINE_SELF.
    offs = np.minimum(AFFINE_OFFSETS[-1], cap)
    todo = np.nonzero(~done & ~held & (cap > 0))[0]
    if len(todo):
        n2, ok, _ = _affine_normals(oracle, x[todo], n[todo], offs[todo], rng, bases(todo), layers, agree=np.inf)
        n_held[todo[ok]] = n2[ok]
        held[todo[ok]] = True
    todo = np.nonzero(held)[0]  # (a kink held is never done, and its room is positive)
    if len(todo):
        n3, ok, _ = _affine_normals(
            oracle, x[todo], n_held[todo], offs[todo], rng, bases(todo), layers, agree=AFFINE_SELF
        )
        n[todo[ok]] = n3[ok]
    return n


#: Least share of a grid step kept between a kink and its finite-difference points.
SIDE_FLOOR = 1 / 16

#: Share of the distance to the nearest known boundary (along the normal) that a box's
#: offset may reach, and of the distance to a known boundary that a box point may; an
#: offset is tried again only when it is below AFFINE_AGAIN times the last one tried.
AFFINE_CLEAR, AFFINE_AGAIN = 0.4, 0.8


def _box_points(r, d):
    """Points of each box of an affine fit in r of d dimensions (twice the unknowns in a
    subspace; AFFINE_POINTS in the whole space)."""
    return max(AFFINE_POINTS, 2 * (r + 1)) if r < d else AFFINE_POINTS


def _crossing(layers, X, D):
    """Per row, the smallest s > 0 at which a unit of ``layers`` changes sign on X + s D
    (pre-activations linear in s up to the first switch; inf where none does)."""
    H, dH = X, D
    s = np.full(len(X), np.inf)
    for W, b in layers:
        z, dz = H @ W.T + b, dH @ W.T
        s = np.minimum(s, _first_switch(z, dz))
        H, dH = np.maximum(z, 0.0), dz * (z > 0)
    return s


def _first_switch(z, dz):
    """The smallest t > 0 with ``z + t dz = 0`` along the last axis (inf where none)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t = -z / dz
    return np.where(t > 0, t, np.inf).min(axis=-1)


def _clearance(layers, x, n):
    """Distance from each kink along both signs of its normal to the nearest known boundary."""
    return np.minimum(_crossing(layers, x, n), _crossing(layers, x, -n))


def _crossing_fan(layers, X0, C, R):
    """Per point X0[i] (K, d) and direction ``C[i] @ R[i]`` (C (K, M, r), R (K, r, d)), the
    smallest s > 0 at which a unit of ``layers`` changes sign on ``X0[i] + s C[i, j] R[i]``
    (pre-activations linear in s up to the first switch; inf where none does): (K, M). The
    pre-activations at X0 once a point, and the first layer's along the directions from
    ``R W^T`` (r of them a point, not M; one product where R is one basis broadcast)."""
    s = np.full(C.shape[:2], np.inf)
    H, dH = X0, None
    for W, b in layers:
        z = H @ W.T + b  # (K, k)
        if dH is None:
            RW = np.broadcast_to(R[0] @ W.T, (len(R), R.shape[1], W.shape[0])) if _shared(R) else R @ W.T
            dz = C @ RW  # (K, M, k)
        else:
            dz = dH @ W.T
        s = np.minimum(s, _first_switch(z[:, None, :], dz))
        on = z > 0
        H, dH = np.maximum(z, 0.0), dz * on[:, None, :]
    return s


def _box_fit(C, Y):
    """Least-squares affine fits ``Y ~ [C, 1] coef`` of each box (C (K, M, r), Y (K, M, m)):
    (coef (K, r + 1, m), the design [C, 1]). By QR with the coordinates scaled to unit
    spread (the pseudo-inverse's batched SVD took 66 of 1,940 samples of a profile of the
    trained float32 784-64-64-10, ad-hoc); a box whose factor is near singular (points
    drawn in to its centre) by the pseudo-inverse."""
    A = np.concatenate([C, np.ones((*C.shape[:2], 1))], axis=2)
    scale = np.maximum(np.sqrt(np.mean(A**2, axis=1)), 1e-300)  # (K, r + 1)
    Q, R = np.linalg.qr(A / scale[:, None, :])
    diag = np.abs(np.diagonal(R, axis1=1, axis2=2))
    good = diag.min(axis=1) > BOX_RCOND * diag.max(axis=1)
    coef = np.empty((A.shape[0], A.shape[2], Y.shape[2]))
    if good.any():
        coef[good] = np.linalg.solve(R[good], np.swapaxes(Q[good], 1, 2) @ Y[good]) / scale[good][:, :, None]
    if not good.all():
        coef[~good] = np.linalg.pinv(A[~good]) @ Y[~good]
    return coef, A


#: Smallest ratio of a box fit's triangular factor's diagonal (coordinates scaled) for the
#: QR solve; below it the pseudo-inverse.
BOX_RCOND = 1e-6


def _affine_normals(oracle, x, n, off, rng, B, layers=None, agree=None):
    """Normals from affine fits in boxes at ``off`` (per kink) on both sides, and where they
    hold (the boxes lie in the subspaces of the bases B (K, d, r), whose coordinates are the
    unknowns; with ``layers``, each point drawn in to stay clear of their boundaries) and
    agree with n within ``agree`` (default AFFINE_AGREE): (normals, kept, fits held)."""
    K, d = x.shape
    r = B.shape[2]
    M = _box_points(r, d)
    off = np.broadcast_to(np.asarray(off, dtype=np.float64), (K,))
    # The boxes' coordinates first, a side after the other (the same draws however the kinks
    # are split below); then the kinks by batches of FD_BATCH_BYTES of queries a side, each
    # side of each batch a piece on the method's threads (one model call a piece, one at a
    # time: the same calls on any number of threads; a call of a few kinks is one batch, its
    # two sides side by side).
    Cs = [0.5 * off[:, None, None] * rng.uniform(-1.0, 1.0, (K, M, r)) for _ in range(2)]
    chunk = max(1, int(FD_BATCH_BYTES // (M * d * 8)))

    def side(piece):
        """One side of the kinks from lo: their Jacobians (c, m, d) along the box fits, and
        whether the fits held."""
        lo, i = piece
        sl = slice(lo, min(K, lo + chunk))
        R = _directions(B[sl])  # (c, r, d)
        C = Cs[i][sl]
        centre = x[sl] + (1.0, -1.0)[i] * off[sl, None] * n[sl]
        if layers is not None:  # each point drawn in to AFFINE_CLEAR of its room
            s = _crossing_fan(layers, centre, C, R)
            C = C * np.minimum(1.0, AFFINE_CLEAR * s)[:, :, None]
        P = C @ R
        P += centre[:, None, :]  # the numbers of centre + C R, without a temporary
        Y = oracle(P.reshape(-1, d)).reshape(len(C), M, -1)
        coef, A = _box_fit(C, Y)  # (c, r + 1, m)
        rms = np.sqrt(np.mean((A @ coef - Y) ** 2, axis=(1, 2)))
        ok = rms <= AFFINE_RESIDUAL * oracle.eps * np.abs(Y).max(axis=(1, 2))
        return _to_inputs(B[sl], coef[:, :r]), ok

    sides = thread_map(side, [(lo, i) for lo in range(0, K, chunk) for i in (0, 1)])
    J = [np.concatenate([p[0] for p in sides[i::2]]) for i in (0, 1)]
    ok = np.concatenate([a[1] & b[1] for a, b in zip(sides[::2], sides[1::2])])
    n2 = svd(J[0] - J[1], full_matrices=False)[2][:, 0, :]
    n2 *= np.sign(np.einsum("kd,kd->k", n2, n))[:, None]
    return n2, ok & (np.linalg.norm(n2 - n, axis=1) <= (AFFINE_AGREE if agree is None else agree)), ok
