"""Output layer and certificate stage.

The one place that fits the output layer U (least squares given V), computes the residual
certificate over all samples, and polishes (U, V) jointly by Gauss-Newton. Every method
ends here, so "exact" means the same thing everywhere: the fitted network reproduces the
outputs to the tolerance, measured over all samples.
"""

from __future__ import annotations

import time
from typing import NamedTuple, Optional

import numpy as np
import scipy.linalg

from .._blas import blas_threads, product_blocks, tall_lstsq, thread_map
from .._native import core
from ..activations import RELU

__all__ = [
    "max_abs",
    "power_of_two_scale",
    "scaled_norm",
    "fit_output_layer",
    "fit_from_stats",
    "relu_stats",
    "relative_residual",
    "residual_from_stats",
    "fit_and_certify",
    "fit_network",
    "Fit",
    "certify",
    "check_finite_once",
    "refine_to_exact",
    "ExactRefinement",
    "polish",
    "gauss_newton_system",
    "local_rank_deficiency",
    "undetermined_directions",
    "minimum_norm_rows",
]


def _features(X, V, b, activation, intercept):
    """``f(X V^T + b)`` (with a constant last column when ``intercept``), by row blocks on the
    method's threads, each block's product, bias and activation written into one result
    (the blocks of :func:`relufast._blas.matmul`: the same bits on any number of threads)."""
    X = np.asarray(X)
    n, k = X.shape[0], V.shape[0]
    F = np.empty((n, k + int(bool(intercept))))
    rows, starts = product_blocks(n, X.shape[1] * k)

    def part(a):
        Z = X[a : a + rows] @ V.T
        if b is not None:
            Z += b
        F[a : a + rows, :k] = activation(Z)

    thread_map(part, starts)
    if intercept:
        F[:, k] = 1.0
    return F


def fit_output_layer(X, Y, V, activation=RELU, *, b=None, intercept=False):
    """Least-squares output layer: ``U = argmin ||Y - f(X V^T + b) U^T - c||_F`` via QR.

    Exact (to rounding) on noiseless data whenever f(X V^T + b) (with a constant column when
    ``intercept``) has full column rank (BJW19 Lemma 4). Returns U of shape (m, k), or
    (m, k + 1) with the offset c as last column when ``intercept``, and the condition number
    of the feature matrix.
    """
    F = _features(X, V, b, activation, intercept)
    tall = tall_lstsq(F, Y)  # large and of full rank: row blocks on the method's threads
    if tall is not None:
        Ut, s = tall
        return np.ascontiguousarray(Ut.T), float(s[0] / s[-1])
    with blas_threads(F.shape[0] * F.shape[1] ** 2):
        Ut, _, rank, sv = scipy.linalg.lstsq(F, Y, lapack_driver="gelsy")
        cond = float(np.inf) if rank < F.shape[1] else float(np.linalg.cond(F))
    return np.ascontiguousarray(Ut.T), cond


def relu_stats(X, Y, V, U=None, *, n_jobs=0, block_size=4096, activation=RELU, b=None, intercept=False):
    """One threaded pass over all samples with F = f(X V^T + b) (C++ for relu^p).

    With ``intercept`` F gets a constant column (U then has k + 1 columns, the last being c).
    Returns a dict: ``gram`` = F^T F, ``cross`` = F^T Y, and with U given ``sq_residual`` =
    ||Y - F U^T||_F^2 and ``sq_norm`` = ||Y||_F^2.
    """
    Vc = np.ascontiguousarray(V, dtype=np.float64)
    Uc = None if U is None else np.ascontiguousarray(U, dtype=np.float64)
    bc = None if b is None else np.ascontiguousarray(b, dtype=np.float64)
    if activation.homogeneous:
        return core.relu_stats(X, Y, Vc, Uc, n_jobs, block_size, float(activation.degree), bc, bool(intercept))
    F = _features(X, Vc, bc, activation, intercept)
    out = {"gram": F.T @ F, "cross": F.T @ Y, "count": float(X.shape[0])}
    if Uc is not None:
        out["sq_residual"] = float(np.sum((Y - F @ Uc.T) ** 2))
        out["sq_norm"] = float(np.sum(Y * Y))
    return out


