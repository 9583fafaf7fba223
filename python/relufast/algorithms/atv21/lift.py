"""relufast's exact refinement of an ATV21 estimate on the affine lift [x, 1]: BJW19
Algorithm 5 in its margin form (rows from samples where one unit is confidently off)."""

import numpy as np

from ..._blas import matmul
from ...activations import RELU
from ...stages.fit import fit_output_layer, relative_residual
from ...stages.levmar import fold_linear, levenberg_marquardt, lm_rows
from ...stages.refine import RegionRefinement, output_basis, refine_rows

LIFT_ROWS = 5000
#: Disjoint chunks of LIFT_ROWS rows the lift tries for the units still uncertified.
LIFT_CHUNKS = 4
#: Rows of the least-squares fit of (U, c) after the lift.
LIFT_FIT_ROWS = 50000
#: Above this many units the activation-region refinement runs only on the last tensor
#: step while the lift's pool can still grow (at (40, 20, 20) six region refinements cost
#: 72 of 92 s before the pool filled).
LIFT_WAIT_K = 12


def _lift_refine(Xs, Ys, V0, b0, n_jobs, pool):
    """BJW19 Algorithm 5 in its margin form on the affine lift ``[x, 1]`` (relufast: the
    paper's exact refinement of Thm 7 extended to biases and an offset). The columns of
    ``[Y, 1]`` span ``relu(X v_i + b_i)`` and the constant vector when they have rank k + 1
    (m >= k outputs in general position), so each estimated row ``(v_i, b_i)`` whose
    confidently-off samples leave a one-dimensional null space is solved exactly on its
    support and verified against that span. Needs only the samples where each unit is
    confidently off, not every unit's sign on a sample as the activation-region refinement
    does. Certified rows join ``pool`` (a :class:`RowPool` kept over the tensor steps, whose
    estimates certify different units). Returns (V, b) with the pooled rows in place of
    the estimates they match, or None when the span test does not apply."""
    k, d = V0.shape
    rows = min(len(Xs), max(LIFT_ROWS, 20 * (d + 1)))
    if rows < 2 * (k + 1) + 5:
        return None
    C = np.column_stack([V0, b0])
    C /= np.linalg.norm(C, axis=1, keepdims=True)
    # Disjoint chunks of rows: a unit whose estimate fails on one chunk (a sample where it
    # is on inside its confidently-off set) may pass on the next.
    for start in range(0, min(len(Xs), LIFT_CHUNKS * rows) - rows + 1, rows):
        X1 = np.column_stack([Xs[start : start + rows], np.ones(rows)])
        B, sv, _ = output_basis(np.column_stack([Ys[start : start + rows], np.ones(rows)]), k + 1)
        if len(sv) < k + 1 or not sv[k] > 1e-8 * sv[0]:
            return None  # [Y, 1] has rank <= k: its span does not hold each unit's vector
        todo = np.max(np.abs(C @ np.array(pool.rows).T), axis=1) < 0.98 if len(pool) else np.ones(k, dtype=bool)
        out = refine_rows(B, X1, C[todo], n_jobs=n_jobs or 0)
        for i in np.flatnonzero(out["certified"]):
            if np.linalg.norm(out["rows"][i][:d]) > 0:
                pool.add(out["rows"][i] / np.linalg.norm(out["rows"][i]))
        if pool.full:
            break
    V, b = V0.copy(), b0.copy()
    if pool.full:
        R = np.array(pool.rows)
        return R[:, :d] / np.linalg.norm(R[:, :d], axis=1, keepdims=True), R[:, d] / np.linalg.norm(R[:, :d], axis=1)
    if len(pool):
        R = np.array(pool.rows)
        near = np.abs(C @ R.T)
        for i in range(k):
            j = int(np.argmax(near[i]))
            if near[i, j] > 0.98:  # the estimate of a unit certified already: use the exact row
                V[i], b[i] = R[j, :d] / np.linalg.norm(R[j, :d]), R[j, d] / np.linalg.norm(R[j, :d])
    return V, b


def _lifted_fit(Xs, Ys, V, b, rounds=0):
    """(U, c) by least squares for (V, b) on the first LIFT_FIT_ROWS rows of the refinement
    sample (exact rows give the exact (U, c) from any rows of full rank; the certificate
    reads every sample), as a :class:`RegionRefinement` whose ``rounds`` are those of the
    step that gave the rows (0 for the lift, the Levenberg-Marquardt steps)."""
    Xs, Ys = Xs[:LIFT_FIT_ROWS], Ys[:LIFT_FIT_ROWS]
    Uc, _ = fit_output_layer(Xs, Ys, V, b=b, intercept=True)
    U, c = Uc[:, :-1], Uc[:, -1]
    R = Ys - (matmul(np.maximum(matmul(Xs, V.T) + b, 0.0), U.T) + c)  # on the method's threads
    residual = float(np.linalg.norm(R) / max(np.linalg.norm(Ys), 1e-300))
    return RegionRefinement(U, V, b, c, residual, (residual,), rounds, (), 0, len(Xs), 0)


def _certify_all(data, rr):
    """``rr`` with its residual over all samples of ``data`` (one reduction pass)."""
    residual = relative_residual(data, None, rr.V, rr.U, data.n_jobs, RELU, b=rr.b, c=rr.c)
    return rr._replace(residual=residual, history=rr.history + (residual,))


#: Largest parameter count k (d + 1) + m (k + 1) for the Levenberg-Marquardt stage (its
#: dense J^T J costs rows * m * P^2 flops: about 1 s at (40, 20, 1) on 5,000 rows).
LM_MAX_PARAMS = 2000

#: Two estimated directions with cosine above this are one unit found twice.
DUPLICATE_COS = 0.95


def _lm_refine(Xs, Ys, V0, b0, tol):
    """Levenberg-Marquardt on every parameter over the first :func:`lm_rows` rows of the
    refinement sample (relufast, beyond the paper; :mod:`relufast.stages.levmar`): widens
    the basin of the exact refinement from a few hundredths of a radian (every unit's sign
    right on a sample) to about 0.3 rad. Returns (V, b, steps) when it fits its rows to ``tol``,
    else None (also when the stage does not apply: too few rows or too many parameters)."""
    k, d = V0.shape
    m = 1 if np.ndim(Ys) == 1 else Ys.shape[1]
    rows = lm_rows(d, k, m)
    if k * (d + 1) + m * (k + 1 + d) > LM_MAX_PARAMS or len(Xs) < rows + d:
        return None
    if k > 1 and np.max(np.triu(V0 @ V0.T, 1)) > DUPLICATE_COS:
        return None  # a unit found twice: another is missing (the deflation's case)
    out = levenberg_marquardt(Xs[: rows + d], Ys[: rows + d], V0, b0, tol=min(tol, 1e-15), linear=True)
    out, off = fold_linear(out)
    if not (out.history[-1] <= max(tol, 1e-13) and off < 1e-6):
        return None
    return out.V, out.b, out.steps
