"""Goel and Panigrahy: the lowest layer of a deep network under high-threshold activations.

References
----------
.. [1] S. Goel, R. Panigrahy. Recovering the lowest layer of deep networks with high
   threshold activations. arXiv:1903.09231, 2019.

Model (samples are rows): ``f(x) = P(u(W x - t))`` with ``x ~ N(0, I_n)``, hidden weights W
(d, n) with unit rows, one known threshold t, an activation u (ReLU, the 0/1 step the paper
writes as sgn, sigmoid) and a polynomial P of the hidden units (multilinear in Sec. 2 of
the paper) whose linear coefficients are positive. relufast returns W as ``V`` with unit
rows; the result's ``U``, ``b``, ``c`` give only the one-hidden-layer part ``f_lin`` of f
(P's higher terms are not recovered).

Functions and the paper
-----------------------
``hermite_coeffs``
    App. A.1/A.3: the normalised Hermite coefficients of ``u(a - t)`` (closed forms for
    ReLU and step, quadrature otherwise).
``lowest_layer`` (``method="gp19"``)
    Step 1 (Sec. 2.1, App. B.1-B.4): ``landscape="tpm"`` (default) is the whitened
    fourth-order tensor power method, the change of variables of the paper's proof of
    Claim 1 (its minimisers are those of the landscape G); ``"one-by-one"`` minimises the
    paper's G(z) with deflation; ``"simultaneous"`` minimises G(B) of App. B.4 (Thm 11/12)
    with the corrected psi. Step 2 (Sec. 2.2): ``refine="paper"`` is Algorithm 1
    (RefineEstimate) with Algorithm 2 (EstimateTanAlpha); ``refine="stein"`` is a faster
    Stein-direction update that is NOT in the paper. With ``f=callable`` instead of data,
    the method draws its own Gaussian queries (the paper's oracle access).
``halfspaces`` (``method="gp19-halfspaces"``)
    Sec. 2.3, Thm 6: intersections (and unions) of halfspaces far from the origin.
``correlation_graph_supports`` (``method="gp19-support"``)
    Sec. 4, Algorithm 3 (ConstructCorrelationGraph), Thm 8.
``even_activation`` (``method="gp19-even"``)
    Sec. 4, Thm 10: even activations, orthonormal W, by deflated projected ascent of
    ``s_4 E[f h_4(z.x)]``.

Statistics of order 4 are streamed by the C++ kernel of
:class:`relufast.stages.moments.Hermite4Accumulator` (contractions with the current
directions, active-row filtering). Every pass over the samples goes through
:class:`relufast.stages.reduce.Samples`, so the methods take ``comm=`` (MPI ranks), memmaps
and dask arrays; Step 1 and Thm 10 use :func:`relufast.stages.tensor.power_iteration` with a
streamed operator. See ``docs/gp19.md`` for the paper's errata relufast corrects and for
the scale-out.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import integrate, optimize, special

from .._blas import single_threaded_blas
from .._result import Run, Status, warn
from .._validation import as_float_matrix, check_positive_int, check_random_state, resolve_n_jobs
from ..stages.moments import Hermite4Accumulator, SecondMomentAccumulator, hermite4_statistics
from ..stages.reduce import Samples, is_dask
from ..stages.tensor import power_iteration

__all__ = [
    "CITATION",
    "hermite_coeffs",
    "lowest_layer",
    "halfspaces",
    "correlation_graph_supports",
    "even_activation",
    "estimate_tan_alpha",
    "refine_estimate",
    "row_angles",
]

CITATION = (
    "S. Goel, R. Panigrahy. Recovering the lowest layer of deep networks with high threshold "
    "activations. arXiv:1903.09231, 2019."
)

#: Phi^{-1}(0.6) - Phi^{-1}(0.4): the spread of the 0.4 and 0.6 quantiles (Algorithm 2).
_QUANTILE_SPREAD = float(special.ndtri(0.6) - special.ndtri(0.4))
#: |u_4| below this fraction of |u_2| counts as a vanishing fourth Hermite coefficient.
_DEGENERATE_RATIO = 1e-3
#: Condition number of W (estimated from the top block of M_2) from which Step 1 warns:
#: a kappa = 11 teacher failed in our measurements (max angle > 1 rad), kappa = 1.6 worked.
_KAPPA_WARN = 10.0
#: Step 1 (TPM) stops once 1 - |cos| between iterates < 1e-24 (a move < 1.4e-12): the rows
#: are then at their fixed points to rounding, so one process, ranks and dask agree to 1e-13
#: at d = 10; with 1e-10 (a move of 1.4e-5) the stops fell on rounding-amplified paths (1e-8).
_TPM_TOL = 1e-24
#: L-BFGS's gtol for the landscapes of Sec. 2.1 and App. B.4.
_LANDSCAPE_GTOL = 1e-10

_STEP1_ACTIVATIONS = ("relu", "step", "sigmoid", "square")
#: The Stein update's background band sits this far below the band at (t_1 + t_2) / 2.
_BACKGROUND_SHIFT = 1.25
_EVEN = ("abs", "square")


class _Unit:
    """GP19's activation as the hidden map of a result's network (``u(V x + b)``)."""

    def __init__(self, name, reflect=False):
        self.name = name + ("(-a)" if reflect else "")
        self._u = _activation(name)
        self._reflect = reflect
        self.degree = {"relu": 1.0, "step": 0.0}.get(name)

    @property
    def homogeneous(self):
        return self.degree is not None

    def __call__(self, Z):
        Z = np.asarray(Z, dtype=np.float64)
        return self._u(-Z if self._reflect else Z)

    def __repr__(self):
        return f"gp19 activation {self.name}"


def _phi(t):
    return math.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi)


def _he(k, t):
    """Probabilists' Hermite polynomial He_k(t)."""
    a, b = 1.0, t
    if k == 0:
        return a
    for j in range(1, k):
        a, b = b, t * b - j * a
    return b


def _activation(name):
    from ..planted import GP19_ACTIVATIONS

    return GP19_ACTIVATIONS[name]


def hermite_coeffs(activation, t, kmax=4):
    """Normalised Hermite coefficients ``u_k = E[u(g - t) h_k(g)]``, ``h_k = He_k / sqrt(k!)``.

    Parameters
    ----------
    activation : {"relu", "step", "sigmoid", "abs", "square"}
    t : float
        Threshold.
    kmax : int, default=4

    Returns
    -------
    ndarray of shape (kmax + 1,)

    Notes
    -----
    GP19 App. A.3 with the exact forms (its Lemma 10 bound t^3 is t^2, erratum 4):
    ReLU ``u_0 = phi(t) - t Phi^c(t)``, ``u_1 = Phi^c(t)``, ``u_k = phi(t) He_{k-2}(t) / sqrt(k!)``;
    step ``u_0 = Phi^c(t)``, ``u_k = phi(t) He_{k-1}(t) / sqrt(k!)``. Other activations by
    adaptive quadrature with a break point at t.
    """
    t = float(t)
    kmax = check_positive_int(kmax, "kmax", minimum=0)
    out = np.zeros(kmax + 1)
    if activation == "relu":
        tail = 0.5 * special.erfc(t / math.sqrt(2.0))
        out[0] = _phi(t) - t * tail
        if kmax >= 1:
            out[1] = tail
        for k in range(2, kmax + 1):
            out[k] = _phi(t) * _he(k - 2, t) / math.sqrt(math.factorial(k))
        return out
    if activation == "step":
        out[0] = 0.5 * special.erfc(t / math.sqrt(2.0))
        for k in range(1, kmax + 1):
            out[k] = _phi(t) * _he(k - 1, t) / math.sqrt(math.factorial(k))
        return out
    if activation not in ("sigmoid", "abs", "square"):
        raise ValueError(f"activation must be one of 'relu', 'step', 'sigmoid', 'abs', 'square'; got {activation!r}")
    u = _activation(activation)
    for k in range(kmax + 1):
        norm = math.sqrt(math.factorial(k))

        def integrand(g, k=k, norm=norm):
            return float(u(np.asarray(g - t))) * _he(k, g) / norm * _phi(g)

        with warnings.catch_warnings():  # round-off notices near the requested 1e-12
            warnings.simplefilter("ignore", integrate.IntegrationWarning)
            lo = integrate.quad(integrand, -np.inf, t, epsabs=1e-14, epsrel=1e-12, limit=200)[0]
            hi = integrate.quad(integrand, t, np.inf, epsabs=1e-14, epsrel=1e-12, limit=200)[0]
        out[k] = lo + hi
    return out


