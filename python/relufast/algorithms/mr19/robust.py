"""MR19 Problem D: robust recovery of codes under sparse outliers (Huber / QP on HiGHS)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg as sla

from ..._blas import single_threaded_blas
from ..._result import _freeze, warn
from ..._validation import as_float_matrix
from ...stages import highs
from ...stages.reduce import is_dask
from .laws import _check_law, bias_moments, calibrated_lam, theory_lam

#: Detected outlier fraction above which Theorem 4's guarantee is void.
TOO_MANY_OUTLIERS = 0.3
#: Relative size below which an entry of the QP's e = p - q is rounding, not an outlier.
QP_ZERO = 1e-12
#: HiGHS QP regularisation used when the unregularised solve fails (moves the optimum ~1e-12).
QP_FALLBACK_REGULARIZATION = 1e-12
#: mu at or below this makes c / mu unstable (almost every output is zero).
SMALL_MU = 0.05


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