#: Largest |Y| whose sums of squares are safe without scaling: (2^400)^2 times 1e15 entries
#: stays far below the overflow threshold, and squares of entries above 2^-400 do not underflow.
_SAFE_EXPONENT = 400
#: ||Y||^2 at or above this comes from outputs with max|Y| >= 2^-401: no underflow to fear.
_SAFE_SQUARE = 2.0 ** (-2 * _SAFE_EXPONENT - 2)

#: Rows per block when the residual pass has to scale the outputs (bounded extra memory).
_SCALE_BLOCK = 1 << 16


def max_abs(A):
    """``max |A|`` without an n x m temporary (NaN when A holds a NaN)."""
    A = np.asarray(A)
    if A.size == 0:
        return 0.0
    hi, lo = float(np.max(A)), float(np.min(A))
    return max(hi, -lo) if np.isfinite(hi) and np.isfinite(lo) else float("nan")


def power_of_two_scale(a):
    """The power of two s with ``a * s`` in [0.5, 1): scaling by it is exact (1 for a = 0)."""
    if not (np.isfinite(a) and a > 0):
        return 1.0
    return float(np.ldexp(1.0, -int(np.frexp(a)[1])))


def scaled_norm(A):
    """Frobenius norm computed on ``A / max|A|`` (no overflow near 1e154, no underflow near
    1e-154); inf or NaN when A holds one."""
    a = max_abs(A)
    if not np.isfinite(a):
        return float("nan") if np.isnan(a) else float("inf")
    if a == 0:
        return 0.0
    s = power_of_two_scale(a)
    return float(np.linalg.norm(np.asarray(A) * s) / s)


def certify(samples, V, U=None, *, activation=RELU, b=None, c=None, block_size=4096, normal_equations=None):
    """The certificate pass: one fused read of every sample, on every rank.

    For F = f(X V^T + b) (with a constant column when the offset ``c`` is given), returns the
    sums ``gram`` = F^T F, ``cross`` = F^T Y (the normal equations of the output layer over
    all samples), ``count`` and, with U given, ``sq_residual`` = ||Y - F U^T - c||_F^2 and
    ``sq_norm`` = ||Y||_F^2, reduced over the blocks and ranks of ``samples`` (a
    :class:`relufast.stages.reduce.Samples`). Non-finite entries of X and Y are counted as
    the samples are read (in the C++ pass for relu^p): any raises
    ValueError on every rank, so a deferred finiteness check costs no extra pass.
    For relu^p (with or without biases and offset) this is the C++ pass that
    :func:`relu_stats` also runs.
    ``normal_equations`` (default: only when U is None) keeps ``gram`` and ``cross``; the
    fused kernel skips them otherwise, so a certificate costs what a plain check costs.
    """
    normal_equations = U is None if normal_equations is None else bool(normal_equations)
    Vc = np.ascontiguousarray(V, dtype=np.float64)
    intercept = c is not None
    Uc = None if U is None else np.ascontiguousarray(U if c is None else np.column_stack([U, c]), dtype=np.float64)
    bc = None if b is None else np.ascontiguousarray(b, dtype=np.float64)
    # relu^p: the one C++ pass (the kernel behind relu_stats too); other activations: NumPy.
    fused = activation.homogeneous

    def one_block(Xb, Yb):
        if fused:
            return core.certify(
                Xb, Yb, Vc, Uc, samples.n_jobs, block_size, float(activation.degree), normal_equations, bc, intercept
            )
        out = dict(relu_stats(Xb, Yb, Vc, Uc, activation=activation, b=bc, intercept=intercept))
        out.setdefault("sq_residual", 0.0)
        out.setdefault("sq_norm", 0.0)
        out["nonfinite"] = float(
            core.count_nonfinite(np.ascontiguousarray(Xb), samples.n_jobs)
            + core.count_nonfinite(np.ascontiguousarray(Yb), samples.n_jobs)
        )
        return out

    st = samples.map_reduce(one_block, bounded=not fused)
    if st["nonfinite"] > 0:
        raise ValueError(
            f"X and Y must contain only finite values; found {int(st['nonfinite'])} NaN or infinite entries"
        )
    return st


