"""MR19: representation learning and robust recovery in the single-layer ReLU model.

A. Mazumdar and A. S. Rawat, "Representation Learning and Recovery in the ReLU Model",
arXiv:1803.04304, 2018 (conference version: "Learning and Recovery in the ReLU Model",
57th Allerton Conference on Communication, Control, and Computing, 2019).

The paper studies two problems about ``y = relu(A c + b)`` with A of shape (d, k). It writes
vectors as columns; here a batch of codes or samples is stacked as rows (relufast's
convention), so the paper's d x n matrix Y is our ``Y.T``.

Problem D, robust recovery (Section 4), from ``v = relu(A c* + b) + e* + w`` with A known and
Gaussian, e* s-sparse, |w| <= delta:

- :func:`robust_recover`: the generalized LASSO, program (47), Theorem 4. It estimates
  ``mu c*`` with ``mu = E[g relu(g + B)] = E[Phi(B)]`` (and e*). Two exact solvers: a convex
  QP through HiGHS (:class:`relufast.highs.QPSession`), and the equivalent Huber regression in
  k variables solved by active-set Newton (derived for relufast; not in the paper).
- :func:`bias_moments` (mu, and sigma^2, eta^2 of eq. (58)), :func:`theory_lam` (Theorem 4's
  lambda = 2 ||z + w||_inf / d, needs the truth), :func:`calibrated_lam` (relufast's
  default, a quantile of |z|; not in the paper).

Problem R, representation learning (Section 3), from ``Y = relu(C A^T + 1 b^T)``:

- :func:`ml_estimate`: the maximum-likelihood estimate of M, program (34), solved in closed
  form row by row, with a documented fill rule for the entries (34) leaves free.
- :func:`column_space`: Section 3.2 (top-k SVD of the estimate), plus two estimators that are
  NOT in the paper: the centred-SVD baseline and a low-rank "Tobit" nuclear-norm extension.
  The paper's step taken literally recovers the column space poorly (docs/mr19.md).
- :func:`subspace_distance` (principal angles, ||sin Theta||_F, Procrustes distance),
  :func:`davis_kahan_bound` (Theorem 5, eqs. (71)-(72)) and :func:`theorem3_constants`
  (the constants of Theorem 3's bound (35), reported, never relied on).
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg as sla
from scipy.optimize import brentq, minimize_scalar
from scipy.special import ndtr

from .._blas import single_threaded_blas
from .._result import _freeze, warn
from .._validation import as_float_matrix, check_positive_int
from ..stages import highs
from ..stages.reduce import is_dask

__all__ = [
    "RobustRecovery",
    "robust_recover",
    "bias_moments",
    "abs_z_tail",
    "calibrated_lam",
    "theory_lam",
    "InfeasibleError",
    "MLEstimate",
    "ml_estimate",
    "ColumnSpace",
    "column_space",
    "principal_angles",
    "subspace_distance",
    "davis_kahan_bound",
    "theorem3_constants",
]

_SQRT2PI = math.sqrt(2.0 * math.pi)

#: Detected outlier fraction above which Theorem 4's guarantee is void.
TOO_MANY_OUTLIERS = 0.3
#: Relative size below which an entry of the QP's e = p - q is rounding, not an outlier.
QP_ZERO = 1e-12
#: HiGHS QP regularisation used when the unregularised solve fails (moves the optimum ~1e-12).
QP_FALLBACK_REGULARIZATION = 1e-12
#: mu at or below this makes c / mu unstable (almost every output is zero).
SMALL_MU = 0.05


def _phi(x):
    return np.exp(-0.5 * np.square(x)) / _SQRT2PI


# ----------------------------------------------------------------------------------------------
# Bias laws
# ----------------------------------------------------------------------------------------------


def _check_law(bias, *, allow_point=True, name="bias"):
    """A bias law: a real number (every coordinate has this bias) or a scipy.stats frozen
    continuous distribution (i.i.d. coordinates)."""
    if hasattr(bias, "cdf") and hasattr(bias, "pdf") and hasattr(bias, "expect"):
        return bias
    if isinstance(bias, numbers.Real) and not isinstance(bias, (bool, np.bool_)):
        if not np.isfinite(float(bias)):
            raise ValueError(f"{name} must be finite; got {bias!r}")
        if not allow_point:
            raise ValueError(
                f"{name} must be a law with a density (a scipy.stats frozen continuous distribution): "
                f"the likelihood (33)-(34) needs p; got the constant {bias!r}"
            )
        return float(bias)
    raise TypeError(
        f"{name} must be a real number or a scipy.stats frozen continuous distribution; got {type(bias).__name__}"
    )


def _law_key(law):
    """A hashable key for a bias law (a constant, or a frozen law's name and parameters), or
    None when the law's parameters are not plain numbers (then nothing is cached)."""
    if isinstance(law, float):
        return ("const", law)
    try:
        key = (law.dist.name, tuple(law.args), tuple(sorted(law.kwds.items())))
        hash(key)
        return key
    except (AttributeError, TypeError):
        return None


#: mu, sigma^2, eta^2 and the calibrated lambda depend only on (law, d, delta): cached.
_CACHE: dict = {}


def _cached(key, compute):
    if key is None or any(part is None for part in key):
        return compute()
    if key not in _CACHE:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        _CACHE[key] = compute()
    return _CACHE[key]


def _expect(law, f):
    """E[f(B)] for a constant or a frozen law."""
    if isinstance(law, float):
        return float(f(np.float64(law)))
    return float(law.expect(f))


def bias_moments(bias=0.0):
    """Theorem 4's scale parameters for a bias law.

    ``mu = E[g relu(g + B)] = E[Phi(B)]`` (the target of (47) is mu c*), and the two
    parameters of eq. (58), ``sigma^2 = E[(relu(g + B) - mu g)^2]`` and
    ``eta^2 = E[g^2 (relu(g + B) - mu g)^2]``, g ~ N(0, 1) independent of B. The closed
    forms (Stein's lemma and truncated-normal moments) are derived for relufast, not in
    the paper.

    Parameters
    ----------
    bias : float or scipy.stats frozen distribution, default=0.0

    Returns
    -------
    mu, sigma2, eta2 : float
    """
    law = _check_law(bias)
    return _cached(("moments", _law_key(law)), lambda: _bias_moments(law))


def _bias_moments(law):
    mu = _expect(law, ndtr)
    s2 = _expect(law, lambda b: (1.0 + b * b) * ndtr(b) + b * _phi(b)) - mu * mu

    def m234(b):
        M2 = ndtr(b) - b * _phi(b)
        M3 = (b * b + 2.0) * _phi(b)
        M4 = 3.0 * M2 - b**3 * _phi(b)
        return M2, M3, M4

    def first(b):
        M2, M3, M4 = m234(b)
        return M4 + 2.0 * b * M3 + b * b * M2

    def second(b):
        _, M3, M4 = m234(b)
        return M4 + b * M3

    eta2 = _expect(law, first) - 2.0 * mu * _expect(law, second) + 3.0 * mu * mu
    return mu, s2, eta2


def _tail_fixed_b(t, b, mu):
    """P(|Z| > t), Z = relu(G + b) - mu G, for a fixed b and the law's mu in (0, 1)."""
    a = 1.0 - mu

    def up(lo):  # P(G > lo)
        return ndtr(-lo)

    def between(lo, hi):
        return np.where(hi > lo, ndtr(hi) - ndtr(lo), 0.0)

    # G > -b: Z = (1 - mu) G + b;  G <= -b: Z = -mu G.
    return (
        up(np.maximum(-b, (t - b) / a))
        + between(-b, (-t - b) / a)
        + between(t / mu, -b)
        + ndtr(np.minimum(-t / mu, -b))
    )


def abs_z_tail(t, bias=0.0):
    """P(|Z| > t) for the misfit ``Z = relu(G + B) - mu G`` of one coordinate (closed form
    for a constant bias, integrated over the law otherwise). Derived for relufast."""
    law = _check_law(bias)
    mu = _expect(law, ndtr)
    if not 0.0 < mu < 1.0:
        raise ValueError(f"the bias law gives mu = {mu}; need 0 < mu < 1")
    return _expect(law, lambda b: _tail_fixed_b(t, b, mu))


def calibrated_lam(d, bias=0.0, delta=0.0, *, kappa=2.0):
    """relufast's default lambda for (47): ``kappa (q_{1-1/d}(|Z|) + delta) / d``.

    Theorem 4 asks for ``lambda >= 2 ||z + w||_inf / d``; ``||z||_inf`` over d coordinates is
    about the (1 - 1/d)-quantile of |Z|, found here by bisection on :func:`abs_z_tail`.
    Assumes ``||c*|| = 1`` as Theorem 4 does (lambda scales with ``||c*||``). Not in the
    paper. For b = 0: ``tau = lambda d = Phi^{-1}(1 - 1/(2d)) + 2 delta``.
    """
    d = check_positive_int(d, "d", minimum=2)
    law = _check_law(bias)
    key = _law_key(law)
    return _cached(
        ("lam", key, d, float(delta), float(kappa)) if key is not None else None,
        lambda: _calibrated_lam(d, law, float(delta), float(kappa)),
    )


def _calibrated_lam(d, law, delta, kappa):
    mu = bias_moments(law)[0]
    if not 0.0 < mu < 1.0:
        raise ValueError(f"the bias law gives mu = {mu}; need 0 < mu < 1")
    target = 1.0 / d

    def g(t):
        return _expect(law, lambda b: _tail_fixed_b(t, b, mu)) - target

    hi = 1.0
    while g(hi) > 0:
        hi *= 2.0
    q = brentq(g, 0.0, hi, xtol=1e-12)
    return kappa * (q + float(delta)) / d


def theory_lam(A, c, b, w, *, bias=None):
    """Theorem 4's lambda, ``2 ||z + w||_inf / d`` with ``z = relu(A c + b) - mu A c``.

    Needs the truth (c*, b, w), so it is for tests and studies. ``bias`` (the law, for mu)
    defaults to the constant ``b[0]`` when every entry of b is equal.
    """
    A = np.asarray(A, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    b = np.broadcast_to(np.asarray(b, dtype=np.float64), np.shape(w))
    if bias is None:
        if not np.all(b == b.flat[0]):
            raise ValueError("b varies across coordinates: pass its law as bias= (for mu)")
        bias = float(b.flat[0])
    mu = bias_moments(bias)[0]
    Ac = c @ A.T
    z = np.maximum(Ac + b, 0.0) - mu * Ac
    return 2.0 * np.max(np.abs(z + w), axis=-1) / A.shape[0]


# ----------------------------------------------------------------------------------------------
# Problem D: the generalized LASSO (47)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RobustRecovery:
    """Result of :func:`robust_recover` (MR19 Section 4, program (47)).

    For a batch (v of shape (n_codes, d)) every per-code field gains a leading axis and
    ``support`` is a tuple of arrays.

    Attributes
    ----------
    c : ndarray of shape (k,) or (n_codes, k)
        The minimiser c-hat of (47): an estimate of ``mu c*`` (Theorem 4).
    c_scaled : ndarray or None
        ``c / mu``, an estimate of c* (None when the bias law is not given).
    outliers : ndarray of shape (d,) or (n_codes, d)
        e-hat, the estimate of the outliers e* (``soft(v - A c, tau)``).
    support : ndarray or tuple of ndarray
        Sorted indices where e-hat is nonzero.
    lam : float or ndarray of shape (n_codes,)
        lambda of (47); ``tau = lam * d`` is the threshold in residual units.
    mu : float or None
        ``E[Phi(B)]`` of the bias law.
    status : str
        ``"optimal"``, ``"non_unique"`` (|inliers| < k or a singular inlier matrix: c-hat is
        not unique; a 1e-12 ridge picks one), ``"iteration_limit"`` or a HiGHS status.
    message : str
    solver : str
    iterations : int or ndarray
        Newton steps (Huber) or QP iterations (HiGHS) per code.
    kkt_residual : float or ndarray
        Largest relative violation of the optimality conditions of (47):
        ``||A^T r||_inf / (||A||_F ||v||)``, ``(|r_i| - tau)_+ / tau`` and, on the support,
        ``|r_i - tau sign(e_i)| / tau``, with ``r = v - A c - e``.
    debiased : bool
    seconds : float
    diagnostics : mapping
    """

    c: np.ndarray
    c_scaled: np.ndarray | None
    outliers: np.ndarray
    support: Any
    lam: Any
    mu: float | None
    status: str
    message: str
    solver: str
    iterations: Any
    kkt_residual: Any
    debiased: bool = False
    seconds: float = float("nan")
    diagnostics: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "diagnostics", _freeze(self.diagnostics))
        for name in ("c", "c_scaled", "outliers"):
            a = getattr(self, name)
            if a is not None:
                a = np.array(a, dtype=np.float64, copy=True)
                a.setflags(write=False)
                object.__setattr__(self, name, a)

    @property
    def tau(self):
        """The threshold in residual units, ``lam * d``."""
        return np.asarray(self.lam) * self.outliers.shape[-1]

    def __repr__(self):
        n = "" if self.c.ndim == 1 else f", n_codes={self.c.shape[0]}"
        s = len(self.support) if self.c.ndim == 1 else int(sum(len(x) for x in self.support))
        return (
            f"RobustRecovery(solver={self.solver!r}, status={self.status!r}{n}, k={self.c.shape[-1]}, "
            f"d={self.outliers.shape[-1]}, outliers_found={s}, "
            f"kkt_residual={float(np.max(self.kkt_residual)):.2g})"
        )


def _huber_value(u, t):
    a = np.abs(u)
    return float(np.sum(np.where(a <= t, 0.5 * u * u, t * a - 0.5 * t * t)))


def _huber_newton(A, G, v, c, t, max_iter):
    """Active-set Newton for ``min_c sum_i H_t(v_i - a_i^T c)`` from c (derived for relufast).

    On a fixed partition (inliers I, outliers O with signs) the objective is quadratic, so
    a full Newton step lands on that piece's minimiser; when the partition does not change
    the point is exact. Returns (c, iterations, converged, non_unique), non_unique judged at
    the solution.
    """
    d, k = A.shape
    u = v - A @ c
    gscale = 1.0 + float(np.abs(A.T @ v).max())
    for it in range(1, max_iter + 1):
        out = np.abs(u) > t
        sign = np.sign(u) * out
        g = A.T @ np.clip(u, -t, t)  # minus the gradient
        O = np.flatnonzero(out)
        Hc = None
        if d - O.size >= k:
            if 2 * O.size <= d:  # H = A_I^T A_I as a downdate of the Gram matrix
                AO = A[O]
                H = G - AO.T @ AO
            else:
                AI = A[~out]
                H = AI.T @ AI
            try:
                Hc = sla.cho_factor(H, check_finite=False)
                if np.min(np.diag(Hc[0])) ** 2 <= 1e-13 * np.max(np.diag(G)):
                    Hc = None
            except np.linalg.LinAlgError:
                Hc = None
        if Hc is None:  # fewer than k inliers or a singular inlier matrix: regularise the step
            AI = A[~out]
            Hc = sla.cho_factor(AI.T @ AI + 1e-12 * np.trace(G) / k * np.eye(k), check_finite=False)
        step = sla.cho_solve(Hc, g, check_finite=False)
        f0 = _huber_value(u, t)
        slope = float(g @ step)
        s = 1.0
        while True:  # Armijo backtracking (a full step is exact on an unchanged partition)
            c_new = c + s * step
            u_new = v - A @ c_new
            if _huber_value(u_new, t) <= f0 - 1e-4 * s * slope + 1e-15 * abs(f0) or s < 1e-12:
                break
            s *= 0.5
        c, u = c_new, u_new
        out_new = np.abs(u) > t
        same = s == 1.0 and np.array_equal(np.sign(u) * out_new, sign)
        if same or float(np.abs(A.T @ np.clip(u, -t, t)).max()) <= 1e-14 * gscale:
            return c, it, True, _non_unique(A, u, t)
    return c, max_iter, False, _non_unique(A, u, t)


def _huber_rows(U, t):
    a = np.abs(U)
    return np.where(a <= t, 0.5 * U * U, t * a - 0.5 * t * t).sum(axis=1)


#: Codes per block of the batched Newton (bounds the residual matrix to ~16 MB).
_BLOCK_ENTRIES = 2_000_000


def _newton_steps(A, G, out, Gr):
    """Newton steps ``(A^T A - A_O^T A_O)^{-1} A^T psi`` for a block of codes (rows of the
    boolean outlier mask ``out``), with the downdates summed per code and the k x k systems
    checked (Cholesky) and solved in one batched call. Returns (steps, ok); ok is False
    where the inlier matrix is singular or has fewer than k rows."""
    na, d = out.shape
    k = A.shape[1]
    n_out = out.sum(axis=1)
    ok = d - n_out >= k
    H = np.broadcast_to(G, (na, k, k)).copy()
    r, c = np.nonzero(out & (2 * n_out <= d)[:, None])
    if r.size:
        Ac = A[c]
        starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
        H[r[starts]] -= np.add.reduceat(Ac[:, :, None] * Ac[:, None, :], starts, axis=0)
    for i in np.flatnonzero(2 * n_out > d):  # mostly outliers: form A_I^T A_I directly
        AI = A[~out[i]]
        H[i] = AI.T @ AI
    floor = 1e-13 * np.max(np.diag(G))
    steps = np.zeros((na, k))
    idx = np.flatnonzero(ok)
    try:
        L = np.linalg.cholesky(H[idx])
        good = np.min(np.diagonal(L, axis1=1, axis2=2), axis=1) ** 2 > floor
    except np.linalg.LinAlgError:  # some code is singular: find which, one at a time
        good = np.array([np.linalg.eigvalsh(H[i])[0] > floor for i in idx], dtype=bool)
    ok[idx[~good]] = False
    idx = idx[good]
    if idx.size:
        steps[idx] = np.linalg.solve(H[idx], Gr[idx][:, :, None])[:, :, 0]
    return steps, ok


def _huber_newton_batch(A, G, V, C0, taus, max_iter, rounds=3):
    """Batched active-set Newton for many codes sharing A.

    Residuals of all codes come from one GEMM per round; each code then needs only its
    k x k system ``A^T A - A_O^T A_O`` (O its current outliers). A code whose full step does
    not decrease the objective, whose inlier matrix is singular, or which is not done after
    ``rounds`` full steps, continues in :func:`_huber_newton` (line search).
    Returns (C, iterations, converged, non_unique).
    """
    N, d = V.shape
    C = C0.copy()
    iters = np.zeros(N, dtype=np.int64)
    done = np.zeros(N, dtype=bool)
    nonu = np.zeros(N, dtype=bool)
    block = max(1, _BLOCK_ENTRIES // d)
    for b0 in range(0, N, block):
        act = np.arange(b0, min(N, b0 + block))
        U = V[act] - C[act] @ A.T
        for _ in range(min(rounds, max_iter)):
            if act.size == 0:
                break
            t = taus[act, None]
            out = np.abs(U) > t
            sgn = np.sign(U) * out
            Gr = np.clip(U, -t, t) @ A  # rows: A^T psi(u), minus the gradients
            steps, ok = _newton_steps(A, G, out, Gr)
            Cn = C[act] + steps
            Un = V[act] - Cn @ A.T
            unchanged = ok & np.all(np.sign(Un) * (np.abs(Un) > t) == sgn, axis=1)
            acc = unchanged.copy()  # an unchanged partition: the step is exact, so it decreased
            chk = np.flatnonzero(ok & ~unchanged)
            if chk.size:
                f0, f1 = _huber_rows(U[chk], t[chk]), _huber_rows(Un[chk], t[chk])
                slope = np.einsum("ij,ij->i", Gr[chk], steps[chk])
                acc[chk] = f1 <= f0 - 1e-4 * slope + 1e-15 * np.abs(f0)
            C[act[acc]] = Cn[acc]
            iters[act[acc]] += 1
            same = unchanged
            done[act[same]] = True  # a full step on an unchanged partition: exact, and H was regular
            keep = acc & ~same
            act, U = act[keep], Un[keep]
    for j in np.flatnonzero(~done):
        c, it, conv, nu = _huber_newton(A, G, V[j], C[j], taus[j], max(max_iter - iters[j], 1))
        C[j], iters[j], done[j], nonu[j] = c, iters[j] + it, conv, nu
    return C, iters, done, nonu


def _non_unique(A, u, t):
    """c-hat is unique iff the inliers at the solution (|u_i| <= t) span R^k."""
    AI = A[np.abs(u) <= t * (1 + 1e-12)]
    k = A.shape[1]
    if AI.shape[0] < k:
        return True
    ev = np.linalg.eigvalsh(AI.T @ AI)
    return bool(ev[0] <= 1e-13 * max(float(np.einsum("ij,ij->", A, A)), 1e-300))


def _kkt_rows(A, V, C, E, taus):
    """Largest relative violation of (47)'s optimality conditions, per code (rows)."""
    R = V - C @ A.T - E
    t = taus[:, None]
    scale = np.linalg.norm(A) * np.maximum(np.linalg.norm(V, axis=1), 1e-300)
    stat = np.abs(R @ A).max(axis=1) / scale
    box = np.maximum(np.abs(R) - t, 0.0).max(axis=1) / taus
    supp = np.where(E != 0, np.abs(R - t * np.sign(E)), 0.0).max(axis=1) / taus
    out = np.maximum(np.maximum(stat, box), supp)
    return np.where(np.isfinite(C).all(axis=1), out, np.nan)


def _qp_session(A, t):
    """The QP of (47) times d: columns (c, r, p, q) with e = p - q,
    ``min 1/2 ||r + v||^2 + t sum(p + q)`` s.t. ``A c + r + p - q = 0``, p, q >= 0.

    Here r is the residual minus v: the rows' right-hand sides are 0 and v enters the
    linear cost of r (``1/2 ||r + v||^2 = 1/2 ||r||^2 + v^T r + const``). With v as the
    rows' bounds instead, HiGHS 1.15's QP solver ended in "Solve error" (primal
    infeasibilities of 1e-4 after claiming optimality) when v held many tiny entries, as
    ReLU outputs with small noise do (d >= 500). The Hessian is diag(0_k, 1_d, 0_2d).
    Call :func:`_qp_set_v` before each solve.
    """
    import scipy.sparse as sp

    d, k = A.shape
    n = k + 3 * d
    hess = np.concatenate([np.zeros(k), np.ones(d), np.zeros(2 * d)])
    lower = np.concatenate([np.full(k + d, -highs.INF), np.zeros(2 * d)])
    cost = np.concatenate([np.zeros(k + d), np.full(2 * d, t)])
    s = highs.QPSession(n, hessian=hess, lower=lower, cost=cost, regularization=0.0)
    I = sp.identity(d, format="csr")
    s.add_rows(sp.hstack([sp.csr_matrix(A), I, I, -I], format="csr"), 0.0, 0.0)
    return s


def _check_lam(lam, n_codes):
    if isinstance(lam, str) or lam is None:
        return None
    arr = np.asarray(lam, dtype=np.float64) if not isinstance(lam, (bool, np.bool_)) else None
    if arr is None or arr.ndim > 1 or (arr.ndim == 1 and arr.shape[0] != n_codes):
        raise ValueError(
            f"lam must be None, 'calibrated', 'theory', a positive number or one per code ({n_codes}); got {lam!r}"
        )
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(
            "lam must be a positive finite number (with lam <= 0 the outlier vector absorbs the "
            f"whole residual and c is not determined); got {lam!r}"
        )
    return np.broadcast_to(arr, (n_codes,)).astype(np.float64)


def robust_recover(
    A, v, lam=None, *, solver="huber", debias=False, bias=0.0, delta=0.0, truth=None, max_iter=100, comm=None
):
    """Recover the code c* from ``v = relu(A c* + b) + e* + w`` (MR19 Section 4, program (47)).

    Solves the generalized LASSO

        minimize_{c, e}  ||v - A c - e||^2 / (2d) + lam ||e||_1

    which treats the ReLU observations as linear: by Plan and Vershynin's argument its
    minimiser estimates ``mu c*`` with ``mu = E[Phi(B)]`` (Theorem 4), and e-hat estimates
    the outliers.

    Parameters
    ----------
    A : array-like of shape (d, k)
        The known matrix (Theorem 4 assumes i.i.d. N(0, 1) entries), d > k.
    v : array-like of shape (d,) or (n_codes, d)
        Observations; a 2-D array holds several codes sharing A (rows), which are solved
        with one factorisation of ``A^T A`` (Huber) or one warm-started HiGHS model.
    lam : None, "calibrated", "theory", float or array of shape (n_codes,)
        lambda of (47). None or "calibrated": :func:`calibrated_lam` for ``bias`` and
        ``delta`` (relufast's default; not in the paper). "theory": Theorem 4's
        ``2 ||z + w||_inf / d`` (:func:`theory_lam`), which needs ``truth``.
    solver : {"huber", "highs"}, default="huber"
        "huber": minimise over e in closed form, ``e = soft(v - A c, tau)`` with
        ``tau = lam d``, which leaves Huber regression in k variables, solved by active-set
        Newton from the least-squares start (exact: the objective is piecewise quadratic;
        derived for relufast). "highs": the convex QP in (c, r, p, q) with ``e = p - q`` and
        a diagonal Hessian, solved by HiGHS (:class:`relufast.highs.QPSession`). Both give
        the same minimiser.
    debias : bool, default=False
        Refit c by least squares on the coordinates outside the support of e-hat, then set
        e-hat on the support to the residual (removes the soft-threshold shrinkage; an
        extension, not in the paper).
    bias : float, scipy.stats frozen distribution or None, default=0.0
        Law of the bias coordinates, for mu (``c_scaled``) and the calibrated lambda. None:
        unknown (then ``c_scaled`` is None and lam must be given).
    delta : float, default=0.0
        Bound on the dense noise ``||w||_inf``, for the calibrated lambda.
    truth : object with attributes c, b, w (e.g. :class:`relufast.planted.PlantedCodes`)
        Only for ``lam="theory"``.
    max_iter : int, default=100
        Newton steps per code (1-3 are typical).
    comm : None
        Refused with a ``ValueError`` (as are dask arrays, with a ``TypeError``): program
        (47) is one small problem per code with the known A, not a pass over samples that
        reduces over ranks or row blocks.

    Returns
    -------
    RobustRecovery

    Notes
    -----
    Huber path: ``A^T A`` is factored once; each Newton step costs O(dk + |O| k^2 + k^3)
    with O the current outliers. The HiGHS QP has k + 3d columns and dk + 3d nonzeros;
    its active-set solver takes O(d) iterations and is the cross-check, not the default.

    References
    ----------
    .. [1] A. Mazumdar and A. S. Rawat, "Representation Learning and Recovery in the ReLU
       Model", arXiv:1803.04304, Section 4, program (47), Theorem 4.
    """
    t0 = time.perf_counter()
    _whole_data_only("robust_recover", comm, A=A, v=v)
    A, V, single = _robust_inputs(A, v)
    N, d = V.shape
    if solver not in ("huber", "highs"):
        raise ValueError(f"solver must be 'huber' or 'highs'; got {solver!r}")
    law = None if bias is None else _check_law(bias)
    mu = None if law is None else bias_moments(law)[0]
    lam_arr = _resolve_lam(lam, A, N, law, delta, truth)
    taus = lam_arr * d
    with single_threaded_blas():
        if solver == "huber":
            C, E, iters, statuses = _solve_huber(A, V, taus, max_iter)
        else:
            C, E, iters, statuses = _solve_qp(A, V, taus)
        if debias:
            _debias(A, V, C, E)
        kkt = np.full(N, np.nan) if debias else _kkt_rows(A, V, C, E, taus)
    supports = tuple(np.flatnonzero(np.nan_to_num(E[j])) for j in range(N))
    frac = np.array([s.size / d for s in supports])
    status, message = _robust_outcome(statuses, supports, frac, mu)
    C_scaled = None if mu is None or mu <= 0 else C / mu
    pick = (lambda a: a[0]) if single else (lambda a: a)
    return RobustRecovery(
        c=pick(C),
        c_scaled=None if C_scaled is None else pick(C_scaled),
        outliers=pick(E),
        support=supports[0] if single else supports,
        lam=float(lam_arr[0]) if single else lam_arr.copy(),
        mu=mu,
        status=status,
        message=message,
        solver=solver,
        iterations=int(iters[0]) if single else iters,
        kkt_residual=float(kkt[0]) if single else kkt,
        debiased=bool(debias),
        seconds=time.perf_counter() - t0,
        diagnostics={"statuses": tuple(statuses), "outlier_fraction": pick(frac)},
    )


def _whole_data_only(function, comm, **arrays):
    """Refuse ``comm=`` and dask arrays: MR19's programs need their whole data in one process.

    Problem D (program (47)) is one small problem per code with the known A, not a pass
    over samples; Problem R's estimates are n x d matrices (M-hat of program (34), the
    Tobit iterate), not sums that reduce over row blocks. NumPy memmaps are accepted and
    read into memory.
    """
    if comm is not None:
        raise ValueError(
            f"mr19.{function} does not take comm=: MR19 is not a pass over samples that reduces "
            "(program (47) solves each code with the known A; program (34) and the Tobit fit "
            "estimate an n x d matrix), so it needs its whole data in one process; gather the "
            "rows on one rank first"
        )
    for name, value in arrays.items():
        if is_dask(value):
            raise TypeError(
                f"mr19.{function} needs {name} in memory (a NumPy array or memmap), not a dask "
                "array: its programs work on the whole matrix, not on row blocks that reduce; "
                f"call {name}.compute() first if it fits in memory"
            )


def _robust_inputs(A, v):
    """A (d, k) with d > k and the codes' observations V (n_codes, d); single-code flag."""
    A = as_float_matrix(A, "A")
    d, k = A.shape
    if d <= k:
        raise ValueError(f"A must have more rows than columns (d > k, as Theorem 4 assumes); got shape {A.shape}")
    v_in = np.asarray(v)
    if v_in.ndim not in (1, 2) or v_in.shape[-1] != d:
        raise ValueError(
            f"v must have shape ({d},) or (n_codes, {d}) to match A of shape ({d}, {k}); got shape {v_in.shape}"
        )
    single = v_in.ndim == 1
    return A, as_float_matrix(v_in.reshape(1, -1) if single else v_in, "v"), single


def _resolve_lam(lam, A, N, law, delta, truth):
    """lambda of program (47) per code: given, calibrated (not in the paper) or Thm 4's."""
    lam_arr = _check_lam(lam, N)
    if lam_arr is not None:
        return lam_arr
    mode = "calibrated" if lam is None else lam
    if mode == "calibrated":
        if law is None:
            raise ValueError("the calibrated lam needs the bias law (bias=...); pass bias or lam")
        return np.full(N, calibrated_lam(A.shape[0], law, delta))
    if mode == "theory":
        if truth is None or not all(hasattr(truth, a) for a in ("c", "b", "w")):
            raise ValueError("lam='theory' needs truth= with attributes c, b and w (e.g. a PlantedCodes)")
        lt = theory_lam(A, np.atleast_2d(truth.c), np.atleast_2d(truth.b), np.atleast_2d(truth.w), bias=law)
        return np.broadcast_to(lt, (N,)).astype(np.float64)
    raise ValueError(f"lam must be None, 'calibrated', 'theory' or a positive number; got {lam!r}")


def _solve_huber(A, V, taus, max_iter):
    """Program (47) as Huber regression in k variables (relufast's exact reformulation).

    Active-set Newton from the least-squares starts, one factorisation of ``A^T A`` for
    every code; ``e = soft(v - A c, tau)``. Returns C, E, iterations and statuses.
    """
    G = A.T @ A
    try:  # least-squares starts for every code: one factorisation of A^T A
        C0 = sla.cho_solve(sla.cho_factor(G, check_finite=False), A.T @ V.T, check_finite=False).T
    except np.linalg.LinAlgError:
        C0 = np.linalg.lstsq(A, V.T, rcond=None)[0].T
    C, iters, ok, nonu = _huber_newton_batch(A, G, V, C0, taus, max_iter)
    U = V - C @ A.T
    E = np.sign(U) * np.maximum(np.abs(U) - taus[:, None], 0.0)
    statuses = ["non_unique" if nonu[j] else ("optimal" if ok[j] else "iteration_limit") for j in range(len(V))]
    return C, E, iters, statuses


def _solve_qp(A, V, taus):
    """Program (47) as the convex QP in (c, r, p, q), e = p - q, through HiGHS (warm-started
    from the previous code's basis). Returns C, E, iterations and statuses."""
    (d, k), N = A.shape, len(V)
    C, E = np.zeros((N, k)), np.zeros((N, d))
    iters = np.zeros(N, dtype=np.int64)
    statuses = []
    sess = _qp_session(A, taus[0])
    r_cols = np.arange(k, k + d)
    pq_cols = np.arange(k + d, k + 3 * d)
    for j in range(N):
        if j and taus[j] != taus[j - 1]:
            sess.set_cost(pq_cols, taus[j])
        sess.set_cost(r_cols, V[j])
        res = sess.solve()  # warm from the previous code's basis
        if res.status != highs.LPStatus.OPTIMAL:
            # Without regularisation HiGHS can declare the problem non-convex when its
            # starting null space has no curvature (tiny d, many outliers); a 1e-12
            # regularisation moves the optimum by ~1e-12 only.
            sess.set_regularization(QP_FALLBACK_REGULARIZATION)
            res = sess.solve()
            sess.set_regularization(0.0)
        iters[j] = res.iterations
        if res.status == highs.LPStatus.OPTIMAL:
            C[j] = res.x[:k]
            e = res.x[k + d : k + 2 * d] - res.x[k + 2 * d :]
            # p - q can leave rounding (1e-16) where both are nonzero; that is e = 0
            E[j] = np.where(np.abs(e) > QP_ZERO * max(1.0, float(np.abs(V[j]).max())), e, 0.0)
            statuses.append("optimal")
        else:
            C[j], E[j] = np.nan, np.nan
            statuses.append(str(res.status))
    return C, E, iters, statuses


def _debias(A, V, C, E):
    """Least-squares refit of c off the support of e-hat, e-hat there the residual (in place;
    an extension, not in the paper)."""
    k = A.shape[1]
    for j in range(len(V)):
        S = E[j] != 0
        if S.any() and (~S).sum() >= k:
            C[j] = np.linalg.lstsq(A[~S], V[j, ~S], rcond=None)[0]
            E[j] = np.where(S, V[j] - A @ C[j], 0.0)


def _robust_outcome(statuses, supports, frac, mu):
    """The overall status and message of program (47); warns when Theorem 4's premises fail."""
    N = len(statuses)
    bad = [s for s in statuses if s != "optimal"]
    status = bad[0] if bad else "optimal"
    notes = []
    if bad:
        notes.append(
            f"{len(bad)} of {N} code(s) ended with status {status!r}"
            + (
                ": fewer than k inliers or a singular inlier matrix, c is not unique (a 1e-12 ridge picked one)"
                if status == "non_unique"
                else ": raise max_iter or check the data"
            )
        )
    if np.any(frac > TOO_MANY_OUTLIERS):
        notes.append(
            f"more than {TOO_MANY_OUTLIERS:.0%} of the coordinates were flagged as outliers "
            f"(max {frac.max():.0%}): Theorem 4's guarantee needs s log(d/s) small against d; "
            "increase lam or check the model"
        )
    if mu is not None and mu <= SMALL_MU:
        notes.append(f"mu = {mu:.3g} <= {SMALL_MU}: almost every output is zero and c / mu is unstable")
    if notes:
        message = "; ".join(notes)
        warn(message)
        return status, message
    return status, "optimal" + (
        "; no outliers detected (the solution is least squares)" if all(s.size == 0 for s in supports) else ""
    )


# ----------------------------------------------------------------------------------------------
# Problem R: maximum likelihood (34), column space (Section 3.2), extensions
# ----------------------------------------------------------------------------------------------


class InfeasibleError(ValueError):
    """Program (34) is infeasible: gamma is too small (or the margin too big) for some rows.

    Attributes
    ----------
    rows : ndarray
        Coordinates (the paper's rows of Y; our columns) whose constraints cannot hold.
    gamma_min : float
        The smallest gamma that makes every row feasible.
    """

    def __init__(self, message, rows, gamma_min):
        super().__init__(message)
        self.rows = rows
        self.gamma_min = gamma_min


#: scipy.stats laws whose density is symmetric and unimodal (mode = median).
_SYMMETRIC_UNIMODAL = ("norm", "laplace", "logistic", "cauchy", "t")


@dataclass(frozen=True)
class MLEstimate:
    """Result of :func:`ml_estimate` (MR19 program (34)), samples as rows.

    Attributes
    ----------
    M : ndarray of shape (n, d)
        The estimate of ``M = C A^T`` (the paper's M-hat transposed).
    beta : ndarray of shape (d,)
        Bias estimate per coordinate; NaN where the coordinate is zero in every sample.
    n_positive : ndarray of shape (d,)
        s_i, the number of positive observations of each coordinate.
    row_status : ndarray of shape (d,), str
        "ok", "zero_row", "all_positive" or "non_unique_bias".
    fill : str
        The rule used for the entries the ReLU cut (34 leaves them free).
    gamma : float
        The box ``||M||_inf <= gamma`` used (given, or the smallest feasible one).
    """

    M: np.ndarray
    beta: np.ndarray
    n_positive: np.ndarray
    row_status: np.ndarray
    fill: str
    gamma: float
    margin: float


def _mode_in(law, lo, hi):
    """argmax of log p over [lo, hi] (non-empty, within the support): clip(mode) for the
    unimodal laws relufast knows, the midpoint for a uniform law (flat: any point is
    optimal), a grid plus bounded refinement otherwise."""
    name = getattr(getattr(law, "dist", None), "name", "")
    if name in _SYMMETRIC_UNIMODAL:
        return np.clip(float(law.median()), lo, hi), "unimodal"
    if name == "expon":
        return np.clip(float(law.support()[0]), lo, hi), "unimodal"
    if name == "uniform":
        return 0.5 * (lo + hi), "flat"
    out = np.empty_like(lo)
    for i in range(lo.size):
        if hi[i] - lo[i] <= 0:
            out[i] = lo[i]
            continue
        grid = np.linspace(lo[i], hi[i], 201)
        j = int(np.argmax(law.logpdf(grid)))
        a, b = grid[max(j - 1, 0)], grid[min(j + 1, 200)]
        r = minimize_scalar(lambda x: -law.logpdf(x), bounds=(a, b), method="bounded", options={"xatol": 1e-12})
        out[i] = r.x if -r.fun >= law.logpdf(grid[j]) else grid[j]
    return out, "searched"


def _positive_stats(Y, pos_tol):
    P = Y > pos_tol
    s = P.sum(axis=0)
    big = np.where(P, Y, -np.inf).max(axis=0)
    small = np.where(P, Y, np.inf).min(axis=0)
    return P, s, big, small


def _check_Y(Y):
    Y = as_float_matrix(Y, "Y")
    if (Y < 0).any():
        raise ValueError(f"Y must be a ReLU output (entries >= 0); found {int((Y < 0).sum())} negative entries")
    return Y


def ml_estimate(Y, *, bias, gamma=None, margin=0.0, fill="midpoint", pos_tol=0.0, comm=None):
    """The maximum-likelihood estimate of M, MR19 program (34), solved exactly row by row.

    (34) maximises the likelihood (33) over ``||X||_inf <= gamma`` and the constraint set
    (29), read in its index-matched (convex) form: in a row i of the paper's Y (a
    coordinate here), ``X_ij + beta_i = Y_ij`` on the positive entries N_i, and the cut
    entries lie at least ``margin`` below them. Eliminating X leaves, per row,
    ``beta_i = argmax log p`` over ``[max_{N_i} Y - gamma, min_{N_i} Y + gamma - margin]``
    (clip of the mode for a unimodal law, the midpoint for a uniform one). Rows without a
    positive entry get ``X = -gamma``. (34) has no rank term, so the cut entries are left
    free in ``[-gamma, min_{N_i} Y - beta_i - margin]``; ``fill`` chooses one.

    Parameters
    ----------
    Y : array-like of shape (n_samples, d)
        ReLU outputs (samples as rows; the paper's Y transposed).
    bias : scipy.stats frozen continuous distribution
        The bias law p (the likelihood needs a density).
    gamma : float, optional
        The box; default the smallest feasible value (times 1 + 1e-9).
    margin : float, default=0.0
        The paper's v in (29) (0 gives plain consistency).
    fill : {"midpoint", "upper", "lower"}, default="midpoint"
        Value of the cut entries within their interval (relufast's choice; the paper does
        not fix it). "lower" is -gamma.
    pos_tol : float, default=0.0
        Entries ``<= pos_tol`` count as zero (for slightly noisy Y).
    comm : None
        Refused with a ``ValueError`` (as is a dask Y, with a ``TypeError``): the estimate
        M-hat is an n x d matrix, not a sum over row blocks. A memmap Y is read into memory.

    Returns
    -------
    MLEstimate

    Raises
    ------
    InfeasibleError
        Some row cannot satisfy (34) with this gamma and margin; the message names the rows
        and the smallest workable gamma.
    """
    _whole_data_only("ml_estimate", comm, Y=Y)
    Y = _check_Y(Y)
    law = _check_law(bias, allow_point=False)
    n, d = Y.shape
    margin = float(margin)
    if not np.isfinite(margin) or margin < 0:
        raise ValueError(f"margin must be >= 0; got {margin!r}")
    if fill not in ("midpoint", "upper", "lower"):
        raise ValueError(f"fill must be 'midpoint', 'upper' or 'lower'; got {fill!r}")
    P, s, big, small = _positive_stats(Y, pos_tol)
    has = s > 0
    cut = s < n
    need = np.where(has, (big - small + margin * cut) / 2.0, 0.0)
    gamma_min = float(need.max()) if need.size else 0.0
    if gamma is None:
        gamma = max(gamma_min * (1.0 + 1e-9), np.finfo(float).tiny)
    gamma = float(gamma)
    if not np.isfinite(gamma) or gamma <= 0:
        raise ValueError(f"gamma must be a positive number; got {gamma!r}")
    if margin >= 2 * gamma:
        raise ValueError(f"margin must be smaller than 2 gamma = {2 * gamma}; got {margin}")
    if not has.any():
        raise ValueError("every coordinate of Y is zero in every sample: nothing is identifiable")
    lo = big - gamma
    hi = small + gamma - margin * cut
    s_lo, s_hi = law.support()
    lo, hi = np.maximum(lo, s_lo), np.minimum(hi, s_hi)
    bad = np.flatnonzero(has & (lo > hi))
    if bad.size:
        raise InfeasibleError(
            f"program (34) is infeasible for {bad.size} coordinate(s) (rows of the paper's Y) "
            f"{bad[:10].tolist()}{' ...' if bad.size > 10 else ''} with gamma = {gamma:g} and "
            f"margin = {margin:g}: need gamma >= {gamma_min:g} (and the bias law's support must "
            "meet each row's interval)",
            bad,
            gamma_min,
        )
    beta = np.full(d, np.nan)
    idx = np.flatnonzero(has)
    beta[idx], kind = _mode_in(law, lo[idx], hi[idx])
    status = np.where(has, np.where(cut, "ok", "all_positive"), "zero_row").astype(object)
    if kind == "flat":
        status[idx] = "non_unique_bias"
    top = np.where(has, small - beta - margin, -gamma)
    fill_val = {"midpoint": 0.5 * (top - gamma), "upper": top, "lower": np.full(d, -gamma)}[fill]
    fill_val = np.where(has, fill_val, -gamma)
    M = np.where(P, Y - np.where(has, beta, 0.0), fill_val)
    zero_frac = 1.0 - has.mean()
    if zero_frac > 0.5:
        warn(
            f"{zero_frac:.0%} of the coordinates are zero in every sample: (34) fills them with -gamma "
            "and they carry no information about the column space"
        )
    if kind == "searched":
        warn(
            "the bias law is not one relufast knows to be unimodal: beta was found by a 1-D grid search (nonconvex_ml)"
        )
    if margin > 0 and n > 1 + 2 * gamma / margin:
        warn(
            f"n = {n} > 1 + 2 gamma / margin = {1 + 2 * gamma / margin:.3g}: the premise of the paper's "
            "Lemma 2 (consecutive gaps >= margin) cannot hold"
        )
    return MLEstimate(
        M=M, beta=beta, n_positive=s, row_status=status.astype(str), fill=fill, gamma=gamma, margin=margin
    )


@dataclass(frozen=True)
class ColumnSpace:
    """Result of :func:`column_space`.

    Attributes
    ----------
    basis : ndarray of shape (d, k)
        Orthonormal basis of the estimated column space of A.
    singular_values : ndarray
        Leading singular values of the matrix whose top-k space is taken (k + 1 of them
        when available).
    gap_ratio : float
        ``sigma_{k+1} / sigma_k`` of that matrix (a weak gap makes the space unstable).
    method : str
    from_paper : bool
        True only for ``method="ml"`` (Section 3: program (34) then the top-k SVD).
    M : ndarray of shape (n, d) or None
        The estimate of M whose row space is taken ("ml", "tobit").
    beta : ndarray of shape (d,) or None
        Bias estimates ("ml", "tobit").
    iterations : int
    message : str
    """

    basis: np.ndarray
    singular_values: np.ndarray
    gap_ratio: float
    method: str
    from_paper: bool
    M: np.ndarray | None = None
    beta: np.ndarray | None = None
    iterations: int = 0
    message: str = ""
    seconds: float = float("nan")

    def __repr__(self):
        return (
            f"ColumnSpace(method={self.method!r}, from_paper={self.from_paper}, "
            f"basis{self.basis.shape}, gap_ratio={self.gap_ratio:.3g})"
        )


def _top_right(M, k):
    _, sv, Vt = np.linalg.svd(M, full_matrices=False)
    return Vt[:k].T.copy(), sv


def _log_prior_derivs(law, beta):
    """(d/db) log p and (d^2/db^2) log p; exact for a Gaussian, central differences otherwise."""
    if law is None:
        return np.zeros_like(beta), np.zeros_like(beta)
    if getattr(getattr(law, "dist", None), "name", "") == "norm":
        m, sd = law.mean(), law.std()
        return -(beta - m) / sd**2, np.full_like(beta, -1.0 / sd**2)
    h = 1e-4 * max(law.std(), 1e-8)
    f0, fp, fm = law.logpdf(beta), law.logpdf(beta + h), law.logpdf(beta - h)
    return (fp - fm) / (2 * h), np.minimum((fp - 2 * f0 + fm) / (h * h), 0.0)


def _tobit(Y, k, law, rho, max_iter, pos_tol):
    """Algorithm R3 (relufast extension, not in MR19): censored nuclear-norm estimate.

    minimize_{X, beta} 1/2 sum_{Y>0} (X + beta - Y)^2 + 1/2 sum_{Y=0} relu(X + beta)^2
                       + rho ||X||_* - sum_i log p(beta_i)
    by alternating three Newton steps in beta with one proximal-gradient step in X (unit
    step: the smooth part is 1-Lipschitz in X), ``X <- SVT_rho(X - grad)``.
    """
    P = Y > pos_tol
    n, d = Y.shape
    X = np.zeros_like(Y)
    beta = np.zeros(d) if law is None else np.full(d, float(law.median()))
    for _ in range(max_iter):
        for _ in range(3):
            Z = X + beta
            g = np.where(P, Z - Y, np.maximum(Z, 0.0)).sum(axis=0)
            h = np.where(P, 1.0, (Z > 0)).sum(axis=0)
            dl, ddl = _log_prior_derivs(law, beta)
            g, h = g - dl, h - ddl
            beta = beta - np.where(h > 0, g / np.where(h > 0, h, 1.0), 0.0)
        Z = X + beta
        grad = np.where(P, Z - Y, np.maximum(Z, 0.0))
        U, sv, Vt = np.linalg.svd(X - grad, full_matrices=False)
        sv = np.maximum(sv - rho, 0.0)
        r = int(np.count_nonzero(sv))
        X = (U[:, :r] * sv[:r]) @ Vt[:r]
    return X, beta


def column_space(
    Y,
    k,
    *,
    method="ml",
    bias=None,
    gamma=None,
    margin=0.0,
    fill="midpoint",
    pos_tol=0.0,
    rho=None,
    max_iter=300,
    gap_warn=0.5,
    comm=None,
):
    """Estimate the column space of A from ``Y = relu(C A^T + 1 b^T)`` (MR19 Section 3).

    Parameters
    ----------
    Y : array-like of shape (n_samples, d)
        ReLU outputs, samples as rows (the paper's Y transposed).
    k : int
        Dimension of the column space (given, as in the paper), 1 <= k < min(n, d).
    method : {"ml", "centered", "tobit"}, default="ml"
        - "ml" (FROM THE PAPER, Section 3.1 and 3.2): M-hat from program (34) by
          :func:`ml_estimate` with the given ``fill``, then the top-k singular space of
          M-hat. Taken literally this is weak: (34) has no rank term, the fill is not low
          rank and beta-hat is essentially the prior's mode (docs/mr19.md).
        - "centered" (NOT in the paper; a baseline): the top-k singular space of Y with each
          coordinate's mean over the samples removed.
        - "tobit" (NOT in the paper; relufast's low-rank extension in the spirit of
          Davenport et al.'s nuclear-norm likelihood, which the paper cites): a censored
          least-squares fit with per-coordinate offsets and a nuclear-norm penalty
          ``rho ||X||_*``, solved by proximal gradient, then the top-k space of X-hat.
    bias : scipy.stats frozen distribution, optional
        The bias law. Required by "ml"; used as a prior on beta by "tobit" (None: flat).
    gamma, margin, fill, pos_tol
        Passed to :func:`ml_estimate` ("ml" only).
    rho : float, optional
        "tobit" only: nuclear-norm weight; default ``0.03 sigma_1(Y)``.
    max_iter : int, default=300
        "tobit" only: proximal-gradient iterations.
    gap_warn : float, default=0.5
        Warn when ``sigma_{k+1} / sigma_k`` exceeds this.
    comm : None
        Refused with a ``ValueError`` (as is a dask Y, with a ``TypeError``): "ml" and
        "tobit" estimate an n x d matrix (the Tobit fit thresholds its singular values
        every iteration), so MR19 needs the whole Y in one process. A memmap Y is read into
        memory.

    Returns
    -------
    ColumnSpace

    References
    ----------
    .. [1] A. Mazumdar and A. S. Rawat, "Representation Learning and Recovery in the ReLU
       Model", arXiv:1803.04304, Section 3, program (34), Section 3.2 and Theorem 5.
    .. [2] M. A. Davenport, Y. Plan, E. van den Berg and M. Wootters, "1-bit matrix
       completion", Information and Inference 3(3), 2014 (the nuclear-norm likelihood that
       "tobit" adapts).
    """
    t0 = time.perf_counter()
    _whole_data_only("column_space", comm, Y=Y)
    Y = _check_Y(Y)
    n, d = Y.shape
    k = check_positive_int(k, "k")
    if k >= min(n, d):
        raise ValueError(f"k must be smaller than min(n_samples, d) = {min(n, d)}; got k = {k}")
    if method not in ("ml", "centered", "tobit"):
        raise ValueError(f"method must be 'ml', 'centered' or 'tobit'; got {method!r}")
    M = beta = None
    its = 0
    with single_threaded_blas():
        if method == "ml":
            if bias is None:
                raise ValueError(
                    "method='ml' needs the bias law (bias=a scipy.stats frozen distribution): "
                    "the likelihood (34) uses its density"
                )
            est = ml_estimate(Y, bias=bias, gamma=gamma, margin=margin, fill=fill, pos_tol=pos_tol)
            M, beta = est.M, est.beta
            basis, sv = _top_right(M, k)
        elif method == "centered":
            basis, sv = _top_right(Y - Y.mean(axis=0), k)
        else:
            law = None if bias is None else _check_law(bias, allow_point=False)
            if rho is None:
                rho = 0.03 * np.linalg.norm(Y, 2)
            rho = float(rho)
            if not np.isfinite(rho) or rho <= 0:
                raise ValueError(f"rho must be a positive number; got {rho!r}")
            max_iter = check_positive_int(max_iter, "max_iter")
            M, beta = _tobit(Y, k, law, rho, max_iter, pos_tol)
            its = max_iter
            basis, sv = _top_right(M, k)
    sk = sv[k - 1]
    if sk <= 1e-12 * max(sv[0], 1e-300):
        raise ValueError(
            f"the estimate has numerical rank < k = {k} (sigma_k = {sk:.3g}): rank_deficient_estimate; "
            "lower k or, for 'tobit', lower rho"
        )
    gap = float(sv[k] / sk) if sv.size > k else 0.0
    msg = "ok"
    if gap > gap_warn:
        msg = f"weak spectral gap: sigma_(k+1) / sigma_k = {gap:.2f} > {gap_warn}; the estimated space is unstable" + (
            " (expected for the paper's 'ml' estimate: try method='tobit')" if method == "ml" else ""
        )
        warn(msg)
    return ColumnSpace(
        basis=basis,
        singular_values=sv[: k + 1].copy(),
        gap_ratio=gap,
        method=method,
        from_paper=method == "ml",
        M=M,
        beta=beta,
        iterations=its,
        message=msg,
        seconds=time.perf_counter() - t0,
    )


def _orthonormal(B, name):
    B = as_float_matrix(B, name)
    Q, R = np.linalg.qr(B)
    if np.min(np.abs(np.diag(R))) <= 1e-12 * max(np.max(np.abs(np.diag(R))), 1e-300):
        raise ValueError(f"{name} must have full column rank; got a rank-deficient {B.shape} matrix")
    return Q


def principal_angles(U, V):
    """Principal angles (radians, ascending) between span(U) and span(V), both (d, k):
    :func:`scipy.linalg.subspace_angles` (accurate for small and large angles) after the
    shape and rank checks."""
    Qu, Qv = _orthonormal(U, "U"), _orthonormal(V, "V")
    if Qu.shape != Qv.shape:
        raise ValueError(f"U and V must have the same shape; got {Qu.shape} and {Qv.shape}")
    return np.sort(sla.subspace_angles(Qu, Qv))


def subspace_distance(estimate, truth):
    """Distances between the column spaces of ``estimate`` and ``truth`` (both (d, k)).

    Returns
    -------
    sin_theta : float
        ``||sin Theta||_F = sqrt(k - ||U^T U-hat||_F^2)`` (at most sqrt(k)).
    procrustes : float
        ``min_O ||U - U-hat O||_F`` over orthogonal O (the left side of (45)/(72)).
    angles : ndarray
        Principal angles in radians.
    """
    U, Uh = _orthonormal(truth, "truth"), _orthonormal(estimate, "estimate")
    if U.shape != Uh.shape:
        raise ValueError(f"estimate and truth must have the same shape; got {Uh.shape} and {U.shape}")
    ang = principal_angles(Uh, U)
    W, _, Zt = np.linalg.svd(Uh.T @ U)
    O = W @ Zt
    return float(np.linalg.norm(np.sin(ang))), float(np.linalg.norm(U - Uh @ O)), ang


def davis_kahan_bound(M, M_hat, k):
    """Right-hand sides of MR19 (71) and (72) (Theorem 5, Yu, Wang and Samworth's variant).

    With ``E = M_hat - M``, U and U-hat the top-k left singular vectors (paper's
    orientation: pass the paper's d x n matrices, or our (n, d) ones transposed):
    ``||sin Theta||_F <= 2 (2 s_1 + ||E||) min(sqrt(k) ||E||, ||E||_F) / (s_k^2 - s_{k+1}^2)``
    and the Procrustes distance is at most the same with 2^{3/2}.

    Returns
    -------
    sin_theta_bound, procrustes_bound : float
    """
    M = as_float_matrix(M, "M")
    M_hat = as_float_matrix(M_hat, "M_hat")
    if M.shape != M_hat.shape:
        raise ValueError(f"M and M_hat must have the same shape; got {M.shape} and {M_hat.shape}")
    k = check_positive_int(k, "k")
    sv = np.linalg.svd(M, compute_uv=False)
    E = M_hat - M
    en, ef = np.linalg.norm(E, 2), np.linalg.norm(E)
    gap = sv[k - 1] ** 2 - (sv[k] ** 2 if sv.size > k else 0.0)
    if gap <= 0:
        return float("inf"), float("inf")
    core = (2 * sv[0] + en) * min(math.sqrt(k) * en, ef) / gap
    return 2.0 * core, 2.0**1.5 * core


def theorem3_constants(bias, gamma, margin, *, grid=20001):
    """The constants of MR19 Theorem 3's bound (35), for reporting (never an oracle).

    ``beta = inf_{|x|<=gamma} p'(x)^2 / (4 p(x))``,
    ``L = max(sup p(x) / P(B <= x), sup |p'(x)| / p(x))`` (absolute value: the proof needs
    |p'|/p), ``omega = min over windows [t, t + margin] in [-gamma, gamma] of P(B in window)``
    and ``bound_per_d = C0 L gamma / (beta omega)`` with ``C0 = 4e`` (the paper's 4/e is a
    typo: (4/C0)^t <= 1/(d+n) with t = log(d+n) needs C0 >= 4e). ``bound_per_d`` bounds
    ``||M - M-hat||_F^2 / d``; it is inf (with a warning) when beta = 0, e.g. for a Gaussian
    bias whose mode lies in [-gamma, gamma].

    Returns
    -------
    dict with keys beta, L, omega, C0, bound_per_d
    """
    law = _check_law(bias, allow_point=False)
    gamma, margin = float(gamma), float(margin)
    if not gamma > 0 or not 0 < margin < 2 * gamma:
        raise ValueError(f"need gamma > 0 and 0 < margin < 2 gamma; got gamma={gamma}, margin={margin}")
    x = np.linspace(-gamma, gamma, grid)
    h = 1e-6 * max(gamma, 1.0)
    p = law.pdf(x)
    dp = (law.pdf(x + h) - law.pdf(x - h)) / (2 * h)
    with np.errstate(divide="ignore", invalid="ignore"):
        beta = float(np.min(np.where(p > 0, dp * dp / (4 * p), 0.0)))
        L = float(max(np.max(p / law.cdf(x)), np.max(np.abs(dp) / p)))
    t = np.linspace(-gamma, gamma - margin, grid)
    omega = float(np.min(law.cdf(t + margin) - law.cdf(t)))
    beta = 0.0 if beta < 1e-12 * max(np.max(p), 1e-300) else beta
    C0 = 4.0 * math.e
    bound = C0 * L * gamma / (beta * omega) if beta > 0 and omega > 0 else float("inf")
    if not np.isfinite(bound):
        warn(
            "Theorem 3's bound is vacuous for this law (beta_gamma(p) = 0: p is not strictly monotone on "
            "[-gamma, gamma]; vacuous_bound)"
        )
    return {"beta": beta, "L": L, "omega": omega, "C0": C0, "bound_per_d": bound}
