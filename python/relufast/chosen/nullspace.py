"""Null spaces of stacked kink equations (:mod:`.deep`): one-dimensional ones give a unit's
row, and two chains of one unit that each left directions open share its row.

Each kink of a unit of the next layer gives d + 1 linear equations on its row (v, beta, c)
in phi-space (:func:`.deep._constraints`); a chain of kinks along the unit's boundary
stacks them (:func:`.deep._chains`). The row is the null vector once the stack has one,
with the finite-difference error of the normals as its singular value.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

__all__ = ["merged_rows"]


def svd(M, full_matrices=True, compute_uv=True):
    """``np.linalg.svd``, or LAPACK's QR iteration (``gesvd``) where its divide and conquer does
    not converge: under OpenBLAS's SkylakeX kernels NumPy raised "SVD did not converge" on a
    finite 31 x 28 product of two null spaces of the trained diabetes 10-100-100-1 (singular
    values near 1), which ended the run; ``gesvd`` returned them. Stacks go one at a time."""
    try:
        return np.linalg.svd(M, full_matrices=full_matrices, compute_uv=compute_uv)
    except np.linalg.LinAlgError:
        if M.ndim == 2:
            return scipy.linalg.svd(M, full_matrices=full_matrices, compute_uv=compute_uv, lapack_driver="gesvd")
        parts = [svd(A, full_matrices, compute_uv) for A in M.reshape(-1, *M.shape[-2:])]
        if not compute_uv:
            return np.stack(parts).reshape(M.shape[:-2] + parts[0].shape)
        return tuple(np.stack([p[i] for p in parts]).reshape(M.shape[:-2] + parts[0][i].shape) for i in range(3))


#: The second smallest singular value must exceed GAP times the null tolerance (or 5% of
#: the largest): a barely determined direction gives a hyperplane wrong in some regions.
GAP = 1000.0


def _solve(M, tol, loose=0.0):
    """Null vector of the stacked rows M when it is one-dimensional (:func:`_null_count`);
    else None."""
    R = M.reshape(-1, M.shape[-1])
    R = R[np.linalg.norm(R, axis=1) > 0]
    if len(R) < M.shape[-1] - 1:
        return None
    _, s, Vt = svd(R, full_matrices=False)
    if len(s) < M.shape[-1] or _null_count(s, s[0], tol, loose) != 1 or s[-2] <= min(GAP * tol, 0.05) * s[0]:
        return None
    theta = Vt[-1]
    return theta / np.linalg.norm(theta[:-1])


#: In float64 the direction of a chain's own hyperplane counts as null up to CHAIN_LOOSE
#: times the null tolerance (that is, the error allowed on a normal,
#: :meth:`.oracle.Oracle.normal_tol`) where the next singular value stands GAP times above
#: it. The trained diabetes 10-100-100-1 (sklearn's default widths): its chains' own
#: direction sat at 5e-8 to 1.4e-7 of the largest singular value (finite differences in
#: the small regions of 200 boundaries in 10 dimensions), its other null directions at
#: 1e-16 and the next value at 4e-3 to 1.4e-2; at the null tolerance alone (3.3e-8) no
#: chain gave a row or a sign equation.
CHAIN_LOOSE = 30.0


def _null_count(s, scale, tol, loose=0.0):
    """Trailing values of the descending singular values s that count as null: those within
    ``tol * scale``, and with ``loose`` the next one where it lies within ``loose * tol *
    scale`` and the one above it GAP times higher."""
    n = int(np.sum(s <= tol * scale))
    i = len(s) - n - 1
    if loose and i >= 1 and s[i] <= loose * tol * scale and s[i - 1] >= GAP * s[i]:
        n += 1
    return n


def _chain_loose(oracle):
    """CHAIN_LOOSE in float64; 0 at low precision (where the null tolerance is capped)."""
    return 0.0 if oracle.low_precision else CHAIN_LOOSE


def _right_svd(R):
    """(singular values padded with zeros to the number of columns, every right singular
    vector) of R: a tall R is reduced to its triangular factor first (a kink's equations
    have d + 1 rows; a full SVD of them built a square matrix of their number, where the
    grouping of the trained digits 64-16-8-8-10 spent nearly all its time)."""
    if R.shape[-2] > R.shape[-1]:
        R = np.linalg.qr(R, mode="r")
    _, s, Vt = svd(R, full_matrices=True)
    return np.concatenate([s, np.zeros(s.shape[:-1] + (Vt.shape[-1] - s.shape[-1],))], axis=-1), Vt


def _null_rows(R, tol, loose=0.0):
    """Orthonormal rows spanning the directions x with |R x| <= tol * |R| (relative singular
    values; with ``loose`` as :func:`_null_count` says), for R of many rows."""
    s, Vt = _right_svd(R)
    return Vt[len(s) - _null_count(s, s[0], tol, loose) :]


#: Most null directions a chain's equations may keep to be stored for :func:`merged_rows`,
#: the most chains stored and the most bytes they take (400 null spaces of 50 directions
#: are 18 MB at 111 unknowns, the diabetes 10-100-100-1's second layer, and 144 MB at 900).
MERGE_DIM, MERGE_KEEP, MERGE_BYTES = 50, 400, 64 * 2**20
#: Principal angle (rad) under which two chains' null spaces share a direction, and the
#: least angle of every other pair of directions.
MERGE_ANGLE, MERGE_APART = 1e-3, 0.05


def merged_rows(store, nulls):
    """Rows of units from pairs of chains that ended with null directions left open.

    A chain that did not make its unit's equations determined (it never saw some units of
    the tentative layer active, or too few regions to separate the others) keeps a null
    space of several dimensions that contains the row. Two such chains of the same unit
    share the row; two of different units share no direction unless both left open the
    same one. Where two null spaces meet in exactly one direction (one principal angle under
    MERGE_ANGLE, the next over MERGE_APART), that direction is a candidate row (the caller
    verifies it). ``store``: the null spaces kept from earlier calls (a list, extended with
    those of ``nulls`` of at most MERGE_DIM dimensions, up to MERGE_KEEP and MERGE_BYTES).
    Returns the candidate rows (a list), each scaled to |v, beta| = 1."""
    rows = []
    for K in nulls:
        if not 1 <= len(K) <= MERGE_DIM or not np.isfinite(K).all():
            continue
        for K2 in store:
            try:
                U, cosines, _ = svd(K @ K2.T)
            except np.linalg.LinAlgError:
                continue  # a pair lost, not the run
            if cosines[0] < np.cos(MERGE_ANGLE) or (len(cosines) > 1 and cosines[1] > np.cos(MERGE_APART)):
                continue
            theta = U[:, 0] @ K
            rows.append(theta / np.linalg.norm(theta[:-1]))
        if len(store) < MERGE_KEEP and sum(S.nbytes for S in store) + K.nbytes <= MERGE_BYTES:
            store.append(K)
    return rows