def check_finite_once(samples):
    """Run the deferred finiteness check of ``samples`` (one :func:`certify` pass) unless it
    has run: a status returned on data holding NaN would hide the caller's error."""
    if not samples.finite_checked:
        certify(samples, np.zeros((1, samples.d)))


def _as_samples(X, Y, threads):
    from .reduce import Samples

    return X if isinstance(X, Samples) else Samples(X, Y, n_jobs=threads)


def relative_residual(X, Y, V, U, threads, activation, *, b=None, c=None):
    """``||Y - f(X V^T + b) U^T - c||_F / ||Y||_F`` over all samples (one fused pass); X may
    be a :class:`relufast.stages.reduce.Samples` (Y is then ignored).

    For in-memory outputs the sums of squares are formed on outputs scaled by an exact power
    of two when max|Y| lies outside [2^-400, 2^400] (block by block, so the extra memory
    stays bounded): a residual never overflows to 0 or underflows to NaN because of the
    units of Y. Zero outputs, or any inf/NaN on the way, give NaN, which is never a
    certificate.
    """
    samples = _as_samples(X, Y, threads)
    if not (np.all(np.isfinite(U)) and (c is None or np.all(np.isfinite(c)))):
        check_finite_once(samples)  # NaN data are the caller's error, not a failed fit
        return float("nan")
    if samples.distributed or samples.lazy:
        return residual_from_stats(certify(samples, V, U, activation=activation, b=b, c=c))
    X, Y = samples.X, samples.Y
    # Outputs of ordinary size (the common case) need no scaling: the fused pass alone, kept
    # when its sums neither overflowed nor came near underflow (else the scaled path below).
    st = certify(samples, V, U, activation=activation, b=b, c=c)
    if np.isfinite(st["sq_norm"]) and np.isfinite(st["sq_residual"]) and st["sq_norm"] >= _SAFE_SQUARE:
        return residual_from_stats(st)
    ymax = max_abs(Y)
    if not np.isfinite(ymax):
        check_finite_once(samples)  # raises: NaN/inf in Y is a ValueError, never a residual
    if not (np.isfinite(ymax) and ymax > 0):
        return float("nan")
    e = int(np.frexp(ymax)[1])
    if -_SAFE_EXPONENT <= e <= _SAFE_EXPONENT:
        return residual_from_stats(st)
    s = power_of_two_scale(ymax)
    Us = np.asarray(U, dtype=np.float64) * s
    cs = None if c is None else np.asarray(c, dtype=np.float64) * s
    num = den = 0.0
    for a in range(0, X.shape[0], _SCALE_BLOCK):
        Ys = np.ascontiguousarray(Y[a : a + _SCALE_BLOCK]) * s
        st = certify(
            _as_samples(np.ascontiguousarray(X[a : a + _SCALE_BLOCK]), Ys, threads),
            V,
            Us,
            activation=activation,
            b=b,
            c=cs,
        )
        num, den = num + st["sq_residual"], den + st["sq_norm"]
    return residual_from_stats({"sq_residual": num, "sq_norm": den})


def residual_from_stats(stats):
    """``sqrt(sq_residual / sq_norm)`` of a :func:`relu_stats` pass with U given; NaN when the
    outputs are zero or a sum is not finite (never a certificate)."""
    num, den = stats["sq_residual"], stats["sq_norm"]
    if not (np.isfinite(num) and np.isfinite(den)) or den <= 0:
        return float("nan")
    return float(np.sqrt(num / den))


def _masked_residual(X, Y, U, V, M):
    R = Y - np.maximum(X @ V.T, 0.0) @ U.T
    return R if M is None else M * R


