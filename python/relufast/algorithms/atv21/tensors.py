"""ATV21 on given tensors: Lemma 3.5's coefficients, the population tensors and
Algorithms 4 (l = 1), 2 (RecoverScalars), 3 (FixSigns) and 6 (the robust combination)."""

import numpy as np

from ..._blas import single_threaded_blas
from ..._validation import (
    check_positive_int,
    check_random_state,
)
from ...stages.hermite import SQRT_2PI, relu_coefficient
from ...stages.tensor import cp_als, input_span, jennrich, merge_symmetric_factors

CITATION = (
    "P. Awasthi, A. Tang, A. Vijayaraghavan. Efficient algorithms for learning depth-2 neural "
    "networks with general ReLU activations. NeurIPS 2021 (arXiv:2107.10209)."
)

#: Batches whose spread estimates the noise of T_3 and T_4 (weights of the joint pencil).
NOISE_BATCHES = 8


def hermite_coefficient(r, b):
    """``c_r(b)`` of ATV21 Lemma 3.5: ``E[relu(w.x + b) He_r(x)] = c_r(b) w^(x r)`` (unit w).

    ``c_0 = b Phi(b) + phi(b)``, ``c_1 = Phi(b)``, ``c_r = (-1)^r He_{r-2}(b) phi(b)`` for
    r >= 2 (the paper's f_hat_k has no 1/k! inside); :func:`relufast.stages.hermite.relu_coefficient`.

    Parameters
    ----------
    r : int >= 0
    b : float or ndarray

    Returns
    -------
    float or ndarray, like b
    """
    return relu_coefficient(check_positive_int(r, "r", minimum=0), b)


def _network_arrays(net):
    from ...network import as_network

    net = as_network(net)
    U, V, b, c = (np.array(a, dtype=np.float64) for a in (net.U, net.V, net.b, net.c))
    s = np.linalg.norm(V, axis=1)
    if np.any(s == 0):
        raise ValueError("every row of V must be nonzero")
    return U * s, V / s[:, None], b / s, c


def population_tensors(net, order=4):
    """Exact Hermite coefficient tensors ``f_r = E[y He_r(x)]`` of a network, r = 0..order.

    ``f_r[i] = sum_j U_ij c_r(b_j) v_j^(x r)`` (+ c_i for r = 0) with unit rows v_j (rows
    of other norms are canonicalised first; ATV21 Lemma 3.5).

    Parameters
    ----------
    net : Network, PlantedNetwork, result or tuple (U, V[, b[, c]])
    order : int, default=4

    Returns
    -------
    list of ndarray, ``f_r`` of shape (m,) + (d,) * r
    """
    U, V, b, c = _network_arrays(net)
    order = check_positive_int(order, "order", minimum=0)
    out = []
    for r in range(order + 1):
        coef = U * hermite_coefficient(r, b)[None, :]  # (m, k)
        T = coef
        letters = "abcdefghij"[:r]
        if r:
            T = np.einsum("ij," + ",".join(f"j{ch}" for ch in letters) + "->i" + letters, coef, *([V] * r))
        else:
            T = coef.sum(axis=1) + c
        out.append(T)
    return out


def _sympow_ls(T, Z, j):
    """SymPowLS (ATV21 Sec. 3.0): ``zeta = argmin ||T - sum_i zeta_i z_i^(x j)||_F`` by the
    normal equations ``(Z^T Z)^(o j) zeta = h``, ``h_i = <T, z_i^(x j)>``."""
    kz = Z.shape[1]
    h = np.empty(kz)
    for i in range(kz):
        t = T
        for _ in range(j):
            t = np.tensordot(t, Z[:, i], axes=([0], [0]))
        h[i] = float(t)
    G = (Z.T @ Z) ** j
    return np.linalg.lstsq(G, h, rcond=1e-13)[0]


