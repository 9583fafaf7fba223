"""Units the tensor step missed, found from the residual's tensors (relufast, beyond the paper).

With one output and k near 20, Jennrich on the sample tensors returns some units twice and
misses others (their weights ``a_i c_4(b_i)`` are small against the tensor's noise). The
distinct units it found are fitted first (Levenberg-Marquardt over a subsample; an
approximate fit, units are missing); the residual ``y - f(x)`` is then the output of a
network of the missing units plus the misfit, whose Hermite tensors in the span of V (the
paper's estimator, :func:`relufast.algorithms.atv21.sample_tensors._hermite_tensors`) give
the missing directions by Algorithm 6 in the subspace the residual's T_2 spans. All units
are then fitted together; the fits carry a free linear part, so that a unit estimated with
the wrong sign is no local minimum (:func:`relufast.stages.levmar.fold_linear`).
"""

from types import SimpleNamespace

import numpy as np

from ..._deadline import check as check_deadline
from ...stages.levmar import fold_linear, levenberg_marquardt, lm_rows
from .lift import DUPLICATE_COS, LM_MAX_PARAMS
from .sample_tensors import _hermite_tensors
from .tensors import _algorithm6

#: Rounds of fitting the units found and estimating the missing ones from the residual.
MAX_DEFLATIONS = 3


def distinct_units(V):
    """Indices of the estimates kept when those that repeat an earlier one are dropped."""
    keep: list = []
    for i in range(len(V)):
        if all(float(V[i] @ V[j]) <= DUPLICATE_COS for j in keep):
            keep.append(i)
    return np.array(keep, dtype=int)


def _project(T, B):
    """T_0..T_4 (in the span's coordinates) restricted to the columns of B."""
    T3 = np.einsum("abc,ai,bj,ck->ijk", T[3], B, B, B)
    T4 = np.einsum("abcd,ai,bj,ck,dl->ijkl", T[4], B, B, B, B)
    return [T[0], T[1] @ B, B.T @ T[2] @ B, T3, T4]


def _missing_units(est, s, W, g, fit, missing):
    """Directions and biases of ``missing`` units from the Hermite tensors of the residual
    outputs ``Y g - f(X) g`` over the estimation samples ``est``; None when not finite."""
    a_out, c_out = fit.U.T @ g, float(fit.c @ g)
    l_out = np.zeros(W.shape[0]) if fit.L is None else fit.L.T @ g

    def residual(Xb, Yb):
        Xb = np.asarray(Xb, dtype=np.float64)
        return Yb @ g - np.maximum(Xb @ fit.V.T + fit.b, 0.0) @ a_out - Xb @ l_out - c_out

    # The residual's noise figures stay out of the run's diagnostics (the estimate's own).
    T, noise = _hermite_tensors(SimpleNamespace(diag={}), est, s, W, g, outputs=residual)
    evals, evecs = np.linalg.eigh(T[2])
    B = evecs[:, np.argsort(-np.abs(evals))[:missing]]
    Z, _, bb, _, _ = _algorithm6(_project(T, B), missing, s.rng, noise3=noise[3], noise4=noise[4], polish="cp")
    Vn = (W @ B @ Z).T
    Vn /= np.linalg.norm(Vn, axis=1, keepdims=True)
    if not (np.all(np.isfinite(Vn)) and np.all(np.isfinite(bb))):
        return None
    return Vn, np.asarray(bb, dtype=np.float64)


def deflate(run, est, s, W, g, V0, b0, sample, tol):
    """(V, b, steps) of all k units fitted to ``tol`` on the Levenberg-Marquardt rows of the
    refinement ``sample``, found by up to MAX_DEFLATIONS rounds of fitting the distinct
    estimates and estimating the missing units from the residual; None otherwise."""
    Xs, Ys = sample
    k, d = V0.shape
    m = 1 if np.ndim(Ys) == 1 else Ys.shape[1]
    rows = lm_rows(d, k, m) + d
    if k * (d + 1) + m * (k + 1 + d) > LM_MAX_PARAMS or len(Xs) < rows:
        return None
    Xl, Yl = Xs[:rows], Ys[:rows]
    keep = distinct_units(V0)
    if len(keep) == k:  # every unit distinct but not certified: one is misplaced
        keep = np.delete(keep, _least_needed(Xl, Yl, V0, b0))
    V, b, steps = V0[keep], b0[keep], 0
    for _ in range(MAX_DEFLATIONS):
        check_deadline("in an atv21 deflation round")
        missing = k - len(V)
        fit = levenberg_marquardt(Xl, Yl, V, b, max_steps=20, linear=True)
        found = _missing_units(est, s, W, g, fit, missing)
        if found is None:
            return None
        V, b = np.vstack([fit.V, found[0]]), np.concatenate([fit.b, found[1]])
        out = levenberg_marquardt(Xl, Yl, V, b, tol=min(tol, 1e-15), max_steps=100, linear=True)
        run.counts["deflations"] = run.counts.get("deflations", 0) + 1
        steps += fit.steps + out.steps
        folded, off = fold_linear(out)
        if out.history[-1] <= max(tol, 1e-13) and off < 1e-6:
            return folded.V, folded.b, steps
        keep = distinct_units(folded.V)
        if len(keep) == k:  # no unit twice: drop the one the fit misses least
            keep = np.delete(keep, _least_needed(Xl, Yl, folded.V, folded.b))
        V, b = folded.V[keep], folded.b[keep]
    return None


def _least_needed(X, Y, V, b):
    """The unit whose removal raises the least-squares loss of the output layer least."""
    H = np.column_stack([np.maximum(X @ V.T + b, 0.0), np.ones(len(X))])
    losses = []
    for i in range(len(V)):
        Hi = np.delete(H, i, axis=1)
        R = Y - Hi @ np.linalg.lstsq(Hi, Y, rcond=None)[0]
        losses.append(float(np.sum(R * R)))
    return int(np.argmin(losses))