def gauss_newton_system(X, U, V, R, mask=None):
    """Normal equations ``H = J^T J``, ``g = J^T r`` of ``||M o (Y - relu(X V^T) U^T)||_F^2`` in
    the unknowns (vec U, vec V) (row-major), at the residual ``R = M o (Y - relu(X V^T) U^T)``.

    The rank of H is at most ``m k + k d - k`` (positive rescaling of each unit is a symmetry);
    a smaller rank means the masked entries do not determine the network locally.
    """
    n, d = X.shape
    m, k = U.shape
    Mf = np.ones((n, m)) if mask is None else mask
    Z = X @ V.T
    A = (Z > 0).astype(np.float64)
    F = A * Z
    nu, nv = m * k, k * d
    H = np.zeros((nu + nv, nu + nv))
    g = np.zeros(nu + nv)
    for j in range(m):  # U block: rows of U are independent given V
        Fj = F * Mf[:, j : j + 1]
        H[j * k : (j + 1) * k, j * k : (j + 1) * k] = Fj.T @ F
        g[j * k : (j + 1) * k] = Fj.T @ R[:, j]
    for i in range(k):
        Xi = X * A[:, i : i + 1]
        g[nu + i * d : nu + (i + 1) * d] = Xi.T @ (R @ U[:, i])
        for l in range(k):
            # U(j, i) x v_l coupling: sum_s M_sj F_si U_jl A_sl x_s
            C = (Mf * (F[:, i] * A[:, l])[:, None]).T @ X  # (m, d)
            H[np.arange(m) * k + i, nu + l * d : nu + (l + 1) * d] = U[:, l][:, None] * C
            if l >= i:
                w = (Mf * (U[:, i] * U[:, l])[None, :]).sum(axis=1) * A[:, l]
                blk = Xi.T @ (X * w[:, None])
                H[nu + i * d : nu + (i + 1) * d, nu + l * d : nu + (l + 1) * d] = blk
                H[nu + l * d : nu + (l + 1) * d, nu + i * d : nu + (i + 1) * d] = blk.T
    H[nu:, :nu] = H[:nu, nu:].T
    return H, g


#: Eigenvalues of the Jacobi-scaled Gauss-Newton matrix below this count as zero.
LOCAL_RANK_TOL = 1e-10


def local_rank_deficiency(X, U, V, mask=None):
    """How many directions, beyond the k rescaling symmetries, leave the masked fit unchanged
    to first order (0: the masked entries determine the network locally)."""
    m, k = U.shape
    H, _ = gauss_newton_system(X, U, V, np.zeros((X.shape[0], m)), mask)
    dg = np.sqrt(np.maximum(np.diag(H), 0.0))
    dead = dg == 0
    dg[dead] = 1.0
    ev = np.linalg.eigvalsh(H / dg[:, None] / dg[None, :])
    rank = int(np.sum(ev > LOCAL_RANK_TOL * max(ev.max(), 1e-300))) if ev.size else 0
    return int(H.shape[0] - k - rank)