def row_angles(V_est, W_true, *, sign_invariant=False):
    """Angles (radians) between matched rows of V_est and W_true (best permutation).

    ``sign_invariant=True`` matches and measures up to the sign of each row (Step 1 before
    its sign step, even activations).
    """
    from scipy.optimize import linear_sum_assignment

    A = np.asarray(V_est, dtype=np.float64)
    B = np.asarray(W_true, dtype=np.float64)
    A = A / np.linalg.norm(A, axis=1, keepdims=True)
    B = B / np.linalg.norm(B, axis=1, keepdims=True)
    C = A @ B.T
    score = np.abs(C) if sign_invariant else C
    rows, cols = linear_sum_assignment(-score)
    Bm = B[cols] * (np.sign(C[rows, cols])[:, None] if sign_invariant else 1.0)
    chord = np.linalg.norm(A[rows] - Bm, axis=1)
    out = np.empty(len(A))
    out[rows] = 2.0 * np.arcsin(np.clip(chord / 2.0, 0.0, 1.0))
    return out


# ---- data access: samples or queries --------------------------------------------------------


class _Data:
    """A GP19 run's samples or drawn queries, with the constant c0 and the total count N.

    The rows are a :class:`relufast.stages.reduce.Samples` (NumPy, memmap, dask, and each
    MPI rank's own rows); every statistic is one streamed pass of the C++ contraction
    kernel whose sums are reduced over blocks and ranks, so every rank gets the same bits.
    """

    def __init__(self, samples, c0, n_total=None, n_jobs=None):
        self.samples, self.c0 = samples, float(c0)
        self.N = samples.n if n_total is None else int(n_total)
        self.n_jobs = n_jobs
        self.n = samples.d

    def stats(self, Z, *, second=False, pairs=False, active_tol=0.0):
        acc = Hermite4Accumulator(
            Z, offset=self.c0, active_tol=active_tol, second=second, pairs=pairs, n_jobs=self.n_jobs
        )
        sums = self.samples.accumulate(acc).sums()
        sums["count"] = float(self.N)  # rows dropped before the kernel (query mode) were inactive
        st = hermite4_statistics(sums, Z)
        st["sums"] = sums
        return st


def _float_keys(y):
    """int64 keys ordered as the float64 values y (both zeros share key 0)."""
    b = np.ascontiguousarray(y, dtype=np.float64).view(np.int64)
    return np.where(b < 0, -(b & np.int64(0x7FFFFFFFFFFFFFFF)), b)


def _key_float(key):
    bits = np.array([key if key >= 0 else (-key) | (1 << 63)], dtype=np.uint64)
    return float(bits.view(np.float64)[0])


