"""A straightforward NumPy implementation of the bjw19-gaussian pipeline (the baseline).

Same steps as relufast.algorithms.bjw19.gaussian: the moment by blocked NumPy products,
the tensor stage (already NumPy), the exact refinement by the NumPy reference, U by
least squares, residual by NumPy products.
"""

import numpy as np

from relufast.stages.fit import fit_output_layer
from relufast.stages.refine import output_basis, refine_rows_reference
from relufast.stages.tensor import cp_als, input_span, jennrich, merge_symmetric_factors, project


def moment_numpy(X, Y, block=4096):
    n, d = X.shape
    m = Y.shape[1]
    acc = np.zeros((d, m * d))
    for s in range(0, n, block):
        Xb = X[s : s + block]
        Z = (Y[s : s + block, :, None] * Xb[:, None, :]).reshape(len(Xb), m * d)
        acc += Xb.T @ Z
    T = acc.reshape(d, m, d).transpose(1, 0, 2) / n
    T -= Y.mean(axis=0)[:, None, None] * np.eye(d)
    return T


def recover_numpy(X, Y, k, random_state=0, n_restarts=10):
    rng = np.random.default_rng(random_state)
    n, d = X.shape
    ell = min(n, max(1000, 25 * d, 100 * k))
    idx = np.sort(rng.choice(n, size=ell, replace=False))
    Xr, Yr = X[idx], Y[idx]
    B, sv, Q = output_basis(Yr, k)
    T = moment_numpy(X, Y @ Q)
    W, _ = input_span(T, k)
    P = project(T, W)
    rows = []
    for _ in range(n_restarts):
        Z, _ = jennrich(P, rng)
        _, Bf, Cf = cp_als(P, Z)
        cand = np.vstack([(W @ merge_symmetric_factors(Bf, Cf)).T, (W @ Z).T])
        r, cert, _ = refine_rows_reference(B, Xr, cand)
        for row in r[cert]:
            if all(abs(row @ c) < 1 - 1e-6 for c in rows):
                rows.append(row)
        if len(rows) >= k:
            break
    V = np.array(rows[:k])
    U, _ = fit_output_layer(Xr, Yr, V)
    R = Y - np.maximum(X @ V.T, 0) @ U.T
    return U, V, float(np.linalg.norm(R) / np.linalg.norm(Y))