def polish(X, Y, U, V, *, n_iter=10, mask=None, tol=1e-15):
    """Gauss-Newton on ``||M o (Y - relu(X V^T) U^T)||_F^2`` jointly in (U, V) (beyond the paper).

    With the activation pattern of X V^T fixed the model is bilinear; each step solves the
    Gauss-Newton normal equations (minimum-norm, since positive rescaling of a unit is a
    symmetry) with step halving when the residual would grow, then updates the pattern.
    Quadratic convergence on noiseless data; the statistical optimum on noisy data.
    ``mask`` (n, m) of 0/1 weights restricts the fit to trusted entries (the sparse-noise
    pipeline passes the uncorrupted ones).

    Returns (U, V) with unit-norm rows of V.
    """
    M = None if mask is None else mask.astype(np.float64)
    U, V = np.array(U, dtype=np.float64), np.array(V, dtype=np.float64)
    # The problem is equivariant in the scale of Y (U scales with it): work at max |Y| = 1,
    # so that squared residuals of huge or tiny outputs stay finite and nonzero.
    y_scale = float(np.max(np.abs(Y))) if np.size(Y) else 0.0
    if not (np.isfinite(y_scale) and y_scale > 0):
        y_scale = 1.0
    Y, U = np.asarray(Y, dtype=np.float64) / y_scale, U / y_scale
    m, k = U.shape
    d = X.shape[1]
    nu = m * k
    R = _masked_residual(X, Y, U, V, M)
    cost = float(np.sum(R * R))
    for _ in range(n_iter):
        if cost <= tol * tol * max(float(np.sum(Y * Y)), 1e-300):
            break
        H, g = gauss_newton_system(X, U, V, R, M)
        step = np.linalg.lstsq(H, g, rcond=1e-13)[0]
        t = 1.0
        for _ in range(30):
            U_new = U + t * step[:nu].reshape(m, k)
            V_new = V + t * step[nu:].reshape(k, d)
            R_new = _masked_residual(X, Y, U_new, V_new, M)
            c_new = float(np.sum(R_new * R_new))
            if c_new < cost:
                break
            t *= 0.5
        else:
            break
        U, V, R, cost = U_new, V_new, R_new, c_new
    s = np.linalg.norm(V, axis=1)
    return U * (y_scale * s[None, :]), V / s[:, None]


def fit_from_stats(stats):
    """U from the normal equations of one :func:`relu_stats` pass (all samples).

    Returns U of shape (m, k) and the condition number of f(X V^T) (square root of that of
    its Gram matrix).
    """
    gram, cross = stats["gram"], stats["cross"]
    U = np.linalg.lstsq(gram, cross, rcond=None)[0].T
    return np.ascontiguousarray(U), float(np.sqrt(np.linalg.cond(gram)))


class Fit(NamedTuple):
    """The output layer of a network and its certificate."""

    U: np.ndarray  #: (m, k)
    c: Optional[np.ndarray]  #: (m,) output offset, None when not fitted
    residual: float  #: relative residual over all samples
    condition: float  #: condition number of the feature matrix of the fit


def fit_network(X, Y, V, b=None, *, intercept=False, subset=None, threads=0, activation=RELU):
    """The output layer (and offset) of ``Y = f(X V^T + b) U^T + c`` and its certificate.

    U (and c when ``intercept``) are fitted by QR least squares on ``subset`` (a pair
    (X_l, Y_l), default all samples); the relative residual is then measured over all
    samples in one fused pass (:func:`certify`). X may be a
    :class:`relufast.stages.reduce.Samples` (Y is then ignored and ``subset`` required).

    Returns
    -------
    Fit
    """
    Xf, Yf = (X, Y) if subset is None else subset
    Uc, cond = fit_output_layer(Xf, Yf, V, activation, b=b, intercept=intercept)
    U, c = (Uc[:, :-1], Uc[:, -1]) if intercept else (Uc, None)
    return Fit(np.ascontiguousarray(U), c, relative_residual(X, Y, V, U, threads, activation, b=b, c=c), cond)


def fit_and_certify(X, Y, V, *, subset=None, threads=0, activation=RELU):
    """:func:`fit_network` for the bias-free model: returns (U, residual, condition)."""
    fit = fit_network(X, Y, V, subset=subset, threads=threads, activation=activation)
    return fit.U, fit.residual, fit.condition


#: Relative size of X v below which a sample sits on the hyperplane of a hidden unit.
ACTIVE_TOL = 1e-9
#: Singular values of X restricted to a unit's active and boundary samples below this
#: (relative to the largest singular value of X) leave a direction undetermined.
DIRECTION_TOL = 1e-10


def _null_basis(XS, tol_abs):
    """Orthonormal basis (r, d) of null(XS), from the triangular factor of XS (memory
    O(|S| d), time O(|S| d^2): never the |S| x |S| left factor of a full SVD)."""
    d = XS.shape[1]
    R = np.linalg.qr(XS, mode="r") if XS.shape[0] >= d else XS
    _, sv, Vt = np.linalg.svd(R, full_matrices=True)
    r = int(np.sum(sv > tol_abs))
    return np.ascontiguousarray(Vt[r:])