def _flattening_ranks(T3, T4, noise3, noise4):
    """Singular values of flatten(T_3; 1, 2) and flatten(T_4; 1, 3) and their ranks above
    3x the noise (ATV21 Alg. 4, steps 2-3; for exact tensors noise is relative rounding)."""
    k = T3.shape[0]
    s3 = np.linalg.svd(T3.reshape(k, -1), compute_uv=False)
    s4 = np.linalg.svd(T4.reshape(k, -1), compute_uv=False)
    floor3 = max(3.0 * noise3, 1e-10 * s3[0])
    floor4 = max(3.0 * noise4, 1e-10 * s4[0])
    return s3, s4, int(np.sum(s3 > floor3)), int(np.sum(s4 > floor4))


def _jennrich_t2(P, T2, rng, n_draws):
    """Jennrich with T_2 as the second matrix: for ``P = sum_i u_i (x) u_i (x) z_i`` and
    ``T_2 = sum_i beta_i u_i u_i^T`` (beta_i = a_i phi(b_i) != 0), the contraction
    ``M = P(alpha)`` gives ``M T_2^{-1} = Z diag(<z_i, alpha> / beta_i) Z^{-1}``: the
    eigenvectors are the u_i whatever the scale of a_i, and T_2 is the least noisy tensor.
    Of ``n_draws`` random alpha the draw with the largest relative eigen-gap and a real
    spectrum is kept. Returns (Z (k, k) unit columns, gap)."""
    k = T2.shape[0]
    try:
        T2inv = np.linalg.inv(T2)
    except np.linalg.LinAlgError:
        return jennrich(P, rng, n_draws=n_draws)
    best = (None, -1.0)
    for _ in range(n_draws):
        alpha = rng.standard_normal(P.shape[0])
        M = np.tensordot(alpha, P, axes=1) @ T2inv
        lam, Zc = np.linalg.eig(M)
        if not np.all(np.isfinite(lam)):
            continue
        scale = max(np.max(np.abs(lam)), 1e-300)
        imag = np.max(np.abs(lam.imag)) / scale
        lr = lam.real
        diff = np.abs(lr[:, None] - lr[None, :])
        np.fill_diagonal(diff, np.inf)
        gap = float(diff.min() / scale) if k > 1 else 1.0
        if imag > 1e-6:
            gap *= 1e-3
        if gap > best[1]:
            Zr = np.real(Zc)
            best = (Zr / np.maximum(np.linalg.norm(Zr, axis=0), 1e-300), gap)
    if best[0] is None:
        return jennrich(P, rng, n_draws=n_draws)
    return best


def _jennrich_step(T, k, rng, noise3, noise4, n_draws, polish):
    """ATV21 Algorithm 4 (l = 1), steps 1-4: the directions from T_3 and T_4 (k-dim basis).

    Jennrich on the flattenings of T_3 (k x k x k) and T_4 (k x k x k^2) as one pencil: the
    third modes concatenated, each scaled by its noise level, so a unit invisible in one
    tensor (b at a root of He_1 or He_2) is seen in the other; T_2 is the second matrix
    (:func:`_jennrich_t2`), then a CP-ALS polish (``polish="cp"``) or the Jennrich
    directions as they are (``"jennrich"``). Returns (Z (k, k) unit columns up to sign,
    diagnostics).
    """
    _, _, T2, T3, T4 = T
    s3, s4, r3, r4 = _flattening_ranks(T3, T4, noise3, noise4)
    diag = dict(
        flattening_singular_values_T3=s3, flattening_singular_values_T4=s4, flattening_rank_T3=r3, flattening_rank_T4=r4
    )
    w3 = 1.0 / noise3 if noise3 > 0 else 1.0 / max(float(np.linalg.norm(T3)), 1e-300)
    w4 = 1.0 / noise4 if noise4 > 0 else 1.0 / max(float(np.linalg.norm(T4)), 1e-300)
    P = np.concatenate([w3 * T3, w4 * T4.reshape(k * k, k, k)], axis=0)
    Z0, gap = _jennrich_t2(P, T2, rng, n_draws)
    A, Bf, Cf = cp_als(P, Z0)
    Z = merge_symmetric_factors(Bf, Cf)
    fit0 = np.linalg.norm(P - np.einsum("ir,jr,kr->ijk", A, Bf, Cf)) / max(np.linalg.norm(P), 1e-300)
    if polish == "jennrich" or not np.all(np.isfinite(Z)):
        Z = Z0
    diag.update(jennrich_gap=gap, cp_relative_error=float(fit0), directions_from="Jennrich on T_3 and T_4")
    return Z, diag


