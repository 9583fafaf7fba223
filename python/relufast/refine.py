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
import scipy.linalg

from ._native import core

__all__ = [
    "DEFAULT_MARGINS",
    "output_basis",
    "refine_rows",
    "refine_rows_reference",
    "fit_output_layer",
    "relu_stats",
]

#: Margin schedule for unit-norm rows and standard Gaussian inputs (spec bjw19.md 2.6b).
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
                tol_verify=1e-9, n_jobs=0):
    """Certify and solve hidden rows from approximate directions (C++; Alg. 5, steps 2-5).

    Parameters
    ----------
    B : ndarray of shape (k, l)
        Orthonormal rows spanning the columns of the outputs on the l refinement samples.
    X : ndarray of shape (l, d)
        Refinement samples.
    Vhat : ndarray of shape (c, d)
        Candidate directions (any norm, sign unknown).

    Returns
    -------
    dict of arrays, one entry per candidate: ``rows`` (c, d) unit rows (NaN if unsolved),
    ``certified``, ``solved``, ``sign``, ``margin``, ``null_ratio``, ``gap_ratio``,
    ``other_ratio``, ``verify_residual``, ``n_zero``, ``support``.
    """
    B = np.ascontiguousarray(B, dtype=np.float64)
    X = np.ascontiguousarray(X, dtype=np.float64)
    Vhat = np.ascontiguousarray(np.atleast_2d(Vhat), dtype=np.float64)
    return core.refine_rows(B, X, Vhat, list(margins), tol_null, tol_gap, tol_verify, 1e-9, 0, n_jobs)


def refine_rows_reference(B, X, Vhat, *, margins=DEFAULT_MARGINS, tol_null=1e-10, tol_gap=1e-6,
                          tol_verify=1e-9):
    """NumPy reference of :func:`refine_rows` for certified rows (for tests).

    Returns (rows, certified, sign) with the same conventions.
    """
    k, l = B.shape
    d = X.shape[1]
    c = Vhat.shape[0]
    rows = np.full((c, d), np.nan)
    certified = np.zeros(c, dtype=bool)
    signs = np.zeros(c, dtype=int)
    for i in range(c):
        v = Vhat[i] / np.linalg.norm(Vhat[i])
        p = X @ v
        done = False
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
                probes[q] = (s[k - 1] / scale, gap, Vt[k - 1])
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
                z = np.linalg.lstsq(X[S], r[S] / r.max(), rcond=None)[0]
                z /= np.linalg.norm(z)
                t = np.maximum(X @ z, 0.0)
                res = np.linalg.norm(t - B.T @ (B @ t)) / np.linalg.norm(t)
                supp = t > 1e-9 * t.max()
                if res < tol_verify and np.array_equal(supp, S):
                    rows[i], certified[i], signs[i] = z, True, q
                    done = True
                    break
            if done:
                break
    return rows, certified, signs


def fit_output_layer(X, Y, V):
    """Least-squares output layer: ``U = argmin ||Y - relu(X V^T) U^T||_F`` via QR.

    Exact (to rounding) on noiseless data whenever relu(X V^T) has rank k (BJW19 Lemma 4).
    Returns U of shape (m, k) and the condition number of relu(X V^T).
    """
    F = np.maximum(X @ V.T, 0.0)
    Ut, _, rank, sv = scipy.linalg.lstsq(F, Y, lapack_driver="gelsy")
    cond = float(np.inf) if rank < V.shape[0] else float(np.linalg.cond(F))
    return np.ascontiguousarray(Ut.T), cond


def relu_stats(X, Y, V, U=None, *, n_jobs=0, block_size=4096):
    """One threaded pass over all samples with F = relu(X V^T) (C++).

    Returns a dict: ``gram`` = F^T F, ``cross`` = F^T Y, and with U given ``sq_residual`` =
    ||Y - F U^T||_F^2 and ``sq_norm`` = ||Y||_F^2.
    """
    Vc = np.ascontiguousarray(V, dtype=np.float64)
    Uc = None if U is None else np.ascontiguousarray(U, dtype=np.float64)
    return core.relu_stats(X, Y, Vc, Uc, n_jobs, block_size)