def undetermined_directions(X, V, deadline=None):
    """For each row v_i of V: an orthonormal basis (r_i, d) of null(X_S), S the samples where
    the unit is active, when v_i can move in it without changing ``relu(X v_i)``; else (0, d).

    A direction z with ``X_S z = 0`` keeps the active values; samples strictly off stay off
    for small steps; samples on the boundary (X v_i = 0) stay off when ``x.z <= 0``. So the
    row is free iff the cone {z in null(X_S): X_B z <= 0} is not {0} (B the boundary
    samples), decided exactly: with A = X_B N^T, the cone is {0} iff A has full column rank
    and some y > 0 has A^T y = 0 (Stiemke's alternative, one small LP). Then ``v_i + t z``
    for small t > 0 fits the data exactly as well: the row is not identified.
    Cost O(n d^2) per row, memory O(n d) (never an n x n factor); ``deadline`` (a
    ``time.monotonic()`` value) raises TimeoutError between rows once passed.
    """
    smax = float(np.linalg.norm(X, 2)) if X.size else 0.0
    d = X.shape[1]
    out = []
    for v in np.atleast_2d(V):
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError("time_limit passed while checking which rows the samples determine")
        z = X @ v
        scale = max_abs(z)
        S = z > ACTIVE_TOL * scale
        B = np.abs(z) <= ACTIVE_TOL * scale
        if not S.any():
            out.append(np.eye(d))
            continue
        N = _null_basis(X[S], DIRECTION_TOL * max(smax, 1e-300))
        if N.shape[0] and B.any() and not _cone_is_free(X[B] @ N.T, smax):
            N = np.zeros((0, d))
        out.append(N)
    return out


def _cone_is_free(A, smax):
    """Is {w : A w <= 0} larger than {0}? (Stiemke: no iff rank A = cols and y > 0, A^T y = 0.)"""
    from scipy.optimize import linprog

    sv = np.linalg.svd(A, compute_uv=False)
    if int(np.sum(sv > DIRECTION_TOL * max(smax, 1e-300))) < A.shape[1]:
        return True
    p = A.shape[0]
    res = linprog(np.zeros(p), A_eq=A.T, b_eq=np.zeros(A.shape[1]), bounds=[(1.0, None)] * p, method="highs")
    return res.status != 0


def minimum_norm_rows(X, V, U, directions, input_null=None):
    """The minimum-norm representative of a non-unique fit: each row projected off its
    undetermined directions (the least-norm solution of its active equations), kept only
    where it leaves the inactive samples non-positive (then it is also the least-norm row
    with the same rectified vector); rows renormalised with U rescaled so the outputs are
    unchanged.

    Elsewhere the row is projected off ``input_null`` (the null space of X, which never
    changes X v).

    Returns (U, V, per-row flags: True where the projection was the minimum-norm one).
    """
    V = np.array(V, dtype=np.float64)
    flags = []
    for i, N in enumerate(directions):
        if N.shape[0] == 0:
            flags.append(True)
            continue
        v = V[i] - (V[i] @ N.T) @ N
        z0, z = X @ V[i], X @ v
        off = z0 <= ACTIVE_TOL * max_abs(z0)
        ok = bool(np.all(z[off] <= ACTIVE_TOL * max_abs(z0))) and bool(np.linalg.norm(v) > 0)
        if ok:
            V[i] = v
        elif input_null is not None and input_null.shape[0]:
            V[i] = V[i] - (V[i] @ input_null.T) @ input_null
        flags.append(ok)
    s = np.linalg.norm(V, axis=1)
    return np.asarray(U) * s[None, :], V / s[:, None], tuple(flags)


#: Largest |b| (rows of unit norm) and |c| / rms(Y) of a refined network still read as
#: bias-free: rounding of an exact bias-free fit leaves them near 1e-15.
BIAS_FREE_TOL = 1e-8