def _output_pencil(P2, T2, rng, n_draws, polish):
    """The directions from the second moments of several outputs (relufast's own, beyond
    the paper, whose model has one output): in the span, the slices
    ``P2[q] = W^T T_2(y_q) W = sum_i (Q^T U)_qi phi(b_i) w_i w_i^T`` of the (compressed)
    outputs are a rank-k pencil, so Jennrich with T_2 of ``y = Y g`` as the second matrix
    (:func:`_jennrich_t2`) gives the w_i whenever the ratios ``(Q^T U)_qi / a_i`` differ
    between units, from m = 2 outputs on. Second moments are far less noisy than T_3 and
    T_4, so for m >= 2 this needs many fewer samples at large k. CP-ALS polish with
    ``polish="cp"``. Returns (Z (k, k) unit columns up to sign, diagnostics)."""
    Z0, gap = _jennrich_t2(P2, T2, rng, n_draws)
    Z = Z0
    if polish == "cp":
        _, Bf, Cf = cp_als(P2, Z0)
        Zc = merge_symmetric_factors(Bf, Cf)
        Z = Zc if np.all(np.isfinite(Zc)) else Z0
    return Z, dict(jennrich_gap=gap, directions_from="output pencil (T_2 of every output)")


def _recover_scalars(T, Z, noise3, noise4):
    """ATV21 Algorithm 2 (RecoverScalars) with l = 1: ``zeta_j = SymPowLS(T_j, Z)``;
    ``zeta_2 = a phi(b)``, ``zeta_3 = -a phi(b) xi b`` (errata: T_2 and T_3, not T_1), so
    ``b = -zeta_3 / zeta_2`` and ``a = sqrt(2 pi) exp(b^2 / 2) zeta_2``. Also reports which
    tensor sees each unit (``lambda' = -a phi(b) b`` in T_3, ``a phi(b) He_2(b)`` in T_4).
    Returns (a (k,), xi b (k,), diagnostics)."""
    z2 = _sympow_ls(T[2], Z, 2)
    z3 = _sympow_ls(T[3], Z, 3)
    z4 = _sympow_ls(T[4], Z, 4)
    with np.errstate(divide="ignore", invalid="ignore"):
        bt = -z3 / z2
    bt = np.where(np.isfinite(bt), bt, 0.0)
    at = SQRT_2PI * np.exp(np.minimum(0.5 * bt**2, 700.0)) * z2
    diag = dict(zeta2=z2, zeta3=z3, zeta4=z4)
    diag["visible_T3"] = np.abs(z3) > 3.0 * max(noise3, 1e-12 * np.abs(z3).max(initial=0.0))
    diag["visible_T4"] = np.abs(z4) > 3.0 * max(noise4, 1e-12 * np.abs(z4).max(initial=0.0))
    return at, bt, diag


