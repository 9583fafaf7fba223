"""Exact hyperplanes of a layer through precisely located kinks (after [CJM20] Sec. 4.2).

With layers 1..l final, every unit j of layer l+1 switches where
``z_j = v_j . h_l(x) + c_j`` vanishes: a hyperplane in the space of ``h_l`` (the inputs
for the first layer). Its estimate from finite differences (:mod:`.hyperplanes`, :mod:`.deep`)
is accurate to ~1e-7; the hyperplane through kinks located where the two affine pieces of
the model meet on short segments across the boundary is exact to the rounding of the
outputs in float64, and far below the rounding of a single output at low precision (each
piece is fitted to REFIT_SAMPLES_LOW outputs). On each of about ``5 k_l / 4`` segments per
unit (points on the estimated boundary, segments along the gradient of z_j):

1. the model is queried at S points on each side, away from the predicted kink;
2. segments on which a known boundary (layers 1..l+1, computed, no query) lies are
   dropped, and so are those whose sides do not fit a line (a boundary not known yet) or
   whose slope jump is lost in the rounding (no active path after the unit there);
3. the kink is where the two fitted lines meet, and ``h_l`` there is computed exactly;
4. ``(v_j, c_j)`` by least squares on ``v . h_l(p) + c = 0`` near the estimate (normal
   equations, again without the points far off the first fit); the row is replaced when
   is near the estimate and its kinks fit it to the rounding of the outputs.

Queries: ``6 (5 k_l / 4 + 32)`` a unit in float64, about 7.5 per weight; memory is batched
(REFIT_BATCH_BYTES), so it does not grow with the width of the layer.

References
----------
.. [CJM20] N. Carlini, M. Jagielski, I. Mironov, "Cryptanalytic Extraction of Neural Network
   Models", CRYPTO 2020.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from .._blas import thread_map
from .._validation import NonFiniteOutputs
from .lines import line_points
from .net import activation_pattern, pre_activations, pull_back

__all__ = ["anchored_rows", "refit_layer"]

#: Segments per unit beyond 5/4 of the fan-in; half-length of a segment (input space);
#: largest rms residual of a side's affine fit in units of eps * max |output| (averaged
#: over REFIT_SAMPLES_LOW samples at low precision; three samples in float64, whose
#: forward passes round at up to ~10 eps * max |output| where units cancel, while a
#: boundary crossed inside a side gives hundreds); samples per side (low precision,
#: float64, float64 in the last hidden layer: no unknown boundary of a later layer can
#: cross its segments, whose known boundaries the patterns check, so two samples make a side).
REFIT_EXTRA, REFIT_HALF = 32, 0.02
REFIT_RESIDUAL_LOW, REFIT_RESIDUAL_DOUBLE = 4.0, 64.0
REFIT_SAMPLES_LOW, REFIT_SAMPLES_DOUBLE, REFIT_SAMPLES_LAST = 16, 3, 2
#: Samples a side at low precision in the last hidden layer: there too no unknown boundary
#: crosses a segment, so the samples only average the rounding away (the kink's place to
#: sqrt(2) of its error with 16, which the plane fit's hundreds of kinks average again).
REFIT_SAMPLES_LOW_LAST = 8
#: Slope jump over a half segment (units of the residual bar) a refit segment's kink needs;
#: in the last hidden layer at low precision, where the plane fit's many kinks average
#: their places (the first layer's passes take COARSE_DETECT, 64).
REFIT_DETECT, REFIT_DETECT_LOW_LAST = 1e3, 250.0
#: Innermost sample of a side, as a fraction of REFIT_HALF (float64; low precision).
REFIT_INNER_DOUBLE, REFIT_INNER_LOW = 1 / 64, 1 / 8
#: Low precision: a side's rms residual may be NOISE_SPREAD times the median over the
#: segments of a batch (at least NOISE_MIN_SEGMENTS of them), where that is above the fixed bar.
NOISE_SPREAD, NOISE_MIN_SEGMENTS = 4.0, 16
#: Memory of one batch of refit queries (bytes of float64 inputs).
REFIT_BATCH_BYTES = 64 * 2**20
#: Scales of the random points brought onto a boundary; and of more points for a deeper
#: row whose kinks never saw some unit of the layer before active (10-15-15-3: one
#: coordinate left at its 1e-8 estimate missed the model by 1e-13 at scale 100).
BOUNDARY_SCALES, FAR_SCALES = (1.0, 2.0, 4.0), (8.0, 32.0, 128.0)
#: A unit with too few clean segments but at least SPARSE_MIN of them clean gets SPARSE_MORE
#: times the segments again at SPARSE_SCALES (a unit with none is not visible at all there).
SPARSE_MIN, SPARSE_MORE, SPARSE_SCALES = 0.05, 3.0, (1.0, 2.0, 4.0, 8.0, 16.0)
#: Segments asked per clean kink still wanted (over the clean fraction last seen).
SPARSE_SLACK = 1.25
#: Newton steps that bring a random point onto a unit's estimated boundary (computed).
BOUNDARY_STEPS = 6


def _boundary_points(known, layer, j, n, d, rng, scales=None):
    """``n`` points on the estimated boundary of unit j of ``layer`` (after ``known``) and
    the unit gradient of z_j there: Newton steps along the gradient (exact in one step
    within a linear region) from Gaussian points at scales 1, 2 and 4 (deeper units meet
    more activation patterns of the layers before), points that do not settle dropped."""
    X = rng.standard_normal((n, d)) * rng.choice(scales or BOUNDARY_SCALES, size=n)[:, None]
    W, b = layer
    lj = (W[j : j + 1], b[j : j + 1])
    g = None
    for _ in range(BOUNDARY_STEPS if known else 2):  # a first-layer z is affine: one step and a polish
        Z, _ = pre_activations([*known, lj], X)
        g = _unit_gradient(known, W[j], Z)
        gg = np.einsum("nd,nd->n", g, g)
        live = gg > 1e-24
        X, g, z, gg = X[live], g[live], Z[-1][live, 0], gg[live]
        X = X - (z / gg)[:, None] * g
    Z, _ = pre_activations([*known, lj], X)
    z = np.abs(Z[-1][:, 0])
    settled = z <= 1e-12 * (1.0 + np.abs(X).max(axis=1))
    g = g[settled]
    return X[settled], g / np.linalg.norm(g, axis=1, keepdims=True)


def _unit_gradient(known, w, Z):
    """Gradient in x of ``w . h_l + c`` at the points whose pre-activations of the known
    layers are Z (a row vector pushed back through the active units: n sum k_l k_(l-1)
    flops, no Jacobian matrices)."""
    n = len(Z[0]) if Z else 0
    return np.ascontiguousarray(pull_back(known, np.broadcast_to(w, (n, len(w))), Z))


def _segment_kinks(oracle, known, layer, j, X0, G, S, half=REFIT_HALF, coarse=False, pilot=0, detect=REFIT_DETECT):
    """Kinks of the model on the segments ``X0 + t G`` (|t| <= REFIT_HALF); returns the
    kinks (P, d) and a mask of the usable ones. ``coarse``: S evenly spaced samples a side
    from ``half / 8`` and a kink anywhere within ``half / 8`` of X0 (the passes of
    :func:`anchored_rows`, whose estimates are off by up to that). ``pilot``: the first
    ``pilot`` segments are asked alone and, where under COARSE_PILOT_MIN of them are usable
    (judged on their own), the rest are not asked and none is usable; otherwise the rest
    are asked and all judged together, as in one batch. Without ``coarse`` only the segments
    that no known boundary crosses are asked (the others are returned unusable). ``detect``:
    the slope jump over a half segment, in units of the residual bar, that locates a kink."""
    P, d = X0.shape
    # The innermost sample close to the kink: a boundary of a later layer between the kink
    # and it leaves both sides linear but misplaces their meeting point (an outlier of the
    # plane fit); closer in, fewer do. Low precision keeps 1/8 (estimates are ~1e-3 off).
    low = oracle.low_precision
    inner = REFIT_INNER_LOW if low else REFIT_INNER_DOUBLE
    side = np.linspace(half / 8, half, S)
    if S == REFIT_SAMPLES_LAST:  # a line through two points: the innermost and the farthest
        side = np.array([half * inner, half])
    elif inner < 1 / 8:
        side = np.concatenate([[half * inner], np.linspace(half / 8, half, S - 1)])
    t = np.concatenate([-side[::-1], side])
    if len(G) > 1 and G.strides[0] == 0:  # one direction for every segment (anchored passes)
        X = X0[:, None, :] + (t[:, None] * G[0])[None]  # the same numbers, without a (P, 2S, d) temporary
    else:
        X = line_points(X0, t, G)
    # Known boundaries (every unit but j) must not cross the segment: one pattern a side.
    others = np.ones(sum(W.shape[0] for W, _ in [*known, layer]), dtype=bool)
    others[sum(W.shape[0] for W, _ in known) + j] = False
    # The first layer's z is affine on the segment, z(X0) + t z(G) (one product of X0 with
    # the layer, G's once where it is one row), whatever follows it. Alone, its two ends
    # tell; deeper, the later layers' patterns are checked at every sample, from the first
    # layer's z there (not a product with every sample: the patterns took 7% of a float32
    # 784-128-128-10's run, about as much as the model's own products).
    W1, b1 = (known or [layer])[0]
    Z0 = X0 @ W1.T + b1
    ZG = G[:1] @ W1.T if len(G) > 1 and G.strides[0] == 0 else G @ W1.T
    if not known:
        pat = (Z0[:, None, :] + np.array([t[0], t[-1]])[None, :, None] * ZG[:, None, :] > 0)[:, :, others]
        pend = np.stack([Z0 - 1e-9 * ZG > 0, Z0 + 1e-9 * ZG > 0])[:, :, others]
        n_lo = 1
    else:
        Z1 = line_points(Z0, t, np.broadcast_to(ZG, Z0.shape)).reshape(-1, W1.shape[0])
        later, _ = pre_activations([*known[1:], layer], np.maximum(Z1, 0.0))
        pat = np.hstack([Z1 > 0, *[z > 0 for z in later]]).reshape(P, X.shape[1], -1)[:, :, others]
        ends = np.concatenate([X0 - 1e-9 * G, X0 + 1e-9 * G])
        pend = activation_pattern([*known, layer], ends)[:, others].reshape(2, P, -1)
        n_lo = S
    clear = (pat[:, :n_lo] == pend[0][:, None]).all(axis=(1, 2)) & (pat[:, n_lo:] == pend[1][:, None]).all(axis=(1, 2))

    def judged(Y, clear):
        """Kink positions t0 and the usable mask of the segments answered Y."""
        P = len(Y)
        A = np.stack([np.ones(S), side], axis=1)
        pinv = np.linalg.pinv(A)
        lo = np.einsum("ij,pjm->pim", pinv, Y[:, :S][:, ::-1])  # fitted in s = -t
        hi = np.einsum("ij,pjm->pim", pinv, Y[:, S:])
        rms_lo = np.sqrt(np.mean((np.einsum("ji,pim->pjm", A, lo) - Y[:, :S][:, ::-1]) ** 2, axis=(1, 2)))
        rms_hi = np.sqrt(np.mean((np.einsum("ji,pim->pjm", A, hi) - Y[:, S:]) ** 2, axis=(1, 2)))
        scale = np.abs(Y).max(axis=(1, 2))
        da = hi[:, 0] - lo[:, 0]  # value at t = 0: a_hi - a_lo
        ds = hi[:, 1] + lo[:, 1]  # slope_hi - slope_lo in t (lo's slope is in -t)
        jump = np.linalg.norm(ds, axis=1)
        t0 = -np.einsum("pm,pm->p", da, ds) / np.maximum(jump**2, 1e-300)
        if coarse:
            noise = COARSE_RESIDUAL * oracle.eps * scale
        else:
            noise = (REFIT_RESIDUAL_LOW if low else REFIT_RESIDUAL_DOUBLE) * oracle.eps * scale
        if low and P >= NOISE_MIN_SEGMENTS:
            # The rounding of a low-precision forward pass is that of its largest terms, which
            # can be a hundred times eps * |output| where the units' contributions cancel (a
            # float32 100-32-1): the rms of the batch's typical side sets the bar.
            typical = float(np.median(np.maximum(rms_lo, rms_hi) / np.maximum(scale, 1e-300)))
            noise = np.maximum(noise, NOISE_SPREAD * typical * scale)
        ok = clear & (rms_lo <= noise) & (rms_hi <= noise) & (jump * half > detect * noise)
        return t0, ok & (np.abs(t0) < half * inner)

    # A layer's refit asks only the segments that no known boundary crosses (the others are
    # never usable: 27% of the last-layer refit's segments of a trained float32
    # 784-128-128-10). The first layer's passes ask them all: at low precision their bar
    # follows the batch's typical side, crossed ones included (asked without them, a planted
    # float32 10-15-15-1 spent its query budget in its second layer; ad-hoc).
    ask = np.arange(P) if coarse else np.nonzero(clear)[0]
    t0, ok = np.zeros(P), np.zeros(P, dtype=bool)
    if len(ask) == 0:
        return X0, ok
    Xa = X if len(ask) == P else X[ask]

    def answers(lo, hi):  # the model at the asked segments lo:hi
        return oracle(Xa[lo:hi].reshape(-1, d)).reshape(hi - lo, 2 * S, -1)

    if 0 < pilot < P:
        n1 = int(np.searchsorted(ask, pilot))
        if n1 == 0:
            return X0, ok
        Y = answers(0, n1)
        if judged(Y, clear[ask[:n1]])[1].sum() < COARSE_PILOT_MIN * pilot:
            return X0, ok
        Y = np.concatenate([Y, answers(n1, len(ask))]) if n1 < len(ask) else Y
    else:
        Y = answers(0, len(ask))
    t0[ask], ok[ask] = judged(Y, clear[ask])
    return X0 + t0[:, None] * G, ok


def _kinks_across(oracle, known, layer, j, X0, G, S, batch, half=REFIT_HALF, coarse=False, pilot=0, *, detect):
    """:func:`_segment_kinks` on the segments through X0 along G, ``batch`` segments a model
    call (``pilot`` for the first batch); returns (kinks, usable mask)."""
    found = [
        _answered_kinks(
            oracle,
            known,
            layer,
            j,
            X0[i : i + batch],
            G[i : i + batch],
            S,
            half,
            coarse=coarse,
            pilot=pilot * (i == 0),
            detect=detect,
        )
        for i in range(0, len(X0), batch)
    ]
    return np.vstack([f[0] for f in found]), np.concatenate([f[1] for f in found])


def _answered_kinks(oracle, known, layer, j, X0, G, S, half, tries=4, coarse=False, pilot=0, *, detect):
    """:func:`_segment_kinks`; where the model does not answer far out (a classifier's
    logits read from saturated probabilities), the segments beyond half the largest norm
    are left out (not usable), up to ``tries`` times."""
    keep = np.ones(len(X0), dtype=bool)
    for attempt in range(tries + 1):
        try:
            # A broadcast G stays one (its segments are built from one row).
            X1, G1 = (X0, G) if keep.all() else (X0[keep], G[keep])
            pts, ok = _segment_kinks(oracle, known, layer, j, X1, G1, S, half, coarse, pilot, detect)
            break
        except NonFiniteOutputs:
            if attempt == tries or not keep.any():
                raise
            r = np.linalg.norm(X0, axis=1)
            keep &= r <= 0.5 * r[keep].max()
    P, usable = X0.copy(), np.zeros(len(X0), dtype=bool)
    P[keep], usable[keep] = pts, ok
    return P, usable


def _plane_through(F, w, eps):
    """``(v, c)`` with ``v . f + c = 0`` on the rows f of F, near the unit row w: least
    squares on ``delta . f + c = -w . f`` with ``v = w + delta``, ``delta . w = 0``
    (normal equations: one GEMM and a small solve; an SVD costs ten times more at
    k = 784).

    A kink misplaced by a boundary of a later layer between it and its first side sample
    (the sides fit lines, their meeting point is off) is an outlier that pulls the plane
    towards itself, the more so as the rows are few beside the unknowns (leverage: it then
    shows as a median residual above the rounding, ``ROUNDING * eps`` relative, rather than
    as one large residual). Rows are dropped one at a time, the one with the largest
    studentised residual ``r_i / sqrt(1 - h_ii)`` (the deleted residual ``r_i / (1 - h_ii)``
    in units of its spread; the deleted residual alone makes good high-leverage rows stand
    out), while the median residual is above the rounding or the largest studentised one
    exceeds TRIM times the median one and the rounding, at most a quarter of the spare rows
    (the inverse and the leverages updated by Sherman-Morrison, O(P k) a drop; the plane
    solved again on the rows kept).

    Coordinates that are zero on every row (units of the layer before that no kink sees
    active) are not determined and keep w's value. Returns (v unit, c, median residual
    relative to the median norm of the rows, whether every coordinate was determined, rows
    dropped), or None when the system is singular."""
    P, k = F.shape
    seen = np.abs(F).max(axis=0) > 0
    A = np.hstack([F[:, seen], np.ones((P, 1))])
    ws = w[seen]
    q = int(seen.sum())
    rhs = -(F @ w)
    # Normal matrix once (a symmetric rank-k update: half a GEMM), with delta . w = 0
    # weighted like the rows; dropped rows are subtracted from it.
    # NumPy's products and Cholesky release the GIL (SciPy's BLAS and LAPACK wrappers hold
    # it): rows refitted side by side (:func:`anchored_rows`) overlap in them.
    G0 = A.T @ A
    G0[:q, :q] += P * np.outer(ws, ws)

    def solve(keep):
        """The plane on the rows kept and the lower Cholesky factor of their normal matrix,
        or (None, None) where it is not positive definite or its reciprocal condition is
        below the machine epsilon (where scipy's solve warns)."""
        out = ~keep
        G = G0 - A[out].T @ A[out] if out.any() else G0
        try:
            L = np.linalg.cholesky(G)
        except np.linalg.LinAlgError:
            return None, None
        # L.T: the upper factor in Fortran order, read by LAPACK without a copy.
        rcond, info = scipy.linalg.lapack.dpocon(L.T, np.abs(G).sum(axis=0).max())
        if info != 0 or not rcond >= np.finfo(np.float64).eps:
            return None, None
        return scipy.linalg.cho_solve((L.T, False), A[keep].T @ rhs[keep], check_finite=False), L

    keep = np.ones(P, dtype=bool)
    sol, L = solve(keep)
    if sol is None:
        return None
    r = np.abs(A @ sol - rhs)
    dropped = 0
    norm = max(float(np.median(np.linalg.norm(A, axis=1))), 1e-300)
    if r.max() > TRIM * np.median(r) or np.median(r) > ROUNDING * eps * norm:
        # The residuals and leverages are updated per drop (the deleted row a: with
        # u = Ginv a and den = 1 - a.u, Ginv gains u u^T / den, the residuals (A u) r_a / den,
        # the leverages (A u)^2 / den; the plane itself is solved again on the rows kept at
        # the end). Ginv is never formed: Ginv a is L^-T (L^-1 a), a triangular solve from the
        # column of Y below, plus the earlier drops' terms (Woodbury, O(k) each). The
        # leverages a.Ginv.a = |L^-1 a|^2 come from the Cholesky factor of the solve.
        resid = A @ sol - rhs
        Y = _lower_solve(L, A.T)  # L^-1 a: a column a row
        h = np.einsum("ij,ij->j", Y, Y)
        floor = ROUNDING * eps * norm
        us: list[np.ndarray] = []
        dens: list[float] = []
        for _ in range(max(0, (P - q - 1) // 4)):
            res = np.abs(resid[keep])
            # A row of leverage ~1 is the only support of some direction (a unit of the
            # layer before active at one kink): it cannot be judged, and is never dropped.
            lev = 1.0 - h[keep]
            rd = np.where(lev > LEVERAGE_FLOOR, res / np.sqrt(np.maximum(lev, LEVERAGE_FLOOR)), 0.0)
            worst = int(np.argmax(rd))
            if np.median(res) <= floor and rd[worst] <= max(TRIM * np.median(rd), floor):
                break  # at the rounding, nothing standing out
            i = np.nonzero(keep)[0][worst]
            u = scipy.linalg.solve_triangular(L.T, Y[:, i], check_finite=False)
            for uk, dk in zip(us, dens):
                u += uk * ((uk @ A[i]) / dk)
            den = 1.0 - A[i] @ u
            Au = A @ u
            step = resid[i] / den
            resid += step * Au
            us.append(u)
            dens.append(den)
            h += Au**2 / den
            keep[i] = False
            dropped += 1
        if dropped:
            trimmed, _ = solve(keep)
            if trimmed is None:  # the rows left do not determine the plane: keep them all
                keep[:], dropped = True, 0
            else:
                sol = trimmed
                r = np.abs(A @ sol - rhs)
    v = w.copy()
    v[seen] += sol[:q]
    s = np.linalg.norm(v)
    rel = float(np.median(r[keep]) / s / norm)
    return v / s, sol[q] / s, rel, bool(seen.all()), dropped


#: Rows of the diagonal blocks in :func:`_lower_solve`.
SOLVE_BLOCK = 128


def _lower_solve(L, B):
    """``L^-1 B`` for a lower-triangular L, by blocks of SOLVE_BLOCK rows: each block's
    right-hand side less the blocks above (a NumPy product), times the inverse of its
    diagonal block (LAPACK's dtrtri on SOLVE_BLOCK rows). The products, nearly all of the
    work, release the GIL, where SciPy's triangular solve holds it throughout."""
    n = len(L)
    X = np.empty((n, B.shape[1]))
    for s in range(0, n, SOLVE_BLOCK):
        e = min(s + SOLVE_BLOCK, n)
        R = B[s:e] - L[s:e, :s] @ X[:s] if s else B[s:e]
        inv, info = scipy.linalg.lapack.dtrtri(L[s:e, s:e], lower=1)
        if info != 0:  # a zero pivot: the factor came from a positive definite matrix, so never
            raise np.linalg.LinAlgError("singular triangular factor")
        X[s:e] = np.tril(inv) @ R
    return X


#: A kink whose studentised residual exceeds TRIM times the median one is dropped (rounding
#: alone rarely gives more than 5 times the median on a hundred rows).
TRIM = 8.0
#: Rows with 1 - leverage below this are not judged (nor dropped).
LEVERAGE_FLOOR = 1e-6
#: Median residual (relative, in units of eps) above which the rows are trimmed even when
#: no residual stands out (exact kinks fit to about eps / 3).
ROUNDING = 16.0


#: A refitted row is taken when it is within REFIT_AGREE of the estimate (other units' rows
#: are O(1) away; finite-difference normals at d = 784 are 1e-5 off in float64, 1e-3 at
#: low precision) and its kinks fit it to REFIT_FIT * eps (relative to |h|).
REFIT_AGREE, REFIT_FIT = 0.05, 1e4


def _near(fit, w, b, tol):
    v, c = fit[0], fit[1]
    return np.linalg.norm(v - w) <= tol and abs(c - b) <= tol * max(1.0, abs(b))


def _accept(fit, w, b, tol, eps):
    """Whether a plane fit (:func:`_plane_through`) replaces the unit row (w, b): near it,
    and through its kinks to the rounding."""
    return bool(_near(fit, w, b, tol) and fit[2] <= REFIT_FIT * eps)


def _row_fit(oracle, known, layer, j, P, S, rng, half, detect):
    """The plane through kinks of unit j on segments of half-length ``half`` across its
    boundary at P boundary points (more where few are clean or where units before it are
    never active): (fit of :func:`_plane_through` or None, the reason when None)."""
    d, kin = oracle.d, layer[0].shape[1]
    batch = max(1, int(REFIT_BATCH_BYTES // (2 * S * d * 8)))  # segments per model call
    X0, G = _boundary_points(known, layer, j, P, d, rng)
    if len(X0) <= kin:
        return None, "boundary not reached"

    def more(n, scales):  # kinks on segments from n more boundary points at these scales
        X1, G1 = _boundary_points(known, layer, j, n, d, rng, scales)
        if len(X1) == 0:
            return np.zeros((0, d)), np.zeros(0, dtype=bool)
        return _kinks_across(oracle, known, layer, j, X1, G1, S, batch, half, detect=detect)

    pts, ok = _kinks_across(oracle, known, layer, j, X0, G, S, batch, half, detect=detect)
    if ok.sum() <= kin + 2 and ok.sum() >= SPARSE_MIN * len(ok):
        # A unit whose kink is visible at few points of its boundary (no active path after
        # it elsewhere, as in trained networks): more points, farther out, as many as the
        # clean fraction seen so far says the plane fit needs (kin + 2 and a quarter of kin
        # to spare for its trimming), SPARSE_MORE P at most (before: SPARSE_MORE P at once;
        # bench/test_bench_trained.py: a trained 784-128-128-10 from 4.8 to 2.9 million queries).
        target, budget, frac = kin + 2 + max(32, kin // 4), int(np.ceil(SPARSE_MORE * P)), ok.mean()
        while ok.sum() < target and budget > 0:
            n = min(budget, int(np.ceil(SPARSE_SLACK * (target - ok.sum()) / max(frac, SPARSE_MIN))))
            p1, ok1 = more(n, SPARSE_SCALES)
            budget -= n
            pts, ok = np.vstack([pts, p1]), np.concatenate([ok, ok1])
            frac = ok1.mean() if len(ok1) else 0.0
    if ok.sum() <= kin + 2:
        return None, "too few clean segments"
    _, H = pre_activations(known, pts[ok])
    if known and not (np.abs(H).max(axis=0) > 0).all():
        # Units of the layer before never active at these kinks: more kinks from boundary
        # points far out, where other patterns of that layer are met.
        p1, ok1 = more(P, FAR_SCALES)
        H = np.vstack([H, pre_activations(known, p1[ok1])[1]])
    s = np.linalg.norm(layer[0][j])
    fit = _plane_through(H, layer[0][j] / s, oracle.eps)
    return fit, "singular"


#: Segments of the second try at a unit whose kinks are off its plane are this many times shorter.
SHORT_FACTOR = 8.0


def refit_layer(oracle, known, layer, rng, *, tol=None, last=False, rows=None):
    """Hyperplanes of ``layer`` (unit rows in ``h_l``-space, signs open) refitted through
    precisely located kinks, with ``known`` the final layers before it.

    Returns ``(W, b, refitted, reasons)``: the rows (each refitted, in part where a unit of the layer
    before is never active at its kinks, or left as it was) and the number refitted
    whole, and the count of each reason a row was not refitted whole (with the number of
    kinks the plane fits dropped, "kinks dropped"). ``tol``: the largest change accepted
    (default REFIT_AGREE). ``last``: no hidden layer follows (every boundary a segment may
    cross is known, so in float64 two samples a side suffice: REFIT_SAMPLES_LAST, and at low
    precision REFIT_SAMPLES_LOW_LAST average the rounding). ``rows``:
    the units to refit (default all; the others' boundaries still drop the segments they cross)."""
    W, b = layer
    k, kin = W.shape
    tol = REFIT_AGREE if tol is None else tol
    P = (5 * kin) // 4 + REFIT_EXTRA
    detect = REFIT_DETECT_LOW_LAST if oracle.low_precision and last else REFIT_DETECT
    if oracle.low_precision:
        S = REFIT_SAMPLES_LOW_LAST if last else REFIT_SAMPLES_LOW
    else:
        S = REFIT_SAMPLES_LAST if last else REFIT_SAMPLES_DOUBLE
    W2, b2 = W.copy(), b.copy()
    refitted = 0
    why: dict = {}

    def count(reason):
        why[reason] = why.get(reason, 0) + 1

    todo = list(range(k) if rows is None else rows)

    def row(j, rng_j):
        """Row j's fit on its own random stream (the reason where none), its norm and unit
        plane as given."""
        s = np.linalg.norm(W[j])
        w, c0 = W[j] / s, b[j] / s
        fit, reason = _row_fit(oracle, known, layer, j, P, S, rng_j, REFIT_HALF, detect)
        if fit is not None and not _accept(fit, w, c0, tol, oracle.eps):
            # Kinks off the plane, as where boundaries of a later layer are dense (trained
            # networks): twice the segments, each SHORT_FACTOR times shorter.
            retry, _ = _row_fit(oracle, known, layer, j, 2 * P, S, rng_j, REFIT_HALF / SHORT_FACTOR, detect)
            fit = retry if retry is not None and _accept(retry, w, c0, tol, oracle.eps) else fit
        return fit, reason, s, w, c0

    # The rows are independent (each against the layer as given): side by side on the
    # method's threads, one model call at a time, the same result on any number of threads.
    for j, (fit, reason, s, w, c0) in zip(todo, _side_by_side(row, todo, rng)):
        if fit is None:
            count(reason)
            continue
        v, c, rel, whole, dropped = fit
        if dropped:
            why["kinks dropped"] = why.get("kinks dropped", 0) + dropped
        if _accept(fit, w, c0, tol, oracle.eps):
            W2[j], b2[j] = v * s, c * s
            refitted += whole
            if not whole:
                count("in part")
        else:
            count("kinks off a hyperplane" if _near(fit, w, c0, tol) else "far from the estimate")
    return W2, b2, refitted, why


#: Passes of :func:`anchored_rows`: the first radius (input space) of the boundary points
#: around the anchor, the factor by which the radius falls after a pass that failed (the
#: plane is too far off there), the largest factor by which it grows after one that held,
#: the last radius and the smallest, and the most passes a row gets.
COARSE_START, COARSE_DOWN, COARSE_GROWTH, COARSE_TOP, COARSE_FLOOR, COARSE_PASSES = 0.1, 10.0, 300.0, 30.0, 5e-4, 8
#: Failed passes after which a row is given up (its anchor's kink goes back to the pool, and
#: another kink of the unit anchors it later). The first layers of trained float32
#: 784-64-64-10 and 784-128-128-10 (random state 0, ad-hoc traces): of 198 rows whose passes
#: reached COARSE_TOP, none had two failed passes and one had one; the 8 rows with two
#: failed three times or more, cycling between a radius that fails and one ten times
#: closer whose estimate stays where it was, until the passes ran out.
COARSE_FAILS = 2
#: A pass at COARSE_TOP whose estimated error fell less than the radius grew over
#: COARSE_FALL (from the pass before) is followed by one more there.
COARSE_FALL = 20.0
#: Fraction of the segments' inner eighth that the plane's estimated error may reach at the
#: next radius.
COARSE_MARGIN = 0.25
#: Dimension above which the next radius grows with sqrt(d / COARSE_DIMS): a segment in a
#: random direction of the plane is off by about theta rho / sqrt(d), not theta rho (theta
#: the normal's angle error), and the estimate of theta runs 7-17 times low at d = 784 in
#: float32 (a trained 784-64-64-10's first layer, ad-hoc trace), so the margin held at
#: d <= COARSE_DIMS is kept beyond it; there the first layer took 3.9 passes a row (4.9
#: million queries), 2.6 with this (3.2 million).
COARSE_DIMS = 100.0
#: Samples a side (three: a line through them and one degree of freedom to see a boundary
#: crossing the side; four cost the planted float32 784-64-64-10's first layer 1.51 million
#: queries instead of 1.16 million, for the same residual, 7.6e-8 and 8.0e-8, ad-hoc);
#: half-lengths of the segments, in the order tried (shorter ones where
#: boundaries of later layers are dense, longer ones for a unit whose slope jump is small);
#: rms residual of a side's line allowed (units of eps * max |output|); slope jump over a
#: half segment needed (units of that bar); largest change of the unit normal a pass may make.
COARSE_SAMPLES, COARSE_HALF, COARSE_RESIDUAL, COARSE_DETECT, COARSE_AGREE = 3, (0.05, 0.0125, 0.25), 8.0, 64.0, 1.5
#: Samples a side once a row's passes stalled (a weak unit, long segments from then on: the
#: kinks' spread sets its plane's error, and with three samples one row of the trained
#: float32 784-64-64-10 ended 3.5e-3 off, against an estimate of 1.8e-4, where the others
#: were 8e-6 off, median, 5e-5 at most; ad-hoc, against its weights).
COARSE_SAMPLES_WEAK = 4
#: Clean fraction of a pass's segments above which more segments are asked, not shorter ones.
COARSE_MIN = 0.2
#: Segments of a pass's pilot batch, and the clean fraction under which its length is given
#: up before the rest are asked (where it is not, all are judged together, as one batch:
#: the same kinks and rows where the model answers a point alike in any batch; a float32
#: model through OpenBLAS does not). The trained float32 784-64-64-10's first layer (ad-hoc trace):
#: 23 of 327 batches of 1,012 segments had under a tenth clean (0.25 and 0.05 segments
#: crossed by other boundaries, or a row whose plane was far off at that radius), 20,332
#: segments (163,000 queries) that the pilot saves; a length with a fifth clean fails the
#: pilot with probability ~1e-4.
COARSE_PILOT, COARSE_PILOT_MIN = 128, 0.1
#: A pass whose estimated error is above COARSE_STALL times the last one's made no progress.
COARSE_STALL = 0.7
#: A deep network above COARSE_DIMS (boundaries of later layers cross the segments; few
#: reach a short one): the half-lengths in the order tried, shortest first, and the share of
#: COARSE_TOP above which the next radius is COARSE_TOP. The first layer of a trained float32
#: 784-64-64-10 (28 rows of its first two rounds, ad-hoc): 35% of the 0.05 segments crossed
#: by other boundaries, 13% of the 0.0125 ones; 20,325 queries a row instead of 37,736, the
#: rows 1.1e-5 off (median; 1.0e-4 at most) instead of 8.7e-5 (7.4e-4). With one hidden
#: layer no unknown boundary crosses a segment, and the longer reach of the long segments
#: wins (a planted float32 784-128-1 took 25% more queries with these rules, ad-hoc).
COARSE_HALF_DEEP, COARSE_JUMP_DEEP = (0.0125, 0.05, 0.25), 1 / 3


def _around(a, w, c, rho, n, rng):
    """``n`` points of the plane ``w.x + c = 0`` at distance ~rho from the point a on it
    (random directions in the plane; a is on the model's boundary, the plane an estimate)."""
    V = rng.standard_normal((n, len(w)))
    V -= np.outer(V @ w, w)
    X = a + rho * V / np.linalg.norm(V, axis=1, keepdims=True)
    return X - np.outer(X @ w + c, w)


def _anchored_pass(oracle, W, b, j, w, c, a, rho, rng, P, batch, halves=None, samples=None):
    """One pass of :func:`anchored_rows`: the plane (w, c) of row j refitted through kinks on
    segments along w at about P points of it at distance ``rho`` from the anchor a. Returns
    (w, c, estimated angle error) or None (too few clean segments, or a plane the kinks do
    not fit). Each half-length is first tried on a pilot batch of COARSE_PILOT segments;
    ``samples`` a side (default COARSE_SAMPLES)."""
    d = W.shape[1]
    Wj, bj = W.copy(), b.copy()
    Wj[j], bj[j] = w, c

    def kinks(X, half, pilot=0):
        G = np.broadcast_to(w, X.shape)
        S = samples or COARSE_SAMPLES
        return _kinks_across(
            oracle, [], (Wj, bj), j, X, G, S, batch, half, coarse=True, pilot=pilot, detect=COARSE_DETECT
        )

    target = d + 2 + max(32, d // 4)  # the plane's unknowns, and rows to spare for its trimming
    X0 = _around(a, w, c, rho, P, rng)
    for half in halves or COARSE_HALF:
        # A pilot batch first: a length whose segments are nearly all crossed by other
        # boundaries, or miss the kink, is left after COARSE_PILOT segments, not P.
        pts, ok = kinks(X0, half, pilot=COARSE_PILOT)
        if COARSE_MIN * len(ok) <= ok.sum() < target:  # more segments, as many as the clean fraction says
            n = int(np.ceil(SPARSE_SLACK * (target - ok.sum()) / ok.mean()))
            p1, ok1 = kinks(_around(a, w, c, rho, n, rng), half)
            pts, ok = np.vstack([pts, p1]), np.concatenate([ok, ok1])
        if ok.sum() > d + 2:
            break
    if ok.sum() <= d + 2:
        return None
    fit = _plane_through(pts[ok], w, oracle.eps)
    if fit is None or fit[2] > REFIT_FIT * oracle.eps or np.linalg.norm(fit[0] - w) > COARSE_AGREE:
        return None
    # The plane's angle error from the spread of its kinks about it: n points on a sphere of
    # radius rho in d - 1 dimensions fix each direction to sigma sqrt(d / n) / rho, the
    # normal (d directions) to sigma d / (rho sqrt(n)).
    r = pts[ok] @ fit[0] + fit[1]
    sigma = 1.4826 * float(np.median(np.abs(r - np.median(r))))
    return fit[0], fit[1], sigma * d / (rho * np.sqrt(ok.sum()))


def anchored_rows(oracle, layer, rows, anchors, rng, *, deep=False):
    """First-layer rows measured at low precision refitted through kinks around the kink each
    was measured at (its anchor).

    At d = 784 in float32 a normal from finite differences is ~1e-2 off (the rounding of
    785 differences; 0.1-1 for a unit whose slope jump is small), so the estimated
    boundary misses the model's by ~0.3 at the random boundary points of
    :func:`refit_layer`, far outside its segments. Here the boundary points lie at distance
    rho from the anchor, which is on the model's boundary, so the estimate is off there by
    the angle error times rho: within the segments' inner eighth for rho = COARSE_START, or
    after passes COARSE_DOWN times closer in. Each pass refits the plane through the kinks
    located on its segments (:func:`_plane_through`), and the next pass goes as far out as
    the new plane's estimated error allows (up to COARSE_GROWTH times farther), until a
    pass at COARSE_TOP holds (with its own estimated error inside the margin it was
    measured with there; one outside counts as failed): 1e-6 to 2e-5 at d = 784 in float32 (ad-hoc runs on planted
    784-32-1; tests/test_chosen_float32.py checks 1e-4 at d = 100), three or four passes of
    ``5 d / 4 + REFIT_EXTRA`` segments (more where boundaries of later layers cross some), each
    ``2 COARSE_SAMPLES`` queries (``2 COARSE_SAMPLES_WEAK`` once a row's passes stalled).

    ``deep``: the network has hidden layers after this one. Above COARSE_DIMS their
    boundaries cross long segments often; the passes then try the shortest segments first,
    start farther out and go to COARSE_TOP once the next radius is within a third of it
    (COARSE_HALF_DEEP, COARSE_JUMP_DEEP).

    The rows are independent: each is refitted against the layer as given (not the rows
    refitted before it), on its own random stream drawn from ``rng``, and they run side by
    side on the method's threads (:func:`relufast._blas.thread_map`; one model call at a
    time), with the same result on any number of threads.

    Returns (W, b, done): the layer with the given rows replaced where a pass at COARSE_TOP
    held (``done``, a bool per row of ``rows``).
    """
    W, b = np.array(layer[0], dtype=np.float64), np.array(layer[1], dtype=np.float64)
    given = (W.copy(), b.copy())
    fits = _side_by_side(
        lambda i, rng_i: _anchored_row(oracle, given, rows[i], anchors[i], rng_i, deep), range(len(rows)), rng
    )
    done = np.zeros(len(rows), dtype=bool)
    for i, fit in enumerate(fits):
        if fit is not None:
            W[rows[i]], b[rows[i]], done[i] = fit[0], fit[1], True
    return W, b, done


def _side_by_side(fn, items, rng):
    """``[fn(x, rng_x) for x in items]`` on the method's threads (:func:`.._blas.thread_map`),
    each item with its own random stream seeded from ``rng`` in order: the same result on any
    number of threads."""
    items = list(items)
    seeds = rng.integers(0, 2**63 - 1, size=len(items))
    return thread_map(lambda i: fn(items[i], np.random.default_rng(seeds[i])), range(len(items)))


def _anchored_row(oracle, layer, j, a, rng, deep):
    """The passes of :func:`anchored_rows` for row j of ``layer`` (left unchanged), anchored
    at a: the refitted (row, bias), or None where no pass at COARSE_TOP held."""
    W, b = layer
    d = W.shape[1]
    P = (5 * d) // 4 + REFIT_EXTRA
    batch = max(1, int(REFIT_BATCH_BYTES // (2 * COARSE_SAMPLES_WEAK * d * 8)))
    scale = max(1.0, np.sqrt(d / COARSE_DIMS))
    short = deep and d > COARSE_DIMS
    order = COARSE_HALF_DEEP if short else COARSE_HALF
    long_first = tuple(sorted(COARSE_HALF, reverse=True)) if short else COARSE_HALF[::-1]
    jump = COARSE_JUMP_DEEP if short else 1.0
    s = np.linalg.norm(W[j])
    w, c = W[j] / s, b[j] / s
    # Deep and above COARSE_DIMS, the first radius grows with sqrt(d / COARSE_DIMS) like
    # the margin below (the finite-difference normal's error theta puts the boundary
    # points off by theta rho / sqrt(d)).
    rho, passes, last, halves = COARSE_START * (scale if short else 1.0), 0, np.inf, None
    came_from, again = None, False  # radius of the last pass held; a pass at COARSE_TOP repeated
    best_w, best_c = w, c  # the plane of the first pass there (its estimate stays in `last`)
    failed = 0
    while passes < COARSE_PASSES and rho >= COARSE_FLOOR and failed < COARSE_FAILS:
        passes += 1
        S = COARSE_SAMPLES if halves is None else COARSE_SAMPLES_WEAK
        fit = _anchored_pass(oracle, W, b, j, w, c, a, rho, rng, P, batch, halves or order, S)
        if fit is None:  # the plane is too far off at this radius (or too many crossings)
            if again:  # the pass repeated at COARSE_TOP: the plane of the one before (below)
                break
            failed += 1
            rho /= COARSE_DOWN
            continue
        reach = (halves or order)[0]
        if rho >= COARSE_TOP and fit[2] * rho > COARSE_MARGIN * reach / 8:
            if again:
                break
            # Not self-consistent: its own error estimate puts the plane outside the
            # margin it was measured with at this radius (kinks of other boundaries on
            # long segments; a trained float32 784-64-64-10 had two rows end 0.008 and
            # 0.02 rad off that way, and no second-layer unit verified): a failed pass.
            failed += 1
            rho /= COARSE_DOWN
            continue
        w, c, theta = fit
        if rho >= COARSE_TOP and not again and came_from is not None and last * came_from * COARSE_FALL < theta * rho:
            # Its estimate fell far less than the radius grew (the kinks scatter far more
            # than at the radius before): one more pass there, from this plane. A planted
            # float32 64-32-32-10 had two rows go from 0.1 to 30 with estimates 4-7 times
            # lower, 1.5e-5 off, where its other such rows fell 34-49 times, to 4e-7-2e-6
            # (ad-hoc, against its weights).
            again, last, came_from = True, theta, rho
            best_w, best_c = w, c
            continue
        if rho >= COARSE_TOP:
            if again and last < theta:  # the repeated pass kept only where its estimate is lower
                w, c = best_w, best_c
            return w * s, c * s
        if halves is None and theta > COARSE_STALL * last:
            # No progress: the kinks' spread on short segments (a weak unit of a trained
            # float32 784-64-64-10: 6e-5) holds the plane's error where the next radius
            # cannot grow (2.5e-4 at 5.8, pass after pass): long segments from now on.
            halves = long_first
        last, came_from = theta, rho
        reach = (halves or order)[0]
        rho = min(COARSE_TOP, COARSE_GROWTH * rho, COARSE_MARGIN * scale * reach / 8 / max(theta, 1e-300))
        if rho >= jump * COARSE_TOP:
            rho = COARSE_TOP
    if again:  # the repeated pass failed, or the passes ran out
        return best_w * s, best_c * s
    return None
