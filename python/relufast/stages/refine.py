"""Exact refinement: BJW19 Algorithm 5 (margin-based form) and activation-region refinement.

From approximate, sign-ambiguous rows of V, :func:`refine_rows` recovers V exactly:
coordinates where the approximate row is confidently negative must be zero in the true
rectified row; the row-span vectors of the outputs vanishing there form a one-dimensional
null space only for the right sign (BJW19 Lemma 10); the row follows from a linear system
on its support (needs m >= k). The C++ kernel does this for many candidates in parallel;
a NumPy reference implementation is kept here for the tests.

:func:`region_refine` (relufast's own step, in none of the papers) makes an approximate
network, with or without biases, exact for any m from the affine maps on its activation
regions; :func:`refine_if_noiseless` runs it after an approximate method and keeps it only
when the data prove noiseless.

References
----------
.. [1] A. Bakshi, R. Jayaram, D. P. Woodruff. Learning two layer rectified neural networks
   in polynomial time. COLT 2019, PMLR 99:195-268. Algorithm 5, Theorem 6.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._blas import blas_threads, tall_svd
from .._deadline import check as check_deadline
from .._native import core
from ..activations import RELU
from .pool import DUPLICATE_COS, RowPool

__all__ = [
    "DEFAULT_MARGINS",
    "output_basis",
    "refine_rows",
    "refine_rows_reference",
    "RegionRefinement",
    "region_refine",
    "TooManyRegions",
    "refine_if_noiseless",
    "region_systems_reference",
    "RowPool",
    "DUPLICATE_COS",
]

#: Margin schedule for unit-norm rows and standard Gaussian inputs (see ``docs/bjw19.md``).
DEFAULT_MARGINS = (0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.3, 1.6)


def output_basis(Y, k):
    """Orthonormal basis of the k-dimensional column space of Y (l, m), as rows (k, l).

    Returns
    -------
    B : ndarray of shape (k, l)
    singular_values : ndarray of shape (min(l, m),)
    Q : ndarray of shape (m, k)
        Top right singular vectors: ``Y @ Q`` compresses the outputs to k columns.
    """
    if Y.shape[0] >= Y.shape[1]:
        Uk, s, Vt = tall_svd(Y, k)  # row blocks on the method's threads
        return np.ascontiguousarray(Uk.T), s, np.ascontiguousarray(Vt[:k].T)
    with blas_threads(4 * Y.shape[0] * Y.shape[1] ** 2):
        Uy, s, Vt = np.linalg.svd(Y, full_matrices=False)
    return np.ascontiguousarray(Uy[:, :k].T), s, np.ascontiguousarray(Vt[:k].T)


def refine_rows(
    B,
    X,
    Vhat,
    *,
    margins=DEFAULT_MARGINS,
    tol_null=1e-10,
    tol_gap=1e-6,
    tol_verify=1e-9,
    n_jobs=0,
    activation=RELU,
    tol_support=1e-9,
    approximate=True,
):
    """Certify and solve hidden rows from approximate directions (Alg. 5, steps 2-5).

    Parameters
    ----------
    B : ndarray of shape (k, l)
        Orthonormal rows spanning the columns of the outputs on the l refinement samples.
    X : ndarray of shape (l, d)
        Refinement samples.
    Vhat : ndarray of shape (c, d)
        Candidate directions (any norm, sign unknown).
    activation : Activation, default=RELU
        Homogeneous activations (relu^p) run in C++; others in NumPy with the
        one-dimensional scale search of BJW19 Sec. 9.1.
    tol_null, tol_gap, tol_verify, tol_support : float
        Zero tests: null-space ratio, spectral gap, verification residual, and the
        relative size below which an entry of a rectified vector counts as zero
        (:func:`relufast.stages.precision.refine_tolerances` raises them for float32 outputs).
    approximate : bool, default=True
        Solve an approximate row (``solved`` without ``certified``) for a candidate that
        does not certify, from its best probe on every confidently-off sample (noisy
        outputs). False skips that solve: ``rows`` is then NaN for such candidates.

    Returns
    -------
    dict of arrays, one entry per candidate: ``rows`` (c, d) (NaN if unsolved; unit norm
    for homogeneous activations), ``certified``, ``solved``, ``sign``, ``margin``,
    ``null_ratio``, ``gap_ratio``, ``other_ratio``, ``verify_residual``, ``n_zero``,
    ``support``.
    """
    B = np.ascontiguousarray(B, dtype=np.float64)
    X = np.ascontiguousarray(X, dtype=np.float64)
    Vhat = np.ascontiguousarray(np.atleast_2d(Vhat), dtype=np.float64)
    if activation.homogeneous:
        return core.refine_rows(
            B,
            X,
            Vhat,
            list(margins),
            tol_null,
            tol_gap,
            tol_verify,
            tol_support,
            0,
            n_jobs,
            float(activation.degree),
            bool(approximate),
        )
    outs = [_refine_one(B, X, v, activation, margins, tol_null, tol_gap, tol_verify, tol_support) for v in Vhat]
    keys = (
        "certified",
        "solved",
        "sign",
        "margin",
        "null_ratio",
        "gap_ratio",
        "other_ratio",
        "verify_residual",
        "n_zero",
        "support",
    )
    res = {key: np.array([o[key] for o in outs]) for key in keys}
    res["rows"] = np.array([o["row"] for o in outs]).reshape(len(outs), X.shape[1])
    return res


def _solve_scaled(XS, rS, activation):
    """z with activation(X_S z) proportional to r_S; the scale c is searched in 1-D
    (grid over log c, then bounded Brent) unless the activation is homogeneous."""
    if activation.homogeneous:
        t = activation.inverse(rS / rS.max())
        return np.linalg.lstsq(XS, t, rcond=None)[0]
    from scipy.optimize import minimize_scalar

    def resid(logc):
        t = activation.inverse(rS / np.exp(logc))
        z = np.linalg.lstsq(XS, t, rcond=None)[0]
        return float(np.linalg.norm(XS @ z - t) / max(np.linalg.norm(t), 1e-300))

    center = np.log(rS.max())
    grid = center + np.linspace(-25, 25, 201)
    vals = [resid(g) for g in grid]
    i = int(np.argmin(vals))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    sc = minimize_scalar(resid, bounds=(lo, hi), method="bounded", options={"xatol": 1e-12}).x
    # Function values only locate the minimum to about sqrt(eps); finish with Gauss-Newton on
    # X_S z = t(s), t(s) = phi^{-1}(r_S e^{-s}), jointly in (z, s) (a zero-residual problem).
    h = 1e-6
    for _ in range(8):
        t = activation.inverse(rS * np.exp(-sc))
        dt = (activation.inverse(rS * np.exp(-(sc + h))) - activation.inverse(rS * np.exp(-(sc - h)))) / (2 * h)
        sol = np.linalg.lstsq(np.column_stack([XS, -dt]), t, rcond=None)[0]
        step = sol[-1]
        sc += step
        if abs(step) < 1e-15 * max(1.0, abs(sc)):
            break
    t = activation.inverse(rS * np.exp(-sc))
    return np.linalg.lstsq(XS, t, rcond=None)[0]


def _thin(idx, cap):
    """At most ``cap`` evenly spaced members of the index array ``idx`` (as the C++ kernel
    takes them: the probe's null space and the exact solve need a few times k, resp. d,
    generic rows; the verification reads every sample)."""
    n = len(idx)
    return idx if n <= cap else idx[(np.arange(cap) * n) // cap]


def _refine_one(B, X, v, activation, margins, tol_null, tol_gap, tol_verify, tol_support=1e-9):
    """NumPy version of the C++ kernel for one candidate (certified rows only)."""
    k, l = B.shape
    d = X.shape[1]
    out = {
        "certified": False,
        "solved": False,
        "sign": 0,
        "margin": 0.0,
        "null_ratio": 1.0,
        "gap_ratio": 0.0,
        "other_ratio": 1.0,
        "verify_residual": 1.0,
        "n_zero": 0,
        "support": 0,
        "row": np.full(d, np.nan),
    }
    v = v / np.linalg.norm(v)
    p = X @ v
    for gamma in margins:
        probes: dict[int, tuple | None] = {}
        for q in (+1, -1):
            Z = np.flatnonzero(q * p < -gamma)
            if Z.size < 2 * k + 5:
                probes[q] = None
                continue
            Zt = _thin(Z, max(2 * k + 5, 4 * k + 20))
            _, s, Vt = np.linalg.svd(B[:, Zt].T, full_matrices=True)
            scale = s[0] if k >= 2 else np.linalg.norm(B) * np.sqrt(Zt.size / l)
            gap = s[k - 2] / scale if k >= 2 else 1.0
            probes[q] = (s[k - 1] / scale, gap, Vt[k - 1], Z.size)
        for q in (+1, -1):
            mine, other = probes[q], probes[-q]
            if mine is None:
                continue
            other_ratio = 1.0 if other is None else other[0]
            if not (mine[0] < tol_null and mine[1] > tol_gap and other_ratio > tol_gap):
                continue
            r = mine[2] @ B
            if r.sum() < 0:
                r = -r
            S = r > tol_support * r.max()
            St = _thin(np.flatnonzero(S), 2 * d + 20)
            if S.sum() < d or np.linalg.matrix_rank(X[St]) < d:
                continue
            z = _solve_scaled(X[St], r[St], activation)
            if activation.homogeneous:
                z = z / np.linalg.norm(z)
            t = activation(X @ z)
            res = np.linalg.norm(t - B.T @ (B @ t)) / np.linalg.norm(t)
            supp = t > tol_support * t.max()
            out.update(
                {
                    "solved": True,
                    "row": z,
                    "sign": q,
                    "margin": gamma,
                    "null_ratio": mine[0],
                    "gap_ratio": mine[1],
                    "other_ratio": other_ratio,
                    "verify_residual": res,
                    "n_zero": mine[3],
                    "support": int(S.sum()),
                }
            )
            if res < tol_verify and np.array_equal(supp, S):
                out["certified"] = True
                return out
    return out


def refine_rows_reference(
    B, X, Vhat, *, margins=DEFAULT_MARGINS, tol_null=1e-10, tol_gap=1e-6, tol_verify=1e-9, activation=RELU
):
    """NumPy reference of :func:`refine_rows` for certified rows (for tests).

    Returns (rows, certified, sign) with the same conventions.
    """
    outs = [_refine_one(B, X, v, activation, margins, tol_null, tol_gap, tol_verify) for v in Vhat]
    certified = np.array([o["certified"] for o in outs], dtype=bool)
    rows = np.array([o["row"] if o["certified"] else np.full(X.shape[1], np.nan) for o in outs])
    signs = np.array([o["sign"] if o["certified"] else 0 for o in outs], dtype=int)
    return rows.reshape(len(outs), X.shape[1]), certified, signs


# ---- Activation-region refinement (relufast's exact step for biased networks, any m) ----

#: Relative eigenvalue of the joint region system below which a direction is undetermined.
REGION_RANK_TOL = 1e-11


class RegionRefinement(NamedTuple):
    """Outcome of :func:`region_refine`.

    Attributes
    ----------
    U, V, b, c : ndarray
        The refined network ``Y = relu(X V^T + b) U^T + c``, rows of V of unit norm.
    residual : float
        Relative residual ``||Y - f(X)||_F / ||Y||_F`` over all samples (the certificate).
    history : tuple of float
        The residual before each round, then after the final output-layer fit.
    rounds : int
        Region rounds run.
    undetermined : tuple of int
        Units whose parameters the populated regions do not determine (rank test of the
        joint region system); empty when the system has full rank.
    n_regions, n_certain, n_trimmed : int
        Populated regions, samples with a certain pattern and samples trimmed, in the last round.
    """

    U: np.ndarray
    V: np.ndarray
    b: np.ndarray
    c: np.ndarray
    residual: float
    history: tuple
    rounds: int
    undetermined: tuple
    n_regions: int
    n_certain: int
    n_trimmed: int


def _pattern_bits(keys, k):
    """(R, words) uint64 keys -> (R, k) 0/1 float pattern matrix (bit i: unit i active)."""
    keys = np.asarray(keys, dtype=np.uint64)
    # No region at all (every sample trimmed, or X = 0): an empty (0, words) key array.
    keys = keys.reshape(len(keys), -1) if keys.size else np.zeros((len(keys), (k + 63) // 64), np.uint64)
    S = np.zeros((keys.shape[0], k))
    for i in range(k):
        S[:, i] = (keys[:, i // 64] >> np.uint64(i % 64)) & np.uint64(1)
    return S


def _joint_normal_equations(sys, k, d, m):
    """Normal matrix and right-hand side of the joint region system.

    Unknowns: per unit the (d+1, m) update ``dC_i`` of ``U_i (v_i, b_i)`` and the offset
    update ``dc``; each certain sample's residual is ``sum_{i active} dC_i^T [x; 1] + dc``.
    The normal matrix is assembled from the per-region Gram matrices,
    ``J_ij = sum_R S_Ri S_Rj G_R``.

    Returns (J (N, N), rhs (N, m), S (R, k) pattern matrix) with N = k (d+1) + 1.
    """
    D = d + 1
    S = _pattern_bits(sys["keys"], k)
    R = S.shape[0]
    G = np.asarray(sys["gram"]).reshape(R, D, D)
    H = np.asarray(sys["cross"]).reshape(R, D, m)
    SS = (S[:, :, None] * S[:, None, :]).reshape(R, k * k)
    Jk = (SS.T @ G.reshape(R, D * D)).reshape(k, k, D, D).transpose(0, 2, 1, 3).reshape(k * D, k * D)
    N = k * D + 1
    J = np.zeros((N, N))
    J[: k * D, : k * D] = Jk
    J[: k * D, -1] = (S.T @ G[:, :, d]).reshape(k * D)
    J[-1, : k * D] = J[: k * D, -1]
    J[-1, -1] = float(np.sum(sys["counts"]))
    rhs = np.zeros((N, m))
    rhs[: k * D] = (S.T @ H.reshape(R, D * m)).reshape(k * D, m)
    rhs[-1] = H[:, d, :].sum(axis=0)
    return J, rhs, S


def _free_unknowns(k, d, bias, offset):
    """Mask of the unknowns of the joint system that are solved for (None: all of them).

    Without hidden biases the bias entry of every ``dC_i`` is held at zero; without an
    output offset ``dc`` is.
    """
    if bias and offset:
        return None
    free = np.ones(k * (d + 1) + 1, dtype=bool)
    if not bias:
        free[d : k * (d + 1) : d + 1] = False
    if not offset:
        free[-1] = False
    return free


def _joint_solve(sys, k, d, m, free=None):
    """The one least-squares solve across regions (rank test and solve in one).

    Parameters
    ----------
    sys : dict
        A region pass of ``core.region_systems``.
    k, d, m : int
        Units, inputs, outputs.
    free : ndarray of bool or None
        The unknowns solved for (:func:`_free_unknowns`); the others stay zero.

    Returns (dC (k, d+1, m), dc (m,), undetermined unit indices, smallest relative eigenvalue).
    """
    D = d + 1
    J, rhs, S = _joint_normal_equations(sys, k, d, m)
    N = J.shape[0]
    idx = np.arange(N) if free is None else np.flatnonzero(free)
    if free is not None:
        J, rhs = J[np.ix_(idx, idx)], rhs[idx]
    # Jacobi scaling, then an eigen-decomposition: the rank test and the solve in one.
    scale = np.sqrt(np.maximum(np.diag(J), 1e-300))
    Js = J / scale[:, None] / scale[None, :]
    w, Q = np.linalg.eigh(0.5 * (Js + Js.T))
    top = max(w[-1], 1e-300)
    keep = w > REGION_RANK_TOL * top
    part = (Q[:, keep] / w[keep]) @ (Q[:, keep].T @ (rhs / scale[:, None]))
    part /= scale[:, None]
    sol = part if free is None else np.zeros((N, m))
    sol[idx] = part
    undetermined = set()
    null = np.zeros((N, int(np.sum(~keep))))
    null[idx] = Q[:, ~keep]
    if null.size:
        weight = np.sqrt(np.sum(null[: k * D] ** 2, axis=1)).reshape(k, D).max(axis=1)
        undetermined = {int(i) for i in np.flatnonzero(weight > 1e-3)}
    for i in range(k):  # a unit active in no certain sample is undetermined too
        if not np.any(S[:, i] > 0):
            undetermined.add(i)
    dC = sol[: k * D].reshape(k, D, m)
    return dC, sol[-1], tuple(sorted(undetermined)), float(w[0] / top) if w.size else 0.0


def _rank_one_update(U, V, b, dC):
    """New (U, V, b) from ``C_i = (v_i, b_i) (x) U_i + dC_i`` by the best rank-one
    approximation, keeping unit rows and the sign that matches the current row."""
    k, D, m = dC.shape
    d = D - 1
    U2, V2, b2 = U.copy(), V.copy(), b.copy()
    for i in range(k):
        C = np.outer(np.append(V[i], b[i]), U[:, i]) + dC[i]
        if m == 1:
            w, s, u = C[:, 0], 1.0, np.ones(1)
        else:
            Ls, sv, Rt = np.linalg.svd(C, full_matrices=False)
            w, s, u = Ls[:, 0], sv[0], Rt[0]
        nv = np.linalg.norm(w[:d])
        if not nv > 0:
            continue
        sign = 1.0 if w[:d] @ V[i] >= 0 else -1.0
        V2[i] = sign * w[:d] / nv
        b2[i] = sign * w[d] / nv
        U2[:, i] = sign * s * nv * u
    return U2, V2, b2


def _canonical_biased(U, V, b):
    s = np.linalg.norm(V, axis=1)
    s = np.where(s > 0, s, 1.0)
    return U * s[None, :], V / s[:, None], b / s


def region_refine(
    X,
    Y,
    V,
    b,
    U=None,
    c=None,
    *,
    margin=0.1,
    max_rounds=10,
    trim=8.0,
    tol=1e-13,
    n_jobs=None,
    block_size=4096,
    max_regions=1 << 16,
    bias=True,
    offset=True,
):
    """Make an approximate network exact by activation-region refinement.

    Given ``(V, b)`` within a few tenths of a radian of the truth, the network is affine
    on every activation region. On the samples whose pattern is certain (every
    ``|x . v_i + b_i|`` above the margin) the residual of the current network is affine,
    ``sum_{i active} dC_i^T [x; 1] + dc``; one pass (C++) accumulates each populated
    region's normal equations, one solve across regions gives every ``dC_i`` (the update
    of ``U_i (v_i, b_i)``) and ``dc``; the rank-one factors give the new ``(U, V, b)``.
    Samples with a large residual after that solve (likely misclassified) are trimmed and
    the solve repeated. Rounds continue until the residual over all samples stops
    falling; a final least-squares fit of ``(U, c)`` on all samples ends it. This step is
    relufast's own (not in any of the papers); it is a Gauss-Newton step on the
    parameters ``U_i (v_i, b_i)`` restricted to samples with a certain pattern.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    Y : ndarray of shape (n, m)
    V : ndarray of shape (k, d)
        Approximate hidden rows (any norm; normalised here with b).
    b : ndarray of shape (k,) or None
        Approximate hidden biases (None: zeros).
    U, c : ndarray of shape (m, k) and (m,), optional
        Approximate output layer; by default fitted by least squares for (V, b).
    margin : float, default=0.1
        Margin of the first round (pre-activation units, rows of unit norm); later rounds
        use ``min(margin, 3 sqrt(d + 1) * step)``, the size of the last update.
    max_rounds : int, default=10
    trim : float or None, default=8.0
        Samples whose residual after the joint solve exceeds ``trim`` times the median
        are dropped from the region systems (None: no trimming).
    tol : float, default=1e-13
        Stop once the relative residual is below this.
    n_jobs, block_size
        Threads and samples per block of the C++ kernels.
    max_regions : int, default=65536
        Refuse (ValueError) more populated regions than this (memory: one (d+1)^2 system
        per region and thread).
    bias, offset : bool, default=True
        Fit the hidden biases b and the output offset c. ``False`` holds them at zero
        (the bias-free models of BJW19 and GKLW19); ``b``/``c`` must then be None or zero.

    Returns
    -------
    RegionRefinement
    """
    from .._blas import single_threaded_blas

    X, Y, U, V, b, c, opts = _check_region_inputs(
        X, Y, V, b, U, c, margin, max_rounds, trim, n_jobs, block_size, max_regions, bias, offset
    )
    with single_threaded_blas():
        return _region_refine(_RegionPass(X, Y, **opts), U, V, b, c, margin, max_rounds, trim, tol)


def _check_region_inputs(X, Y, V, b, U, c, margin, max_rounds, trim, n_jobs, block_size, max_regions, bias, offset):
    """Validate the arguments of :func:`region_refine`; returns (X, Y, U, V, b, c, options of
    :class:`_RegionPass`) with float64 arrays, ``U`` None when not given or zero."""
    from .._validation import check_positive_int, check_xy, resolve_n_jobs

    X, Y = check_xy(X, Y)
    d, m = X.shape[1], Y.shape[1]
    V = np.array(np.atleast_2d(V), dtype=np.float64)
    k = V.shape[0]
    if V.shape[1] != d:
        raise ValueError(f"V must have shape (k, d) with d = {d}; got {V.shape}")
    b = np.zeros(k) if b is None else np.array(b, dtype=np.float64).reshape(-1)
    if b.shape != (k,):
        raise ValueError(f"b must have shape ({k},); got {b.shape}")
    if not (np.all(np.isfinite(V)) and np.all(np.isfinite(b))):
        raise ValueError("V and b must be finite")
    if not (np.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin must be a number >= 0; got {margin!r}")
    if trim is not None and not (np.isfinite(trim) and trim > 1):
        raise ValueError(f"trim must be None or a number > 1; got {trim!r}")
    check_positive_int(max_rounds, "max_rounds", minimum=0)
    Uin = np.zeros((m, k)) if U is None else np.array(U, dtype=np.float64).reshape(m, k)
    U, V, b = _canonical_biased(Uin, V, b)
    c = np.zeros(m) if c is None else np.array(c, dtype=np.float64).reshape(m)
    if not bias and np.any(b != 0):
        raise ValueError(f"bias=False holds the hidden biases at zero; got b with {np.count_nonzero(b)} nonzero")
    if not offset and np.any(c != 0):
        raise ValueError(f"offset=False holds the output offset at zero; got c with {np.count_nonzero(c)} nonzero")
    opts = {
        "threads": resolve_n_jobs(n_jobs),
        "block": check_positive_int(block_size, "block_size"),
        "max_regions": check_positive_int(max_regions, "max_regions"),
        "bias": bool(bias),
        "offset": bool(offset),
    }
    return X, Y, (None if not np.any(Uin) else U), V, b, c, opts


class TooManyRegions(ValueError):
    """More activation regions are populated than ``max_regions`` allows (a ValueError, so
    direct callers see the kernel's message; pipelines catch it and refine on fewer rows:
    the regions are never more than the rows)."""


class _RegionPass:
    """The C++ region passes over fixed samples (X, Y) with fixed threads and block size."""

    def __init__(self, X, Y, *, threads, block, max_regions, bias, offset):
        self.X, self.Y = X, Y
        self.threads, self.block, self.max_regions = threads, block, max_regions
        self.bias, self.offset = bias, offset

    def systems(self, U, V, b, c, marg, mask=None):
        """Per-region normal equations of the certain samples, and the residual over all."""
        try:
            return core.region_systems(
                self.X,
                self.Y,
                np.ascontiguousarray(V),
                b,
                np.ascontiguousarray(U),
                c,
                marg,
                mask,
                self.max_regions,
                self.threads,
                self.block,
            )
        except ValueError as err:
            if "max_regions" in str(err):
                raise TooManyRegions(str(err)) from None
            raise

    def residuals(self, U, V, b, c, marg, dC, dc):
        """Per-sample residual after the update ``(dC, dc)`` (inf for uncertain samples)."""
        return core.region_residuals(
            self.X,
            self.Y,
            np.ascontiguousarray(V),
            b,
            np.ascontiguousarray(U),
            c,
            marg,
            np.ascontiguousarray(dC.reshape(dC.shape[0], -1)),
            dc,
            self.threads,
            self.block,
        )

    def fit_output(self, U, V, b, c):
        """Least-squares (U, c) for fixed (V, b) (c held at zero without an offset)."""
        k = V.shape[0]
        # Iterative refinement of the normal equations of [relu(X V^T + b), 1]: the pass
        # gives F1^T r for the current residual, so the correction is accurate to rounding.
        for _ in range(2):
            st = self.systems(U, V, b, c, np.full(k, np.inf))
            if self.offset:
                delta = np.linalg.lstsq(st["fgram"], st["fcross"], rcond=1e-14)[0]
                U, c = U + delta[:k].T, c + delta[k]
            else:
                delta = np.linalg.lstsq(st["fgram"][:k, :k], st["fcross"][:k], rcond=1e-14)[0]
                U = U + delta.T
        return U, c


def _relative(sys):
    """Relative residual of a region pass (NaN for all-zero outputs)."""
    return float(np.sqrt(sys["sq_residual"] / sys["sq_norm"])) if sys["sq_norm"] > 0 else float("nan")


def _region_round(rp, U, V, b, c, marg, sys, trim):
    """One round's update: the joint solve, then again without the samples it fits worst.

    Returns (dC, dc, undetermined, n_regions, n_certain, n_trimmed).
    """
    n, d = rp.X.shape
    k, m = V.shape[0], rp.Y.shape[1]
    free = _free_unknowns(k, d, rp.bias, rp.offset)
    dC, dc, undetermined, _ = _joint_solve(sys, k, d, m, free)
    n_regions, n_certain, n_trimmed = len(sys["counts"]), int(sys["n_certain"]), 0
    if trim is not None and n_certain:
        r = rp.residuals(U, V, b, c, marg, dC, dc)
        fin = np.isfinite(r)
        thr = trim * float(np.median(r[fin]))
        floor = 1e-14 * float(np.sqrt(sys["sq_norm"] / max(n, 1)))
        mask = ~(fin & (r > max(thr, floor)))
        n_trimmed = int(np.sum(~mask))
        if n_trimmed:
            sys2 = rp.systems(U, V, b, c, marg, mask)
            dC, dc, undetermined, _ = _joint_solve(sys2, k, d, m, free)
            n_regions, n_certain = len(sys2["counts"]), int(sys2["n_certain"])
    return dC, dc, undetermined, n_regions, n_certain, n_trimmed


def _region_refine(rp, U, V, b, c, margin, max_rounds, trim, tol):
    """The rounds of :func:`region_refine` on validated inputs (``U`` None: fit it first)."""
    k, d = V.shape
    if U is None:
        U, c = rp.fit_output(np.zeros((rp.Y.shape[1], k)), V, b, c)
    marg = np.full(k, float(margin))
    history, best = [], None
    undetermined, n_regions, n_certain, n_trimmed, rounds = (), 0, 0, 0, 0
    for rounds in range(1, max_rounds + 1):
        check_deadline("in a region refinement round")
        sys = rp.systems(U, V, b, c, marg)
        res = _relative(sys)
        history.append(res)
        if best is None or res < best[0]:
            best = (res, U, V, b, c)
        if not np.isfinite(res) or res <= tol or (len(history) > 1 and res > 0.5 * history[-2]):
            rounds -= 1
            break
        dC, dc, undetermined, n_regions, n_certain, n_trimmed = _region_round(rp, U, V, b, c, marg, sys, trim)
        U_new, V_new, b_new = _rank_one_update(U, V, b, dC)
        step = np.sqrt(np.sum((V_new - V) ** 2, axis=1) + (b_new - b) ** 2)
        marg = np.minimum(marg, 3.0 * np.sqrt(d + 1.0) * step)
        U, V, b, c = U_new, V_new, b_new, c + dc
    else:
        res = _relative(rp.systems(U, V, b, c, marg))
        history.append(res)
        if best is None or res < best[0]:
            best = (res, U, V, b, c)
    _, U, V, b, c = best
    U, c = rp.fit_output(U, V, b, c)
    residual = _relative(rp.systems(U, V, b, c, np.full(k, np.inf)))
    history.append(residual)
    return RegionRefinement(
        U=U,
        V=V,
        b=b,
        c=c,
        residual=residual,
        history=tuple(history),
        rounds=rounds,
        undetermined=tuple(undetermined),
        n_regions=n_regions,
        n_certain=n_certain,
        n_trimmed=n_trimmed,
    )


def refine_if_noiseless(X, Y, U, V, b=None, c=None, *, tol, bias=True, offset=True, max_rounds=10, n_jobs=None):
    """Activation-region refinement, kept only when it shows the data noiseless.

    Runs :func:`region_refine` from an approximate network. When the refined network
    reproduces ``(X, Y)`` to the relative residual ``tol`` with every unit determined by
    the populated regions, the data are noiseless and the refinement is returned;
    otherwise (noisy data, an estimate outside the basin, too few certain samples, more
    activation regions than the region pass allows) the caller keeps its own estimate.
    This step is relufast's own, not in any of the papers. Pass a probe sample to keep it
    cheap, and certify the returned network over all samples afterwards: the residual here
    is over ``(X, Y)`` only.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    Y : ndarray of shape (n, m)
    U : ndarray of shape (m, k)
    V : ndarray of shape (k, d)
    b : ndarray of shape (k,) or None
        None: zeros.
    c : ndarray of shape (m,) or None
        None: zeros.
    tol : float
        Largest relative residual taken as noiseless (a method's ``tol``, raised to the
        rounding floor of the outputs by :meth:`relufast.stages.precision.Precision.tol`).
    bias, offset : bool, default=True
        Whether the model has hidden biases / an output offset (False holds them at zero).
    max_rounds : int, default=10
    n_jobs : int or None

    Returns
    -------
    refined : RegionRefinement or None
        The refinement when the data proved noiseless, else None.
    residual : float
        The relative residual the refinement reached on ``(X, Y)`` (NaN if it could not run).
    """
    try:
        rr = region_refine(X, Y, V, b, U, c, max_rounds=max_rounds, n_jobs=n_jobs, bias=bias, offset=offset)
    except (np.linalg.LinAlgError, TooManyRegions):
        return None, float("nan")
    if not (rr.residual <= tol) or rr.undetermined:
        return None, rr.residual
    return rr, rr.residual


def region_systems_reference(X, Y, V, b, U, c, margin, mask=None):
    """Plain NumPy reference of the C++ region pass (for tests).

    Returns a dict with the same keys as ``core.region_systems`` (regions sorted by key).
    """
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64).reshape(X.shape[0], -1)
    k = V.shape[0]
    P = X @ V.T + b
    F = np.maximum(P, 0.0)
    R = Y - F @ U.T - c
    F1 = np.column_stack([F, np.ones(len(X))])
    certain = np.all(np.abs(P) > margin, axis=1)
    if mask is not None:
        certain &= mask
    words = (k + 63) // 64
    keys = np.zeros((len(X), words), dtype=np.uint64)
    for i in range(k):
        keys[:, i // 64] |= (P[:, i] > 0).astype(np.uint64) << np.uint64(i % 64)
    Xt = np.column_stack([X, np.ones(len(X))])
    uniq = sorted({tuple(row) for row in keys[certain]})
    gram, cross, counts, sq = [], [], [], []
    for key in uniq:
        sel = certain & np.all(keys == np.array(key, dtype=np.uint64), axis=1)
        A, Rg = Xt[sel], R[sel]
        gram.append((A.T @ A).ravel())
        cross.append((A.T @ Rg).ravel())
        counts.append(float(sel.sum()))
        sq.append(float(np.sum(Rg**2)))
    D = X.shape[1] + 1
    return {
        "keys": np.array(uniq, dtype=np.uint64).reshape(len(uniq), words),
        "counts": np.array(counts),
        "gram": np.array(gram).reshape(len(uniq), D * D),
        "cross": np.array(cross).reshape(len(uniq), D * Y.shape[1]),
        "sq_res": np.array(sq),
        "fgram": F1.T @ F1,
        "fcross": F1.T @ R,
        "sq_residual": float(np.sum(R**2)),
        "sq_norm": float(np.sum(Y**2)),
        "n_certain": float(certain.sum()),
        "count": float(len(X)),
    }