def _fix_signs(T0, T1, Z, at, bt):
    """ATV21 Algorithm 3 (FixSigns) and the offset: ``T_1 = sum_i a_i Phi(b_i) w_i =
    sum_i z_i (a~_i w~_i)`` with ``z_i = xi_i Phi(b_i)``, so ``xi_i = sign(z_i)`` (least
    squares for z); then ``c = T_0 - sum_i a_i c_0(b_i)``. Returns (Z with signs fixed, b,
    c, diagnostics)."""
    A = Z * at[None, :]
    if not (np.all(np.isfinite(A)) and np.all(np.isfinite(T1))):
        # A non-finite estimate (absurd scalars): LAPACK would print DLASCL and fail; the
        # caller sees the non-finite parameters and tries the next restart.
        zz = np.full(Z.shape[1], np.nan)
    else:
        zz = np.linalg.lstsq(A, T1, rcond=1e-13)[0]
    xi = np.where(zz >= 0, 1.0, -1.0)
    xi = np.where(np.isfinite(zz), xi, np.nan)
    diag = {"fixsigns_z": zz, "fixsigns_margin": float(np.min(np.abs(zz))) if zz.size else 0.0}
    bb = xi * bt
    c0 = float(T0 - np.sum(at * hermite_coefficient(0, bb)))
    return Z * xi[None, :], bb, c0, diag


def _algorithm6(T, k, rng, noise3=0.0, noise4=0.0, n_draws=10, polish="cp", directions=None):
    """ATV21 Algorithm 6 in a k-dimensional basis: T = [T_0 (), T_1 (k,), ..., T_4 (k,)*4].

    Algorithm 4 steps 1-4 (:func:`_jennrich_step`), Algorithm 2 (:func:`_recover_scalars`),
    Algorithm 3 and the offset (:func:`_fix_signs`). ``directions`` = (Z, diagnostics)
    replaces steps 1-4 (the output pencil, :func:`_output_pencil`).

    Returns (Z (k, k) unit directions as columns with signs fixed, a (k,), b (k,), c0,
    diagnostics dict).
    """
    if directions is None:
        Z, diag = _jennrich_step(T, k, rng, noise3, noise4, n_draws, polish)
    else:
        Z, diag = directions
    # From too few samples the scalars can be absurd (|b| ~ 30, a ~ 1e300): they overflow to
    # inf here, the estimate is non-finite and the caller reports it (never a raw warning).
    with np.errstate(over="ignore", invalid="ignore"):
        at, bt, d2 = _recover_scalars(T, Z, noise3, noise4)
        Z, bb, c0, d3 = _fix_signs(T[0], T[1], Z, at, bt)
    diag.update(d2)
    diag.update(d3)
    return Z, at, bb, c0, diag


def recover_from_tensors(tensors, n_hidden, *, random_state=None):
    """ATV21 Algorithm 6 (Alg. 4 with l = 1, Alg. 2, Alg. 3) on given tensors T_0..T_4.

    Parameters
    ----------
    tensors : sequence of 5 arrays
        ``T_r`` of shape (p,) * r (one output), p >= n_hidden: exact ``f_r`` (e.g. from
        :func:`population_tensors`) or estimates.
    n_hidden : int
    random_state : None, int or Generator
        Seeds Jennrich's random contractions.

    Returns
    -------
    a : ndarray (k,), V : ndarray (k, p) unit rows, b : ndarray (k,), c : float, diagnostics : dict
    """
    T = [np.asarray(t, dtype=np.float64) for t in tensors]
    if len(T) != 5 or any(T[r].shape != (T[1].shape[0],) * r for r in range(5)):
        raise ValueError("tensors must be T_0..T_4 with T_r of shape (p,) * r")
    p = T[1].shape[0]
    k = check_positive_int(n_hidden, "n_hidden")
    if k > p:
        raise ValueError(f"n_hidden must be at most the dimension p = {p} (l = 1 needs k <= d); got {k}")
    rng = check_random_state(random_state)
    with single_threaded_blas():
        W, ev = input_span(T[2][None], k)
        Tp = [
            T[0],
            T[1] @ W,
            W.T @ T[2] @ W,
            np.einsum("abc,ai,bj,ck->ijk", T[3], W, W, W),
            np.einsum("abcd,ai,bj,ck,dl->ijkl", T[4], W, W, W, W),
        ]
        Z, a, b, c0, diag = _algorithm6(Tp, k, rng)
    return a, (W @ Z).T, b, c0, diag


#: Rows of the refinement when its sample populates more activation regions than the region
#: pass allows (its default ``max_regions``; regions are never more than rows).
