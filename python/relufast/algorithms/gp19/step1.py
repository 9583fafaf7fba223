"""GP19 Step 1: whitening and the tensor / landscape steps that find the span of the units."""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize

from ..._deadline import check as check_deadline
from ...stages.tensor import power_iteration


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
        check_deadline("in a GP19 Step 1 unit")
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
