"""Exact refinement stage (BJW19 Algorithm 5, margin-based form) and output-layer fit.

From approximate, sign-ambiguous rows of V this stage recovers V exactly: coordinates
where the approximate row is confidently negative must be zero in the true rectified row;
the row-span vectors of the outputs vanishing there form a one-dimensional null space
only for the right sign (BJW19 Lemma 10); the row follows from a linear system on its
support. The C++ kernel does this for many candidates in parallel; a NumPy reference
implementation is kept here for the tests.

References
----------
.. [1] A. Bakshi, R. Jayaram, D. P. Woodruff. Learning two layer rectified neural networks
   in polynomial time. COLT 2019, PMLR 99:195-268. Algorithm 5, Theorem 6.
"""
from __future__ import annotations

import numpy as np

from .._native import core
from ..activations import RELU

__all__ = [
    "DEFAULT_MARGINS",
    "output_basis",
    "refine_rows",
    "refine_rows_reference",
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
    Uy, s, Vt = np.linalg.svd(Y, full_matrices=False)
    return np.ascontiguousarray(Uy[:, :k].T), s, np.ascontiguousarray(Vt[:k].T)


def refine_rows(B, X, Vhat, *, margins=DEFAULT_MARGINS, tol_null=1e-10, tol_gap=1e-6,
                tol_verify=1e-9, n_jobs=0, activation=RELU):
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
        return core.refine_rows(B, X, Vhat, list(margins), tol_null, tol_gap, tol_verify, 1e-9, 0,
                                n_jobs, float(activation.degree))
    outs = [_refine_one(B, X, v, activation, margins, tol_null, tol_gap, tol_verify) for v in Vhat]
    keys = ("certified", "solved", "sign", "margin", "null_ratio", "gap_ratio", "other_ratio",
            "verify_residual", "n_zero", "support")
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


def _refine_one(B, X, v, activation, margins, tol_null, tol_gap, tol_verify):
    """NumPy version of the C++ kernel for one candidate (certified rows only)."""
    k, l = B.shape
    d = X.shape[1]
    out = {"certified": False, "solved": False, "sign": 0, "margin": 0.0, "null_ratio": 1.0,
           "gap_ratio": 0.0, "other_ratio": 1.0, "verify_residual": 1.0, "n_zero": 0, "support": 0,
           "row": np.full(d, np.nan)}
    v = v / np.linalg.norm(v)
    p = X @ v
    for gamma in margins:
        probes = {}
        for q in (+1, -1):
            Z = np.flatnonzero(q * p < -gamma)
            if Z.size < 2 * k + 5:
                probes[q] = None
                continue
            _, s, Vt = np.linalg.svd(B[:, Z].T, full_matrices=True)
            scale = s[0] if k >= 2 else np.linalg.norm(B) * np.sqrt(Z.size / l)
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
            S = r > 1e-9 * r.max()
            if S.sum() < d or np.linalg.matrix_rank(X[S]) < d:
                continue
            z = _solve_scaled(X[S], r[S], activation)
            if activation.homogeneous:
                z = z / np.linalg.norm(z)
            t = activation(X @ z)
            res = np.linalg.norm(t - B.T @ (B @ t)) / np.linalg.norm(t)
            supp = t > 1e-9 * t.max()
            out.update({"solved": True, "row": z, "sign": q, "margin": gamma, "null_ratio": mine[0],
                        "gap_ratio": mine[1], "other_ratio": other_ratio, "verify_residual": res,
                        "n_zero": mine[3], "support": int(S.sum())})
            if res < tol_verify and np.array_equal(supp, S):
                out["certified"] = True
                return out
    return out


def refine_rows_reference(B, X, Vhat, *, margins=DEFAULT_MARGINS, tol_null=1e-10, tol_gap=1e-6,
                          tol_verify=1e-9, activation=RELU):
    """NumPy reference of :func:`refine_rows` for certified rows (for tests).

    Returns (rows, certified, sign) with the same conventions.
    """
    outs = [_refine_one(B, X, v, activation, margins, tol_null, tol_gap, tol_verify) for v in Vhat]
    certified = np.array([o["certified"] for o in outs], dtype=bool)
    rows = np.array([o["row"] if o["certified"] else np.full(X.shape[1], np.nan) for o in outs])
    signs = np.array([o["sign"] if o["certified"] else 0 for o in outs], dtype=int)
    return rows.reshape(len(outs), X.shape[1]), certified, signs






#: Rows whose |cos| exceeds this are the same hidden unit.
DUPLICATE_COS = 1.0 - 1e-6
#: Fields of :func:`refine_rows`' output kept as a row's certificate.
_CERT_FIELDS = ("margin", "null_ratio", "gap_ratio", "other_ratio", "verify_residual", "support")


class RowPool:
    """Certified rows pooled over restarts, one per hidden unit (duplicates dropped).

    Parameters
    ----------
    k : int
        Rows wanted.
    """

    def __init__(self, k):
        self.k = k
        self.rows = []
        self.certificates = []

    def __len__(self):
        return len(self.rows)

    @property
    def full(self):
        return len(self.rows) >= self.k

    def is_new(self, row):
        unit = row / np.linalg.norm(row)
        return all(abs(unit @ c) < DUPLICATE_COS * np.linalg.norm(c) for c in self.rows)

    def add(self, row, certificate=None):
        """Add a certified row unless it duplicates one in the pool; returns whether added."""
        if not self.is_new(row):
            return False
        self.rows.append(np.asarray(row, dtype=np.float64))
        self.certificates.append(certificate or {})
        return True

    def add_certified(self, out, rows=None):
        """Add every certified row of a :func:`refine_rows` output (``rows`` overrides the
        solved rows, e.g. mapped back from whitened coordinates)."""
        rows = out["rows"] if rows is None else rows
        for i in np.flatnonzero(out["certified"]):
            self.add(rows[i], {key: out[key][i] for key in _CERT_FIELDS})
        return self