class ExactRefinement(NamedTuple):
    """Outcome of :func:`refine_to_exact`."""

    exact: bool  #: the certificate holds: residual <= tol over all samples (and bias-free if asked)
    U: np.ndarray  #: (m, k)
    V: np.ndarray  #: (k, d), unit rows
    b: Optional[np.ndarray]  #: (k,), None for a bias-free result
    c: Optional[np.ndarray]  #: (m,), None for a bias-free result
    residual: float  #: relative residual over all samples of the returned network
    rounds: int  #: activation-region rounds run (0: the refinement did not reach tol, not kept)
    biased: bool  #: the refined network needs hidden biases or an offset (bias-free asked)


def refine_to_exact(X, Y, U, V, b=None, c=None, *, tol, bias_free, subset=None, threads=0, max_rounds=10):
    """Try to make an approximate network exact on noiseless data (beyond the papers).

    Runs the activation-region refinement from ``(U, V, b, c)`` on ``subset`` (default all
    samples) through :func:`relufast.stages.refine.refine_if_noiseless` (kept only when it
    reaches ``tol`` there with every unit determined), refits the output layer on it
    (:func:`fit_network`; without biases for ``bias_free``, with the offset otherwise) and
    certifies that network over all samples in one pass. With ``bias_free`` (methods whose
    model has no biases) the refined b and c must vanish first (at most
    :data:`BIAS_FREE_TOL`, or ``tol`` when larger, e.g. at float32 precision). Shared by
    the methods that estimate an approximate network and may meet noiseless data
    (bjw19-noisy; any method can call it).

    Parameters
    ----------
    X : ndarray of shape (n, d) or Samples
        All samples (a :class:`relufast.stages.reduce.Samples` for memmaps, dask or MPI;
        Y is then ignored and ``subset`` required).
    Y : ndarray of shape (n, m)
    U, V : ndarray of shape (m, k) and (k, d)
        The approximate network (rows within a few tenths of a radian of the truth).
    b, c : ndarray of shape (k,) and (m,), optional
        Approximate biases (default zero).
    tol : float
        Largest relative residual accepted as exact (already at the outputs' precision).
    bias_free : bool
    subset : pair of ndarray, optional
        In-memory samples (X_s, Y_s) the refinement and the fit of the output layer use.
    threads : int, default=0
    max_rounds : int, default=10

    Returns
    -------
    ExactRefinement
        ``exact`` is True only when the certificate over all samples holds; noisy data end
        with ``exact`` False after a round or two (the residual stops falling).
    """
    from .refine import refine_if_noiseless

    Xs, Ys = (X, Y) if subset is None else subset
    k = V.shape[0]
    rr, probe_residual = refine_if_noiseless(
        Xs, Ys, U, V, np.zeros(k) if b is None else b, c, tol=tol, max_rounds=max_rounds, n_jobs=threads or None
    )
    if rr is None:  # noisy data (or units the regions leave undetermined): nothing to certify
        return ExactRefinement(False, U, V, b, c, probe_residual, 0, False)
    if bias_free:
        bias_tol = max(BIAS_FREE_TOL, tol)
        scale = max(float(np.sqrt(np.mean(Ys * Ys))), 1e-300)
        if np.max(np.abs(rr.b)) > bias_tol or np.max(np.abs(rr.c)) > bias_tol * scale:
            return ExactRefinement(False, rr.U, rr.V, rr.b, rr.c, rr.residual, rr.rounds, True)
        fit = fit_network(X, Y, rr.V, subset=(Xs, Ys), threads=threads)
        return ExactRefinement(bool(fit.residual <= tol), fit.U, rr.V, None, None, fit.residual, rr.rounds, False)
    fit = fit_network(X, Y, rr.V, rr.b, intercept=True, subset=(Xs, Ys), threads=threads)
    return ExactRefinement(bool(fit.residual <= tol), fit.U, rr.V, rr.b, fit.c, fit.residual, rr.rounds, False)