def _order_statistics(samples, ranks):
    """The values of the outputs at 0-based ``ranks`` in the sorted concatenation of every
    rank's outputs, exactly: bisection on the float order, one small allgather per step."""
    Y = samples.Y
    y = np.asarray(Y[:, 0].compute() if is_dask(Y) else Y[:, 0], dtype=np.float64)  # X may be the lazy one
    keys = np.sort(_float_keys(y))
    ends = [e for e in samples.allgather((int(keys[0]), int(keys[-1])) if len(keys) else None) if e]
    bounds = [[min(e[0] for e in ends), max(e[1] for e in ends)] for _ in ranks]
    while any(lo < hi for lo, hi in bounds):
        mids = [(lo + hi) // 2 for lo, hi in bounds]
        local = [int(np.searchsorted(keys, m, side="right")) for m in mids]
        total = np.sum(samples.allgather(local), axis=0)
        for b, m, c, r in zip(bounds, mids, total, ranks):
            if b[0] < b[1]:
                b[0], b[1] = (b[0], m) if c >= r + 1 else (m + 1, b[1])
    return [_key_float(lo) for lo, _ in bounds]


def _median(samples):
    """np.median of the outputs over every rank (GP19 P0: the constant c0)."""
    if not (samples.distributed or samples.lazy):
        return float(np.median(samples.Y[:, 0]))
    n = samples.n
    lo, hi = _order_statistics(samples, [(n - 1) // 2, n // 2])
    return lo if n % 2 else (lo + hi) / 2


def _mean(samples):
    """The mean of the outputs over every rank (the same bits as np.mean on one process)."""
    total = samples.map_reduce(lambda Xb, Yb: {"s": float(np.sum(Yb[:, 0]))}, bounded=False)["s"]
    return float(total / samples.n)


class _BandData:
    """EstimateTanAlpha and the Stein direction from samples (Sec. 2.2, dataset mode).

    For the current z each rank keeps the sorted projections ``z . x >= lo_cut`` of its own
    rows, their labels ``f > c0 + tau`` and row numbers. A band's counts are integers summed
    over the ranks, so every rank (and one process on all rows) sees the same ratios; the
    Stein sums are added in rank order.
    """

    def __init__(self, samples, c0, tau, eps, min_band, t):
        self.samples, self.c0, self.tau = samples, c0, tau
        self.eps, self.min_band = eps, min_band
        self.lo_cut = t - _BACKGROUND_SHIFT - 0.5  # no band below this is ever probed
        self.counts = []

    def prepare(self, z, rng):
        parts, start = [], 0
        for Xb, Yb in self.samples.blocks():
            a = Xb @ z
            rows = np.flatnonzero(a >= self.lo_cut)
            parts.append((a[rows], np.asarray(Yb[rows, 0]) > self.c0 + self.tau, rows + start))
            start += len(Xb)
        a, active, rows = (np.concatenate([p[i] for p in parts]) for i in range(3))
        order = np.argsort(a)
        self.a, self.rows, self.active = a[order], rows[order], active[order]
        self.cum = np.concatenate([[0], np.cumsum(self.active)])
        tops = np.sort(np.concatenate(self.samples.allgather(self.a[-self.min_band :])))
        self.s_max = tops[max(len(tops) - self.min_band, 0)] if len(tops) else -np.inf

    def p_hat(self, s):
        lo = np.searchsorted(self.a, s - self.eps, side="left")
        hi = np.searchsorted(self.a, s, side="right")
        parts = self.samples.allgather((int(hi - lo), int(self.cum[hi] - self.cum[lo])))
        cnt, act = sum(p[0] for p in parts), sum(p[1] for p in parts)
        self.counts.append(cnt)
        return np.nan if cnt == 0 else act / cnt

    def _mean_perp(self, z, lo_s, hi_s):
        lo = np.searchsorted(self.a, lo_s, side="left")
        hi = np.searchsorted(self.a, hi_s, side="right")
        idx = self.rows[lo:hi][self.active[lo:hi]]
        X = self.samples.X
        rows = np.asarray(X[idx].compute()) if is_dask(X) else X[idx]  # y may be the lazy one
        parts = self.samples.allgather((int(hi - lo), rows.sum(axis=0)))
        count = sum(p[0] for p in parts)
        if count == 0:
            return np.zeros_like(z)
        g = parts[0][1]
        for p in parts[1:]:
            g = g + p[1]
        g = g / count
        return g - (g @ z) * z

    def stein(self, z, s, rng, width):
        # Band mean minus a background band lower down, where the nearest unit is off and
        # the other units (nearly orthogonal to z) are active as often as at s.
        return self._mean_perp(z, s - width, s + width) - self._mean_perp(
            z, s - _BACKGROUND_SHIFT - 0.25, s - _BACKGROUND_SHIFT + 0.25
        )


class _BandQueries:
    """EstimateTanAlpha and the Stein direction by queries ``x = (s - eps v) z + (I - z z^T) g``."""

    def __init__(self, f, c0, tau, m, eps):
        self.f, self.c0, self.tau, self.m, self.eps = f, c0, tau, m, eps
        self.counts = []
        self.s_max = None

    def prepare(self, z, rng):
        g = rng.standard_normal((self.m, len(z)))
        g -= np.outer(g @ z, z)
        self.g = g
        self.base = g - np.outer(self.eps * rng.random(self.m), z)
        self.z = z

    def _active(self, Xq):
        return np.asarray(self.f(Xq), dtype=np.float64).reshape(-1) > self.c0 + self.tau

    def p_hat(self, s):
        self.counts.append(self.m)
        return float(np.mean(self._active(self.base + s * self.z)))

    def stein(self, z, s, rng, width):
        # Same draws at s and lower down (common random numbers): the other units' share cancels.
        act = self._active(self.base + s * self.z).astype(np.float64)
        low = self._active(self.base + (s - _BACKGROUND_SHIFT) * self.z).astype(np.float64)
        return (act - low) @ self.g / self.m


def _bisect(p, lo, hi, level, steps):
    """s in [lo, hi] with p(s) crossing ``level`` (p(lo) < level <= p(hi))."""
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        v = p(mid)
        if not np.isfinite(v) or v >= level:
            hi = mid
        else:
            lo = mid
    return 0.5 * (lo + hi)


def estimate_tan_alpha(oracle, z, t, rng, *, steps=24):
    """Algorithm 2 (EstimateTanAlpha), reconstructed as in ``docs/gp19.md``.

    With ``p(s) = Pr[f(x) > c0 | z.x in [s - eps, s]]`` and common random numbers, bisection
    finds ``t_1`` with ``p = 0.4`` and ``t_2`` with ``p = 0.6``; by Lemma 4 the estimate is
    ``(t_2 - t_1) / (Phi^{-1}(0.6) - Phi^{-1}(0.4))`` ~ tan(alpha), alpha the angle between z
    and the nearest hidden row. ``steps`` bisection steps on a bracket of width 8 resolve
    s to 5e-7, i.e. tan(alpha) to about 1e-6. Returns ``(tan_alpha, t_1, t_2)``; NaNs when the bracket
    fails (``p(lo) >= 0.4`` or ``p(hi) <= 0.6``: z is near no unit, or t is too low).
    """
    oracle.prepare(z, rng)
    lo = t - 1.0  # below s_0.4 = (t - 0.25 sin(alpha)) / cos(alpha) for every alpha
    hi = t + 6.0 if oracle.s_max is None else min(t + 6.0, oracle.s_max)
    if hi <= lo or not (oracle.p_hat(lo) < 0.4) or not (oracle.p_hat(hi) > 0.6):
        return np.nan, np.nan, np.nan
    t1 = _bisect(oracle.p_hat, lo, hi, 0.4, steps)
    t2 = _bisect(oracle.p_hat, t1, hi, 0.6, steps)
    return (t2 - t1) / _QUANTILE_SPREAD, t1, t2


def refine_estimate(oracle, z, t, rng, *, eps=0.02, max_iter=200, method="paper", stein_width=0.0, callback=None):
    """Step 2 for one row: Algorithm 1 (RefineEstimate) or the Stein update (not in the paper).

    Parameters
    ----------
    oracle : band oracle (samples or queries)
    z : ndarray of shape (n,)
        Unit start (GP19 needs it 1/poly(d)-close to a row; in practice angle <= 0.2).
    t : float
    rng : numpy Generator
    eps : float, default=0.02
        Target angle epsilon_2: stop once the estimated angle is at most eps.
    max_iter : int, default=200
    method : {"paper", "stein"}
        "paper": Algorithm 1 with the typos fixed (erratum 5): perturb by
        ``0.1 sin(alpha) / n`` times a tangent Gaussian, accept when the re-estimated angle
        drops below ``(1 - 0.01 / n) alpha``; alpha is re-estimated for the current z each
        iteration. "stein": NOT in the paper (relufast's extension): in the band at
        ``s = (t_1 + t_2) / 2`` (half width ``max(tan(alpha), stein_width)``),
        ``E[1{f > c0} (I - z z^T) x]`` points along the tangent part of the nearest row
        (Stein's identity); the same mean 1.25 lower, where that row is off, is subtracted
        to cancel the other units; then ``z <- normalize(z + tan(alpha) g / |g|)``.
    callback : callable, optional
        Called as ``callback(iteration, z, tan_alpha)``.

    Notes
    -----
    Besides ``alpha <= eps`` and ``max_iter``, the loop stops when the estimated angle has
    not fallen by 10% for 3 steps (Stein) or 20 n iterations (paper), which happens at the
    resolution floor of the estimates (about 0.4 band widths with samples); the z with the
    smallest estimated angle is returned.

    Returns
    -------
    z, tan_alpha (of the returned z), dict with ``iterations``, ``accepted``, ``history``.
    """
    n = len(z)
    z = z / np.linalg.norm(z)
    hist, accepted = [], 0
    ta, t1, t2 = estimate_tan_alpha(oracle, z, t, rng)
    best = (ta if np.isfinite(ta) else np.inf, z)
    since_best = 0
    patience = 3 if method == "stein" else 20 * n
    for it in range(max_iter):
        if callback is not None:
            callback(it, z, ta)
        hist.append(ta)
        if not np.isfinite(ta):
            break
        alpha = math.atan(max(ta, 0.0))
        if alpha <= eps or since_best >= patience:
            break
        if method == "paper":
            delta = rng.standard_normal(n)
            delta -= (delta @ z) * z
            z2 = z + (0.1 * math.sin(alpha) / n) * delta
            z2 /= np.linalg.norm(z2)
            ta2, t1b, t2b = estimate_tan_alpha(oracle, z2, t, rng)
            if np.isfinite(ta2) and math.atan(max(ta2, 0.0)) <= (1.0 - 0.01 / n) * alpha:
                z, accepted = z2, accepted + 1
            ta, t1, t2 = estimate_tan_alpha(oracle, z, t, rng)
        else:
            g = oracle.stein(z, 0.5 * (t1 + t2), rng, max(ta, stein_width))
            ng = np.linalg.norm(g)
            if ng == 0:
                break
            z = z + ta * g / ng
            z /= np.linalg.norm(z)
            accepted += 1
            ta, t1, t2 = estimate_tan_alpha(oracle, z, t, rng)
        if np.isfinite(ta) and ta < 0.9 * best[0]:
            best, since_best = (ta, z), 0
        else:
            since_best += 1
    else:
        hist.append(ta)
    if not (np.isfinite(ta) and ta <= best[0]):
        ta, z = best
    return z, ta, {"iterations": len(hist) - 1, "accepted": accepted, "history": hist, "t1": t1, "t2": t2}


# ---- Step 1 -----------------------------------------------------------------------------------


def _whiten(data, k, u2):
    """P2: M_2 from the active rows, its top-k eigenpairs and the whitening map K (n, k)."""
    n = data.n
    st = data.stats(np.zeros((0, n)), second=True)
    ev, E = np.linalg.eigh(st["M2"])
    order = np.argsort(-np.abs(ev))
    ev, E = ev[order], E[:, order]
    top = ev[:k]
    info = {
        "eigenvalues": ev[: min(n, k + 3)].copy(),
        "eigengap": float(abs(ev[k]) / abs(ev[k - 1])) if k < n and ev[k - 1] != 0 else 0.0,
        "signs_ok": bool(np.all(np.sign(top) == np.sign(u2))),
        "kappa": float(math.sqrt(np.max(np.abs(top)) / np.min(np.abs(top)))) if np.min(np.abs(top)) > 0 else np.inf,
        "active_fraction": st["n_active_fraction"],
        "M2": st["M2"],
    }
    return E[:, :k], np.abs(top), info


def _tpm_operator(data, K, counter):
    """GP19 Step 1's whitened fourth-order tensor as an operator for the power method.

    ``V -> (grad4(K v) K, A4(K v))`` for whitened unit rows v: up to the factor
    ``4 / sqrt(24)``, ``T(I, v, v, v)`` and ``T(v, v, v, v)`` of
    ``T = E[ft H_4(x)](K, K, K, K)``, contracted from the samples in one streamed pass per
    call (never a k^4 tensor). ``counter`` counts the passes.
    """

    def apply(V):
        counter[0] += 1
        st = data.stats(V @ K.T)
        return st["grad4"] @ K, st["A4"]

    return apply


def _ascent_operator(data, counter):
    """Thm 10's objective ``E[f h_4(z.x)]`` as an operator for the power method: its gradient
    on the unit sphere (tangent part) and its value, every row of Z, one unfiltered pass."""

    def apply(Z):
        counter[0] += 1
        st = data.stats(Z, active_tol=-1.0)
        return st["grad4"] - np.sum(st["grad4"] * Z, axis=1, keepdims=True) * Z, st["A4"]

    return apply


def _step1_tpm(data, U, ev, s4, rng, restarts, max_iter, tol, shift):
    """Whitened tensor power method (SS-HOPM with deflation) on Q(v) = E[ft H_4(K v . x)].

    The change of variables of GP19's proof of Claim 1: with ``K = U diag(ev)^(-1/2)`` the
    rows of W become orthogonal, so :func:`relufast.stages.tensor.power_iteration` (with the
    streamed operator, projection deflation and the sign ``s4`` of u_4) finds them.
    ``tol`` is the largest ``1 - |cos|`` between consecutive iterates.
    """
    k = U.shape[1]
    K = U / np.sqrt(ev)
    Q, found, passes = _streamed_power(
        lambda count: _tpm_operator(data, K, count), k, k, rng, restarts, max_iter, tol, s4, shift
    )
    W = (U * np.sqrt(ev)) @ found.T  # columns: sqrt(u2 c_i) w_i in population
    return W.T, Q, passes


def _streamed_power(make_operator, n_components, dim, rng, restarts, max_iter, tol, s4, shift):
    """:func:`relufast.stages.tensor.power_iteration` on a streamed GP19 operator.

    ``tol`` is GP19's convergence tolerance (largest ``1 - |cos|`` between iterates);
    ``make_operator(counter)`` builds the operator, which counts its data passes. Returns
    the weights, the unit components (rows) and the passes of the iterations (one more
    pass per component scores its final starts).
    """
    counter = [0]
    weights, found = power_iteration(
        make_operator(counter),
        n_components,
        rng,
        n_starts=restarts,
        n_iter=max_iter,
        tol=math.sqrt(2.0 * tol),  # |v' - v| = sqrt(2 (1 - cos))
        n_features=dim,
        order=4,
        sign=s4,
        shift=shift,
    )
    return weights, found, counter[0] - n_components


def _landscape_one(data, U, M2, u2, u4, kappa_lambda, rng, restarts, max_iter, tol):
    """Sec. 2.1 one-by-one landscape G~(z) = -A4/u4 + kappa (A2/u2 - 1)^2, deflated, z = U v."""
    k = U.shape[1]
    Mk = U.T @ M2 @ U
    found: list[np.ndarray] = []
    zs: list[np.ndarray] = []
    evals = 0

    def fun_grad(y, B, v0):
        nonlocal evals
        v = v0 + B @ y
        z = U @ v
        st = data.stats(z[None, :])
        evals += 1
        a2 = float(v @ Mk @ v)
        val = -st["A4"][0] / u4 + kappa_lambda * (a2 / u2 - 1.0) ** 2
        gz = -st["grad4"][0] / u4
        gv = U.T @ gz + kappa_lambda * 2.0 * (a2 / u2 - 1.0) * (2.0 * Mk @ v) / u2
        return val, B.T @ gv

    for _ in range(k):
        if found:
            C = np.array(found) @ Mk  # constraints C v = 0 (M_2-orthogonality)
            B = np.linalg.svd(C)[2][len(found) :].T
        else:
            B = np.eye(k)
        best = None
        for _ in range(restarts):
            y0 = rng.standard_normal(B.shape[1])
            v = B @ y0
            a2 = float(v @ Mk @ v)
            y0 *= math.sqrt(abs(u2 / a2)) if a2 != 0 else 1.0
            res = optimize.minimize(
                fun_grad,
                y0,
                args=(B, np.zeros(k)),
                jac=True,
                method="L-BFGS-B",
                options={"maxiter": max_iter, "gtol": tol},
            )
            # Negative-curvature check (Definition 1, corrected: lambda_min >= -tau).
            h = 1e-5
            Hs = np.array(
                [
                    (fun_grad(res.x + h * e, B, np.zeros(k))[1] - fun_grad(res.x - h * e, B, np.zeros(k))[1]) / (2 * h)
                    for e in np.eye(B.shape[1])
                ]
            )
            lam, vec = np.linalg.eigh(0.5 * (Hs + Hs.T))
            if lam[0] < -1e-3:
                y1 = res.x + 0.1 * vec[:, 0]
                res = optimize.minimize(
                    fun_grad,
                    y1,
                    args=(B, np.zeros(k)),
                    jac=True,
                    method="L-BFGS-B",
                    options={"maxiter": max_iter, "gtol": tol},
                )
            if best is None or res.fun < best.fun:
                best = res
        assert best is not None  # restarts >= 1 (validated)
        v = B @ best.x
        found.append(v)
        zs.append(U @ v)
    Z = np.array(zs).T  # n x k
    R = np.linalg.pinv(Z)  # rows ~ sqrt(c_i) w_i (step 3)
    return R, evals


def _landscape_simultaneous(data, U, M2, u2, u4, kappa_lambda, gamma, rng, max_iter, tol):
    """App. B.4: G(B) = s4 sum_{j != k} E[f psi(b_j, b_k)] - gamma s4 sum_j E[f H4(b_j)] + lambda sum_j (A2_j - u2)^2,
    with the corrected psi (erratum 7), all divided by |u4|; B = V U^T."""
    k = U.shape[1]
    Mk = U.T @ M2 @ U
    evals = 0
    sq24 = math.sqrt(24.0)

    def fun_grad(x):
        nonlocal evals
        Vm = x.reshape(k, k)
        B = Vm @ U.T
        st = data.stats(B, pairs=True)
        evals += 1
        s = st["sums"]
        N = float(s["count"])
        s0 = float(s["s0"])
        S2 = s["S"][:, 1]
        g = B @ B.T
        r = np.diag(g)
        psi = s["S22"] - np.outer(S2, r) - np.outer(r, S2) + np.outer(r, r) * s0 - 4.0 * g * s["S11"] + 2.0 * g**2 * s0
        off = ~np.eye(k, dtype=bool)
        pair_val = psi[off].sum() / N
        R_others = r.sum() - r
        S2_others = S2.sum() - S2
        gB = (
            2.0 * s["GP"]
            - 2.0 * R_others[:, None] * s["G1"]
            - 2.0 * S2_others[:, None] * B
            + 2.0 * s0 * R_others[:, None] * B
        )
        W = np.where(off, s["S11"], 0.0)
        gB += -4.0 * W @ B - 4.0 * np.where(off, g, 0.0) @ s["G1"] + 4.0 * s0 * np.where(off, g, 0.0) @ B
        gB = 2.0 * gB / N
        a2 = np.einsum("ij,jk,ik->i", Vm, Mk, Vm)
        val = pair_val / (sq24 * u4) - gamma * st["A4"].sum() / u4 + kappa_lambda * np.sum((a2 / u2 - 1.0) ** 2)
        gV = (gB / (sq24 * u4) - gamma * st["grad4"] / u4) @ U
        gV += kappa_lambda * 2.0 * ((a2 / u2 - 1.0) / u2)[:, None] * (2.0 * Vm @ Mk)
        return val, gV.ravel()

    V0 = rng.standard_normal((k, k))
    a2 = np.einsum("ij,jk,ik->i", V0, Mk, V0)
    V0 *= np.sqrt(np.abs(u2 / a2))[:, None]
    res = optimize.minimize(
        fun_grad, V0.ravel(), jac=True, method="L-BFGS-B", options={"maxiter": max_iter, "gtol": tol}
    )
    B = res.x.reshape(k, k) @ U.T
    return np.linalg.pinv(B).T, evals  # rows of B^{-T} ~ D W (Thm 11)


# ---- the pipelines ------------------------------------------------------------------------


def _draw_queries(f, n, n_queries, rng, chunk=100000):
    """Draw Gaussian queries, evaluate f, keep only rows off the constant c0 (P0/P1)."""
    Xs, fs, c0 = [], [], None
    done = 0
    while done < n_queries:
        m = min(chunk, n_queries - done)
        Xq = rng.standard_normal((m, n))
        fq = np.asarray(f(Xq), dtype=np.float64).reshape(-1)
        if fq.shape[0] != m or not np.isfinite(fq).all():
            raise ValueError(f"f must return {m} finite values for an array of shape ({m}, {n}); got shape {fq.shape}")
        if c0 is None:
            c0 = float(np.median(fq))
        keep = fq != c0
        Xs.append(Xq[keep])
        fs.append(fq[keep])
        done += m
    return np.ascontiguousarray(np.vstack(Xs)), np.ascontiguousarray(np.concatenate(fs)), c0


def _jobs(n_jobs):
    """Validated n_jobs in the accumulators' convention (None: all cores)."""
    resolve_n_jobs(n_jobs)
    return n_jobs


def _check_common(n_hidden, threshold, activation, allowed):
    if activation not in allowed:
        raise ValueError(f"activation must be one of {allowed}; got {activation!r}")
    if threshold is None:
        raise TypeError("threshold is required: GP19's threshold t is known (pass threshold=t)")
    t = float(threshold)
    if not np.isfinite(t):
        raise ValueError(f"threshold must be finite; got {threshold!r}")
    return t


def _prepare_data(X, y, f, n_features, n_queries, rng, n_jobs, comm):
    """Samples (validated on every rank) or queries (drawn); returns (_Data, input mode, n)."""
    if f is not None:
        if X is not None or y is not None:
            raise ValueError("pass either samples (X, y) or a callable f (query mode), not both")
        if not callable(f):
            raise TypeError(f"f must be callable (a teacher f(X) -> y); got {type(f).__name__}")
        if comm is not None:
            raise ValueError(
                "comm= splits samples over MPI ranks; query mode (f=) draws its own samples, so pass "
                "comm only with samples X, y"
            )
        n = check_positive_int(n_features, "n_features")
        nq = check_positive_int(n_queries, "n_queries")
        Xa, fa, c0 = _draw_queries(f, n, nq, rng)
        return _Data(Samples(Xa, fa[:, None]), c0, n_total=nq, n_jobs=n_jobs), "queries", n
    if X is None or y is None:
        raise TypeError("pass samples X and y, or X=None, y=None and a callable f (query mode)")
    samples = _samples(X, y, comm, n_jobs)
    return _Data(samples, _median(samples), n_jobs=n_jobs), "samples", samples.d


def _samples(X, y, comm, n_jobs):
    """X, y as :class:`relufast.stages.reduce.Samples` with one output (checked on every rank)."""
    samples = Samples.from_arrays(X, y, comm=comm, n_jobs=resolve_n_jobs(n_jobs))
    if samples.m != 1:
        raise ValueError(f"y must have one output (shape (n,) or (n, 1)); got shape {tuple(samples.Y.shape)}")
    return samples


def _refusal(run, activation, t, u):
    """The result ``unsupported`` when u_4 or u_2 vanishes (before any optimisation), else None."""
    if abs(u[4]) <= _DEGENERATE_RATIO * abs(u[2]) or activation == "square":
        return run.result(
            Status.UNSUPPORTED,
            (
                f"the fourth Hermite coefficient of {activation}(a - t) vanishes at t = {t:g} "
                f"(u_4 = {u[4]:.3g}, u_2 = {u[2]:.3g}): GP19's Step 1 has no signal there "
                "(DegenerateHermite4: ReLU at t = 1, step at t = sqrt(3), sigmoid near t = 3.03, "
                "any u = a^2); use another threshold"
            ),
        )
    if abs(u[2]) < 1e-12:
        return run.result(
            Status.UNSUPPORTED,
            (
                f"the second Hermite coefficient of {activation}(a - t) vanishes at t = {t:g} "
                "(DegenerateHermite2): the whitening of Step 1 is undefined"
            ),
        )
    return None


def _whitening_step(run, data, k, u2, check_median, notes):
    """GP19 Step 1, preprocessing P2: M_2, its top-k eigenpairs and the warnings they raise.

    Returns the eigenvectors U (n, k), |eigenvalues| (k,) and M_2; appends the causes of
    concern (ThresholdTooLow, NonPositiveLinearTerms, IllConditioned, WrongHiddenWidth)
    to ``notes``.
    """
    with run.stage("whitening"):
        U, ev, info = _whiten(data, k, u2)
    M2 = info.pop("M2")
    run.diag.update(info)
    run.counts["n_active"] = int(round(info["active_fraction"] * data.N))
    if check_median and 1.0 - info["active_fraction"] < 0.5:
        notes.append(
            f"ThresholdTooLow: only {1 - info['active_fraction']:.2f} of the rows equal the median (needs >= 0.5)"
        )
    if not info["signs_ok"]:
        notes.append(
            "NonPositiveLinearTerms: the top eigenvalues of M_2 have mixed signs (or the hidden "
            "width is wrong); GP19 needs positive linear coefficients"
        )
    if info["kappa"] >= _KAPPA_WARN:
        notes.append(
            f"IllConditioned: kappa(T W) ~ {info['kappa']:.1f} >= {_KAPPA_WARN:g} from the top "
            "block of M_2; GP19 assumes kappa(W) = O(1) and Step 1 may fail"
        )
    if info["eigengap"] > 0.3:
        notes.append(
            f"WrongHiddenWidth or ThresholdTooLow: eigen-gap |ev_(k+1)| / |ev_k| = {info['eigengap']:.2f} > 0.3"
        )
    return U, ev, M2


def _step1(run, data, landscape, U, ev, M2, u, rng, opts, notes):
    """GP19 Step 1 (Sec. 2.1, App. B.1-B.4): unit rows of W up to sign, then their signs.

    ``landscape`` picks the whitened TPM (:func:`_step1_tpm`), the one-by-one G(z)
    (:func:`_landscape_one`) or the simultaneous G(B) of App. B.4
    (:func:`_landscape_simultaneous`); ``opts`` holds restarts, max_iter, tol, shift,
    kappa_lambda and gamma. The sign step is not in the paper (G is even in z):
    ``E[f H_3(w.x)] = u_3 sum_j c_j (w.w_j)^3`` fixes it.
    """
    k = U.shape[1]
    s4 = float(np.sign(u[4]))
    if landscape == "tpm":
        R, Q, iters = _step1_tpm(data, U, ev, s4, rng, opts["restarts"], opts["max_iter"], opts["tol"], opts["shift"])
        run.diag["c_hat_alt"] = u[4] / (u[2] ** 2 * Q)
    elif landscape == "one-by-one":
        R, iters = _landscape_one(
            data, U, M2, u[2], u[4], opts["kappa_lambda"], rng, opts["restarts"], opts["max_iter"], opts["tol"]
        )
    else:
        R, iters = _landscape_simultaneous(
            data, U, M2, u[2], u[4], opts["kappa_lambda"], opts["gamma"], rng, opts["max_iter"] * 10, opts["tol"]
        )
    run.counts["step1_passes"] = int(iters)
    norms = np.linalg.norm(R, axis=1)
    Vh = R / norms[:, None]
    run.diag["c_hat"] = norms**2 / u[2] if landscape == "tpm" else norms**2
    st = data.stats(Vh)
    margin = st["A3"] / (u[3] * run.diag["c_hat"]) if u[3] != 0 else np.full(k, np.nan)
    sign = np.where(np.sign(u[3] * st["A3"]) < 0, -1.0, 1.0)
    run.diag["sign_margin"] = np.abs(margin)
    ambiguous = np.abs(margin) < 0.25
    if np.any(ambiguous):
        notes.append(
            f"SignAmbiguous: rows {np.flatnonzero(ambiguous).tolist()} have a third-order sign margin below 0.25"
        )
    return Vh * sign[:, None]


def _band_oracle(run, data, mode, f, t, label_tol, band_queries, band_width, eps, notes):
    """The band oracle of Algorithm 2 (queries or samples) and Step 2's target angle.

    With samples the bands are wide enough for about 2000 rows each; band-averaged
    estimates do not resolve angles below ~0.4 band widths, and steps driven by them below
    that floor make rows worse, so Step 2 stops there (the returned eps).
    """
    if mode == "queries":
        width = 1e-3 if band_width is None else float(band_width)
        return _BandQueries(f, data.c0, label_tol, check_positive_int(band_queries, "band_queries"), width), eps
    width = band_width if band_width is not None else float(np.clip(2000.0 / (data.N * _phi(t)), 1e-3, 0.25))
    oracle = _BandData(data.samples, data.c0, label_tol, width, 200, t)
    run.diag["band_width"] = width
    if 0.5 * width > eps:
        notes.append(
            f"Step 2 stops at {0.5 * width:.3g} rad, not eps = {eps:g}: the bands of "
            f"EstimateTanAlpha are {width:.3g} wide with {data.N} samples (more samples or "
            "query mode resolve smaller angles)"
        )
        eps = 0.5 * width
    return oracle, eps


def _step2(run, oracle, Vh, t, rng, refine, eps, max_refine_iter, notes):
    """GP19 Step 2 (Sec. 2.2): Algorithm 1 (RefineEstimate) or the Stein update per row.

    Updates the rows of Vh in place and returns the angle estimates of Algorithm 2
    (EstimateTanAlpha) per row (NaN where its bisection bracket failed).
    """
    k = len(Vh)
    angle = np.full(k, np.nan)
    history = []
    with run.stage("step2"):
        for i in range(k):
            if refine is None:
                ta = estimate_tan_alpha(oracle, Vh[i], t, rng)[0]
                history.append({"iterations": 0, "accepted": 0})
            else:
                z, ta, h = refine_estimate(
                    oracle,
                    Vh[i],
                    t,
                    rng,
                    eps=eps,
                    max_iter=max_refine_iter,
                    method=refine,
                    stein_width=oracle.eps,
                )
                Vh[i] = z
                history.append(h)
            angle[i] = math.atan(ta) if np.isfinite(ta) else np.nan
    run.diag["refine"] = history
    run.counts["refine_iterations"] = int(sum(h["iterations"] for h in history))
    run.diag["band_rows"] = int(np.median(oracle.counts)) if oracle.counts else 0
    if np.any(~np.isfinite(angle)):
        notes.append(
            f"BisectionBracketFailed for rows {np.flatnonzero(~np.isfinite(angle)).tolist()}: "
            "no angle estimate (a row is near no unit, or t is too low)"
        )
    return angle


def _lowest_layer_result(run, data, mode, Vh, angle, t, activation, landscape, refine, eps, negate, notes):
    """The network ``f_lin = c_0 + sum_i c_i u(w_i . x - t)`` and the message of GP19 Sec. 2."""
    k = len(Vh)
    c_hat = np.asarray(run.diag["c_hat"], dtype=np.float64).reshape(1, k)
    if negate:
        # g = 1 - f ~ 1 - c0 - sum_i c_i step(-(w_i . x + t)), with w_i = -v_i.
        Vh = -Vh
        net = dict(U=-c_hat, b=np.full(k, t), c=np.array([1.0 - data.c0]), activation=_Unit(activation, True))
    else:
        net = dict(
            U=c_hat,
            b=np.full(k, -t),
            c=np.array([data.c0]),
            activation=None if activation == "relu" else _Unit(activation),
        )
    steps = f"Step 1 ({landscape})"
    if refine is not None and activation in ("relu", "step"):
        steps += f" + Step 2 ({refine}, eps = {eps:g})"
    finite = np.isfinite(angle)
    msg = f"GP19 {steps} on {data.N} {mode}: " + (
        f"estimated angle per row in diagnostics['angle_estimate'], max {np.max(angle[finite]):.3g} rad"
        if finite.any()
        else "no angle estimate (EstimateTanAlpha needs ReLU or step)"
    )
    if notes:
        msg += "; " + "; ".join(notes)
    run.diag["notes"] = notes
    return run.result(Status.APPROXIMATE, msg, V=Vh, **net)


def lowest_layer(
    X,
    y,
    n_hidden,
    *,
    threshold=None,
    activation="relu",
    landscape="tpm",
    refine="paper",
    eps=0.02,
    max_refine_iter=200,
    f=None,
    n_features=None,
    n_queries=1_000_000,
    band_queries=20000,
    band_width=None,
    restarts=5,
    max_iter=100,
    tol=None,
    shift=0.0,
    kappa_lambda=4.0,
    gamma=0.01,
    label_tol=0.0,
    random_state=None,
    n_jobs=None,
    comm=None,
    _negate=False,
):
    """Recover W of ``f(x) = P(u(W x - t))`` from Gaussian samples or queries (GP19 Sec. 2).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features) or None
        Standard Gaussian inputs (None in query mode).
    y : array-like of shape (n_samples,) or (n_samples, 1) or None
        Outputs f(X) (None in query mode).
    n_hidden : int
        Hidden width d (rows of W).
    threshold : float
        The common threshold t (known, as in the paper).
    activation : {"relu", "step", "sigmoid"}, default="relu"
        ``"square"`` (an even u) is accepted only to be refused: its u_4 vanishes.
    landscape : {"tpm", "one-by-one", "simultaneous"}, default="tpm"
        Step 1: the whitened fourth-order tensor power method (the change of variables of
        Claim 1's proof: its fixed points are the minimisers of the landscape G), the paper's
        one-by-one landscape G(z) (Sec. 2.1) with deflation, or the simultaneous G(B) of
        App. B.4 with the corrected psi.
    refine : {"paper", "stein", None}, default="paper"
        Step 2: "paper" is Algorithm 1 (RefineEstimate) with Algorithm 2 (EstimateTanAlpha);
        "stein" is NOT from the paper: a Stein-direction update, about 10x per step (see
        :func:`refine_estimate`); None skips Step 2. ReLU and step only (Step 2 needs
        ``sgn(f - c0)`` to be the OR of the units).
    eps : float, default=0.02
        Target angle of Step 2 (the paper's epsilon_2, radians).
    max_refine_iter : int, default=200
        Iterations of Step 2 per row.
    f : callable, optional
        Query mode: a teacher ``f(X) -> y`` on arrays of shape (m, n_features); the method
        then draws ``n_queries`` Gaussian queries for Step 1 (keeping only rows off the
        constant) and ``band_queries`` per EstimateTanAlpha call in Step 2 (oracle mode).
        Reached as ``relufast.recover(None, None, n_hidden=k, method="gp19", f=teacher,
        n_features=n, threshold=t)``.
    n_features : int, optional
        Input dimension (query mode).
    n_queries : int, default=1_000_000
        Gaussian queries for Step 1 (query mode).
    band_queries : int, default=20000
        Queries per EstimateTanAlpha call (query mode).
    band_width : float, optional
        Width epsilon of the bands of Algorithm 2. Default: 1e-3 in query mode; with samples,
        wide enough for about 2000 rows per band (at most 0.25). Angles below ~0.4 band_width
        are not resolved, so with samples Step 2 stops at ``max(eps, band_width / 2)`` (the
        row count per band is in ``diagnostics["band_rows"]``).
    restarts, max_iter, tol, shift
        Step 1 restarts per row, iterations, convergence tolerance and SS-HOPM shift.
        ``tol`` (default None): for "tpm" the largest ``1 - |cos|`` between iterates,
        default ``_TPM_TOL`` = 1e-24 (a move below 1.4e-12, near the fixed point: looser
        stops leave the rows on paths that differ by rounding between one process, ranks and
        dask blocks, up to 1e-8 at d = 10; see docs/gp19.md); for the landscapes L-BFGS's
        ``gtol``, default 1e-10.
    kappa_lambda : float, default=4.0
        lambda / (|u_4| / u_2^2) of the landscapes (normalised form; must exceed 2 / c_min).
    gamma : float, default=0.01
        gamma of the simultaneous landscape (Thm 11: a small constant).
    label_tol : float, default=0.0
        Step 2 counts a query as active when ``f > c0 + label_tol`` (label noise).
    random_state : None, int or numpy Generator
    n_jobs : int or None
        Threads of the moment kernel.
    comm : mpi4py communicator, optional
        Each rank passes its own samples; every pass over the data (the median c0, the
        contractions of Step 1, the bands of Step 2) is reduced over the ranks, and every
        rank returns the same result, that of one process on the concatenated samples (up
        to rounding). X and y may also be NumPy memmaps or dask arrays (read block by
        block). Not with ``f=`` (query mode draws its own samples).

    Returns
    -------
    RecoveryResult
        ``V`` (n_hidden, n_features) unit rows with signs resolved (Step 1's sign is fixed by
        ``sgn(u_3 E[ft He_3(w.x)])``, not in the paper); ``U`` (1, n_hidden) the estimated
        linear coefficients c_i, ``b = -t``, ``c = [c_0]`` (the median), so ``predict`` is the
        one-hidden-layer part ``f_lin = c_0 + sum_i c_i u(w_i . x - t)`` (P's higher terms are
        not recovered; the c_i carry Step 1's scale bias, see docs/gp19.md); status ``approximate``
        with ``diagnostics["angle_estimate"]`` (per row, from EstimateTanAlpha),
        ``c_hat``, ``sign_margin``, eigenvalues of M_2, ``kappa`` and the active fraction;
        ``unsupported`` (before any optimisation) when u_4 vanishes (ReLU t = 1, step
        t = sqrt(3), sigmoid t ~ 3.03, u = a^2) or u_2 vanishes.

    Notes
    -----
    Step 1 streams the fourth-order statistic through the C++ kernel of
    :class:`relufast.stages.moments.Hermite4Accumulator`, contracting it with the current
    directions (never a d^4 tensor), on active rows only. Each iteration of Step 1 costs
    O(N_act n restarts). Step 2 costs two EstimateTanAlpha calls per iteration (about 60
    probes each); GP19's Theorem 5 gives O(n log(1/eps)) iterations, measured ~20 n per
    halving of the angle.
    """
    run = Run("gp19-halfspaces" if _negate else "gp19")
    k = check_positive_int(n_hidden, "n_hidden")
    restarts = check_positive_int(restarts, "restarts")
    t = _check_common(k, threshold, activation, _STEP1_ACTIVATIONS)
    if landscape not in ("tpm", "one-by-one", "simultaneous"):
        raise ValueError(f"landscape must be 'tpm', 'one-by-one' or 'simultaneous'; got {landscape!r}")
    if refine not in ("paper", "stein", None):
        raise ValueError(f"refine must be 'paper', 'stein' or None; got {refine!r}")
    if not (np.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a positive angle in radians; got {eps!r}")
    rng = check_random_state(random_state)
    u = hermite_coeffs(activation, t, 4)
    run.diag["u_hat"] = u.copy()
    # Refusal before any optimisation (data validated first, so caller errors still raise).
    with run.stage("data"):
        data, mode, n = _prepare_data(X, y, f, n_features, n_queries, rng, _jobs(n_jobs), comm)
    run.counts.update(n_samples=data.N, n_active=data.samples.n if mode == "queries" else -1)
    if k > n:
        raise ValueError(f"n_hidden must be <= n_features; got n_hidden={k}, n_features={n}")
    refused = _refusal(run, activation, t, u)
    if refused is not None:
        return refused
    notes: list[str] = []
    if tol is None:
        tol = _TPM_TOL if landscape == "tpm" else _LANDSCAPE_GTOL
    opts = dict(restarts=restarts, max_iter=max_iter, tol=tol, shift=shift, kappa_lambda=kappa_lambda, gamma=gamma)
    with single_threaded_blas():
        check_median = mode == "samples" and activation in ("relu", "step")
        U, ev, M2 = _whitening_step(run, data, k, u[2], check_median, notes)
        with run.stage("step1"):
            Vh = _step1(run, data, landscape, U, ev, M2, u, rng, opts, notes)
        run.diag["V_step1"] = -Vh if _negate else Vh.copy()
        angle = np.full(k, np.nan)
        if activation in ("relu", "step"):
            oracle, eps = _band_oracle(run, data, mode, f, t, label_tol, band_queries, band_width, eps, notes)
            angle = _step2(run, oracle, Vh, t, rng, refine, eps, max_refine_iter, notes)
        elif refine is not None:
            notes.append(f"Step 2 skipped: RefineEstimate needs a ReLU or step activation, not {activation}")
        run.diag["angle_estimate"] = angle
    return _lowest_layer_result(run, data, mode, Vh, angle, t, activation, landscape, refine, eps, _negate, notes)


def halfspaces(X, y, n_hidden, *, threshold=None, union=False, **options):
    """Intersections (or unions) of halfspaces far from the origin (GP19 Sec. 2.3, Thm 6).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features) or None
        Gaussian inputs (None with ``f=`` queries, as in :func:`lowest_layer`).
    y : array-like of shape (n_samples,)
        0/1 labels: ``g(x) = prod_i 1[w_i . x + t >= 0]`` (intersection) or, with
        ``union=True``, ``g(x) = OR_i 1[w_i . x >= t]``.
    n_hidden : int
        Number of halfspaces.
    threshold : float
        The common distance t of the halfspaces from the origin (t > sqrt(3) so that the
        step's u_4 > 0).
    union : bool, default=False
    **options
        Passed to :func:`lowest_layer` (``refine``, ``eps``, ``f``, ...).

    Returns
    -------
    RecoveryResult
        ``V`` holds the unit normals w_i (pointing into each halfspace).

    Notes
    -----
    The reduction of Sec. 2.3: ``1 - g = OR_i 1[(-w_i) . x > t]`` is GP19's model with the
    step activation and ``P = 1 - prod(1 - X_i)`` (monotone, ``c_i = 1``), so Step 1 and
    Step 2 recover ``v_i = -w_i``. A union is the model itself.
    """
    if union:
        return _rename(
            lowest_layer(X, y, n_hidden, threshold=threshold, activation="step", **options), "gp19-halfspaces"
        )
    f = options.pop("f", None)
    if f is not None:
        g = f

        def f(Xq):
            return 1.0 - np.asarray(g(Xq), dtype=np.float64)

    if y is not None:
        y = 1.0 - (y if is_dask(y) else as_float_matrix(y, "y", allow_1d=True))
    return lowest_layer(X, y, n_hidden, threshold=threshold, activation="step", f=f, _negate=True, **options)


def _rename(res, method):
    import dataclasses

    return dataclasses.replace(res, method=method)


def correlation_graph_supports(X, y, n_hidden=None, *, threshold=None, n_jobs=None, comm=None):
    """Algorithm 3 (ConstructCorrelationGraph) of GP19, Thm 8: disjoint binary supports.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Standard Gaussian inputs.
    y : array-like of shape (n_samples,)
        ``f = P(u(W x - t))`` with ``u(a) = e^{rho a}`` and rows of W in {0, 1}^n with
        disjoint supports.
    n_hidden : int, optional
        Expected number of supports (checked when given).
    threshold : float, optional
        Edge threshold tau on ``alpha_ij = E[f x_i x_j]`` (i != j); default the midpoint of
        the largest gap of the sorted off-diagonal alpha (the paper's "constant factor gap").
    n_jobs : int or None
        Threads of the moment kernel.
    comm : mpi4py communicator, optional
        Each rank passes its own samples; the moment is reduced over the ranks (X and y may
        also be memmaps or dask arrays).

    Returns
    -------
    RecoveryResult
        ``V`` rows ``1_T / sqrt(|T|)`` for each support T of size >= 2 (``U`` zeros: P is not
        estimated); status
        ``approximate``, or ``failed`` when a component is not a clique (GapViolation) or
        the count differs from ``n_hidden``. ``diagnostics``: ``supports``, ``tau``,
        ``gap_ratio``, ``alpha`` and ``singletons`` (a support of size 1 is invisible to
        pair correlations).

    Notes
    -----
    In population (Thm 8, with the corrected exponent of erratum 10):
    ``alpha_ij = rho^2 C({r}, mu)`` inside support T_r, ``rho^2 C({r1, r2}, mu)`` across,
    ``mu = exp(-rho t + rho^2 s / 2)``. One streamed second moment, O(N n^2).
    """
    from scipy.sparse.csgraph import connected_components

    run = Run("gp19-support")
    samples = _samples(X, y, comm, n_jobs)
    n = samples.d
    if n < 2:
        raise ValueError(f"need at least 2 features for pair correlations; got {n}")
    with run.stage("moment"):
        A = samples.accumulate(SecondMomentAccumulator(n, 1, n_jobs=n_jobs)).tensor()[0]
    iu = np.triu_indices(n, 1)
    vals = A[iu]
    if threshold is None:
        s = np.sort(vals)[::-1]
        gaps = s[:-1] - s[1:]
        i = int(np.argmax(gaps)) if len(gaps) else 0
        tau = 0.5 * (s[i] + s[i + 1]) if len(gaps) else s[0] / 2
        below = s[i + 1] if len(gaps) else 0.0
        gap_ratio = float(s[i] / below) if below > 0 else np.inf
    else:
        tau = float(threshold)
        gap_ratio = np.nan
    adj = np.zeros((n, n), dtype=bool)
    adj[iu] = vals >= tau
    adj |= adj.T
    ncomp, labels = connected_components(adj, directed=False)
    supports, singletons, clique_ok = [], [], True
    for c in range(ncomp):
        T = np.flatnonzero(labels == c)
        if len(T) == 1:
            singletons.append(int(T[0]))
            continue
        sub = adj[np.ix_(T, T)] | np.eye(len(T), dtype=bool)
        clique_ok &= bool(sub.all())
        supports.append(T.tolist())
    run.diag.update(supports=supports, tau=float(tau), gap_ratio=gap_ratio, alpha=A, singletons=singletons)
    run.counts["n_samples"] = samples.n
    V = np.zeros((len(supports), n))
    for r, T in enumerate(supports):
        V[r, T] = 1.0 / math.sqrt(len(T))
    if not clique_ok:
        return run.result(
            Status.FAILED,
            "GapViolation: a component of the correlation graph is not a clique; "
            "the gap between within- and cross-support correlations is too small",
            V=V,
            U=np.zeros((1, len(V))),
        )
    if n_hidden is not None and len(supports) != check_positive_int(n_hidden, "n_hidden"):
        return run.result(
            Status.FAILED,
            f"found {len(supports)} supports of size >= 2, expected n_hidden = "
            f"{n_hidden} (singletons: {singletons}; gap ratio {gap_ratio:.3g})",
            V=V,
            U=np.zeros((1, len(V))),
        )
    if np.isfinite(gap_ratio) and gap_ratio < 2.0:
        warn(f"GapViolation: largest-gap ratio {gap_ratio:.2f} < 2")
    return run.result(
        Status.APPROXIMATE,
        f"Algorithm 3: {len(supports)} supports, tau = {tau:.3g}, gap ratio {gap_ratio:.3g}",
        V=V,
        U=np.zeros((1, len(V))),
    )


def even_activation(
    X,
    y,
    n_hidden,
    *,
    activation="abs",
    step=None,
    restarts=3,
    max_iter=500,
    tol=1e-12,
    random_state=None,
    n_jobs=None,
    comm=None,
):
    """GP19 Thm 10: even activation u(w.x), t = 0, orthonormal W, by deflated projected ascent.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    y : array-like of shape (n_samples,)
    n_hidden : int
    activation : {"abs", "square"}, default="abs"
        u(a) = |a| (u_4 = -0.161843 < 0) or a^2 (u_4 = 0: refused, status ``unsupported``).
    step : float, optional
        Ascent step; default ``0.05 / |u_4|`` (plain power iteration oscillates on this
        mixed-sign quartic).
    comm : mpi4py communicator, optional
        Each rank passes its own samples; the mean of f and every ascent pass are reduced
        over the ranks (X and y may also be memmaps or dask arrays).

    Returns
    -------
    RecoveryResult
        ``V`` unit rows up to sign (u is even, so the sign is not identifiable); ``U`` zeros
        (P is not estimated).

    Notes
    -----
    Maximises ``s_4 E[f h_4(z.x)]`` on the unit sphere, on the orthogonal complement of the
    rows found. On the sphere (erratum 12, quadrature-verified)
    ``E[f h_4] = sum_i alpha_i z_i^4 + sum_{i<j} gamma_ij z_i^2 z_j^2`` with
    ``gamma_ij = sqrt(6) u_2^2 C({i,j}, u_0) / u_0^2`` (the paper has 6 and extra terms);
    coordinate vectors are the maxima when ``s_4 (alpha_i + alpha_j) > s_4 gamma_ij``.
    """
    run = Run("gp19-even")
    if activation not in _EVEN:
        raise ValueError(f"activation must be one of {_EVEN}; got {activation!r}")
    k = check_positive_int(n_hidden, "n_hidden")
    restarts = check_positive_int(restarts, "restarts")
    samples = _samples(X, y, comm, n_jobs)
    n = samples.d
    if k > n:
        raise ValueError(f"n_hidden must be <= n_features; got n_hidden={k}, n_features={n}")
    u = hermite_coeffs(activation, 0.0, 4)
    run.diag["u_hat"] = u
    if abs(u[4]) <= _DEGENERATE_RATIO * abs(u[2]):
        return run.result(
            Status.UNSUPPORTED,
            (
                f"the fourth Hermite coefficient of the even activation {activation} vanishes (u_4 = {u[4]:.3g}): "
                "Thm 10's objective has no signal (DegenerateHermite4)"
            ),
        )
    rng = check_random_state(random_state)
    s4 = float(np.sign(u[4]))
    eta = 0.05 / abs(u[4]) if step is None else float(step)
    data = _Data(samples, _mean(samples), n_jobs=_jobs(n_jobs))
    with single_threaded_blas(), run.stage("ascent"):
        # Projected ascent z <- normalize(z + eta s4 grad_tan) is the shifted power method
        # normalize(s4 grad_tan + z / eta): one routine with Step 1's TPM.
        _, found, passes = _streamed_power(
            lambda count: _ascent_operator(data, count), k, n, rng, restarts, max_iter, tol, s4, 1.0 / eta
        )
    run.counts.update(n_samples=samples.n, passes=passes)
    return run.result(
        Status.APPROXIMATE,
        f"GP19 Thm 10: {k} rows by deflated projected ascent "
        f"(step {eta:.3g}); signs are not identifiable for an even activation",
        V=found,
        U=np.zeros((1, k)),
        activation=_Unit(activation),
    )
