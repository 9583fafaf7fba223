"""Awasthi, Tang, Vijayaraghavan: depth-2 networks with general ReLU activations (biases).

References
----------
.. [1] P. Awasthi, A. Tang, A. Vijayaraghavan. Efficient algorithms for learning depth-2
   neural networks with general ReLU activations. Advances in Neural Information
   Processing Systems 34 (NeurIPS 2021). arXiv:2107.10209.

Model: ``Y = relu(X V^T + b) U^T + c`` with x ~ N(0, I_d), V (k, d) with unit rows, hidden
biases b (k,), output layer U (m, k) and offset c (m,); any m >= 1 (Y may be 1-D). The
paper writes one output ``f(x) = sum_i a_i relu(<w_i, x> + b_i)``; with m outputs relufast
runs the paper on a random combination ``y g`` of the outputs (``a = U^T g``) and fits
``(U, c)`` for all outputs by least squares at the end.

Functions and the paper
-----------------------
``atv21``
    Theorem 3.1: Algorithm 6 (robust Algorithm 4 with l = 1, then Algorithm 3). The span
    of V from T_2; T_0..T_4 in that k-dimensional span (C++ kernel); Jennrich on the
    flattenings of T_3 and T_4; Algorithm 2 (RecoverScalars) from T_2 and T_3;
    Algorithm 3 (FixSigns) from T_1; c from T_0. Then relufast's activation-region
    refinement (:func:`relufast.stages.refine.region_refine`, not in the paper) makes the
    estimate exact on noiseless data, certified by the residual over all samples.
``hermite_coefficient``
    Lemma 3.5: ``c_r(b)`` with ``E[relu(w.x + b) He_r(x)] = c_r(b) w^(x r)``.
``population_tensors``
    The exact coefficient tensors ``f_r`` of a network (for tests and studies).
``recover_from_tensors``
    Algorithms 4 (l = 1) + 2 + 3 on given tensors (dense, any dimension).

Departures from the paper (``docs/atv21.md``): the two Jennrich calls on T_3 and T_4 are
one call on the pencil of both (their third modes concatenated, each scaled by its
estimated noise), which sees every unit since He_1 and He_2 have no common root and
needs no rank thresholds; Algorithms 1-3 are reconstructed from the appendix; the
refinement step is relufast's own.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numpy as np
from scipy.special import ndtr

from .._blas import single_threaded_blas
from .._native import BACKEND
from .._result import Run, Status, warn
from .._validation import (
    InsufficientSamples,
    check_n_hidden,
    check_positive_int,
    check_random_state,
    resolve_n_jobs,
)
from ..activations import RELU
from ..stages.diagnostics import GAUSS_ROWS, gaussianity
from ..stages.fit import certify, fit_output_layer, relative_residual
from ..stages.moments import HermiteAccumulator, SecondMomentAccumulator
from ..stages.precision import resolve_precision
from ..stages.reduce import GATHER_FRACTION, Samples, SampleStream, check_n_estimate
from ..stages.refine import RegionRefinement, RowPool, TooManyRegions, output_basis, refine_rows, region_refine
from ..stages.tensor import cp_als, input_span, jennrich, merge_symmetric_factors

__all__ = [
    "atv21",
    "atv21_general",
    "hermite_coefficient",
    "population_tensors",
    "recover_from_tensors",
    "recover_general_from_tensors",
    "fit_network",
    "CITATION",
]

CITATION = (
    "P. Awasthi, A. Tang, A. Vijayaraghavan. Efficient algorithms for learning depth-2 neural "
    "networks with general ReLU activations. NeurIPS 2021 (arXiv:2107.10209)."
)

_SQRT_2PI = math.sqrt(2.0 * math.pi)
#: Batches whose spread estimates the noise of T_3 and T_4 (weights of the joint pencil).
NOISE_BATCHES = 8


def _phi(b):
    return np.exp(-0.5 * np.asarray(b, dtype=np.float64) ** 2) / _SQRT_2PI


def _hermite_1d(r, z):
    """Probabilists' He_r(z) by the three-term recurrence He_{j+1} = z He_j - j He_{j-1}."""
    z = np.asarray(z, dtype=np.float64)
    h0, h1 = np.ones_like(z), z
    if r == 0:
        return h0
    for j in range(1, r):
        h0, h1 = h1, z * h1 - j * h0
    return h1


def hermite_coefficient(r, b):
    """``c_r(b)`` of ATV21 Lemma 3.5: ``E[relu(w.x + b) He_r(x)] = c_r(b) w^(x r)`` (unit w).

    ``c_0 = b Phi(b) + phi(b)``, ``c_1 = Phi(b)``, ``c_r = (-1)^r He_{r-2}(b) phi(b)`` for
    r >= 2 (the paper's f_hat_k has no 1/k! inside).

    Parameters
    ----------
    r : int >= 0
    b : float or ndarray

    Returns
    -------
    float or ndarray, like b
    """
    r = check_positive_int(r, "r", minimum=0)
    b = np.asarray(b, dtype=np.float64)
    if r == 0:
        out = b * ndtr(b) + _phi(b)
    elif r == 1:
        out = ndtr(b)
    else:
        out = (-1.0) ** r * _hermite_1d(r - 2, b) * _phi(b)
    return out[()] if out.ndim == 0 else out


def _network_arrays(net):
    from ..network import as_network

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
    at = _SQRT_2PI * np.exp(np.minimum(0.5 * bt**2, 700.0)) * z2
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
REGION_ROWS = 1 << 16

#: Where the directions of the tensor steps come from, in turn, with m >= k outputs: the
#: output pencil (T_2 of every output; relufast's own) with and without CP-ALS, then
#: ATV21's Jennrich on T_3 and T_4 with and without CP-ALS. With 2 <= m < k the T_3/T_4
#: steps come first (measured: a two-slice pencil at (d, k) = (20, 8) needed more tensor
#: steps); with one output only the T_3/T_4 steps run.
DIRECTION_MODES = ("pencil-cp", "cp", "pencil", "jennrich")

#: Rows (the first ones) whose centred outputs give the output basis Q when m > k (step 1).
COMBINATION_ROWS = 20000
#: Random output combinations g tried for y = Y g when m > 1 (step 1); the best kept.
N_COMBINATIONS = 32


class _Setup(NamedTuple):
    """Validated options of one :func:`atv21` run."""

    k: int
    tol: float
    n_restarts: int
    n_refine: Optional[int]
    n_estimate: object
    max_rounds: int
    margin: float
    n_jobs: Optional[int]
    block_size: int
    rng: np.random.Generator


def _validate(
    X,
    Y,
    n_hidden,
    *,
    tol,
    block_size,
    n_restarts,
    n_refine,
    n_estimate,
    max_rounds,
    margin,
    n_jobs,
    random_state,
    comm,
    prec,
):
    """The samples (:class:`relufast.stages.reduce.Samples`, agreed on by every rank) and
    the checked options; raises ValueError / TypeError saying what was expected."""
    data = Samples.from_arrays(X, Y, comm=comm, n_jobs=resolve_n_jobs(n_jobs))
    n, d = data.n, data.d
    k = check_n_hidden(n_hidden, d)
    block_size = check_positive_int(block_size, "block_size")
    if not (isinstance(tol, (int, float, np.floating)) and np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive number; got {tol!r}")
    n_min = max(2 * (d + 1), 20 * k)
    if n < n_min:
        raise InsufficientSamples(
            f"atv21 needs at least max(2 (d + 1), 20 k) = {n_min} samples for d = {d}, k = {k}; got n = {n}"
        )
    n_restarts = check_positive_int(n_restarts, "n_restarts")
    if n_refine is not None:
        n_refine = check_positive_int(n_refine, "n_refine", minimum=n_min)
    if not (n_estimate is None or isinstance(n_estimate, str) or np.ndim(n_estimate) == 0):
        raise TypeError(f"n_estimate must be None, 'all' or an integer; got {type(n_estimate).__name__}")
    n_estimate = check_n_estimate(n_estimate, n_min)
    max_rounds = check_positive_int(max_rounds, "max_rounds", minimum=0)
    if not (np.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin must be a number >= 0; got {margin!r}")
    rng = check_random_state(random_state)
    setup = _Setup(
        k, prec.tol(tol, d, k), n_restarts, n_refine, n_estimate, max_rounds, float(margin), n_jobs, block_size, rng
    )
    return data, setup


def _check_gaussian(run, data):
    """Gaussianity of X on its first GAUSS_ROWS rows (gathered on every rank); warns."""
    diag = run.diag
    diag.update(gaussianity(data.take(np.arange(min(data.n, GAUSS_ROWS)))[0]))
    if not diag["gaussian_ok"]:
        warn(
            "X does not look like standard Gaussian input (second-moment deviation "
            f"{diag['second_moment_deviation']:.3g} vs {diag['second_moment_tolerance']:.3g}, kurtosis "
            f"statistic {diag['kurtosis_statistic']:.3g} vs {diag['kurtosis_tolerance']:.3g}); ATV21's "
            "Hermite moments assume x ~ N(0, I). An 'exact' status remains trustworthy (it is a "
            "residual certificate over all samples), but the estimate may fail."
        )


def _span_and_combination(run, data, s):
    """Steps 1-2: T_2 of the outputs (compressed to k when m > k), the span W (d, k) of V
    from its top-k eigenvectors (ATV21 Sec. 3.6), and the combination ``y = Y g``.

    The paper has one output. With m > 1, ``a_j = U_j . g``; of N_COMBINATIONS random unit
    g the one whose projected T_2 (``sum_j a_j phi(b_j) w_j w_j^T``) is best conditioned
    is kept, so that no unit is nearly invisible. Returns (W, g, P2): P2 (q, k, k) are the
    q >= 2 compressed outputs' T_2 in the span (:func:`_output_pencil`), None for one output.
    """
    d, m, k = data.d, data.m, s.k
    if m > k:
        Yh = data.take(np.arange(min(data.n, COMBINATION_ROWS)))[1]
        Q = np.ascontiguousarray(np.linalg.svd(Yh - Yh.mean(axis=0), full_matrices=False)[2][:k].T)
        acc2 = SecondMomentAccumulator(d, k, n_jobs=s.n_jobs, block_size=s.block_size, compress=Q)
    else:
        Q = np.eye(m)
        acc2 = SecondMomentAccumulator(d, m, n_jobs=s.n_jobs, block_size=s.block_size)
    T2all = data.accumulate(acc2).tensor()
    W, evals = input_span(T2all, k)
    W = np.ascontiguousarray(W)
    best = (-1.0, None)
    for _ in range(N_COMBINATIONS if m > 1 else 1):
        gq = s.rng.standard_normal(Q.shape[1])
        gq /= np.linalg.norm(gq)
        ev = np.abs(np.linalg.eigvalsh(W.T @ np.tensordot(gq, T2all, axes=1) @ W))
        score = float(ev.min() / max(ev.max(), 1e-300))
        if score > best[0]:
            best = (score, gq)
    g = Q @ best[1]
    g /= np.linalg.norm(g)
    P2 = np.einsum("qab,ai,bj->qij", T2all, W, W) if T2all.shape[0] >= 2 else None
    run.diag.update(
        output_combination=g,
        combination_condition=best[0],
        span_eigenvalues=evals[: min(len(evals), k + 3)],
        span_eigenvalue_ratio=float(evals[k - 1] / evals[0]) if evals[0] > 0 else 0.0,
    )
    return W, g, P2


def _rows(data, start, stop):
    """This rank's part of the global rows ``start .. stop - 1`` as a one-process
    :class:`relufast.stages.reduce.Samples` (a view: memmaps and dask arrays stay lazy)."""
    lo, hi = (int(np.clip(t - data.offset, 0, data.n_local)) for t in (start, stop))
    return Samples(data.X[lo:hi], data.Y[lo:hi], n_jobs=data.n_jobs)


def _batch_tensors(data, stop, outputs, n_batches, make):
    """Hermite tensors of derived outputs ``outputs(X_b, Y_b)`` (n_b, p) over the global rows
    ``0 .. stop - 1``, cut into ``n_batches`` batches of consecutive rows (their spread
    estimates the noise). Each rank adds its part of every batch to an accumulator from
    ``make()``, block by block; the batch sums are reduced over the ranks in one exchange.
    Returns (T of all rows, per-batch T, cuts), each T a list of (p,) + (k,) * r arrays."""
    cuts = np.linspace(0, stop, n_batches + 1).astype(int)
    accs, state = [], {}
    for j, (a, e) in enumerate(zip(cuts[:-1], cuts[1:])):
        acc, part = make(), _rows(data, a, e)
        if part.n_local:
            for Xb, Yb in part.blocks(bounded=True):
                acc.add(Xb, np.ascontiguousarray(outputs(Xb, Yb)))
        accs.append(acc)
        state.update({f"{j}/{key}": v for key, v in acc.state().items()})
    state = data.reduce(state)
    for j, acc in enumerate(accs):
        acc.set_state({key[len(f"{j}/") :]: v for key, v in state.items() if key.startswith(f"{j}/")})
    parts = [acc.tensors() for acc in accs]
    total = accs[0]
    for acc in accs[1:]:
        total.merge(acc)
    return total.tensors(), parts, cuts


def _batch_noise(T, parts, cuts, out, orders):
    """Standard error (Frobenius) of ``T[r][out]`` from the batch spread, weighted by size."""
    wts = np.diff(cuts) / cuts[-1]
    return [
        float(
            np.sqrt(
                np.sum(np.tensordot(wts, np.stack([p[r][out] - T[r][out] for p in parts]) ** 2, axes=1))
                / max(len(parts) - 1, 1)
            )
        )
        for r in orders
    ]


def _hermite_tensors(run, data, s, W, g):
    """Step 3: T_0..T_4 of ``y = Y g`` in the span, ``z = W^T x`` (C++ raw sums, ATV21
    Sec. 2.5 estimator), in NOISE_BATCHES batches whose spread estimates the noise of each
    tensor. Returns (T list, noise list).

    Two passes, the second with control variates (relufast's own; same expectations,
    several times less noise): He_r(z) is orthogonal to every polynomial of degree < r
    under N(0, I), so ``E[(y - q(z)) He_r(z)] = T_r`` for any q of degree < r. Pass 1
    gives T_0, T_1, T_2 of y; pass 2 gives T_2 of ``y - q_1`` and T_3, T_4 of ``y - q_2``,
    where ``q_1 = T_0 + T_1 . z`` and ``q_2 = q_1 + <T_2, He_2(z)> / 2`` are y's projections
    on the Hermite polynomials of degree <= 1 and <= 2 (a ReLU network's constant and
    linear parts carry most of its variance).
    """
    n, nb = data.n, min(NOISE_BATCHES, data.n)
    T, parts, cuts = _batch_tensors(
        data,
        n,
        lambda Xb, Yb: Yb @ g[:, None],
        nb,
        lambda: HermiteAccumulator(1, order=2, basis=W, n_jobs=s.n_jobs, block_size=s.block_size),
    )
    T0, T1, T2 = T[0][0], T[1][0], T[2][0]
    noise = _batch_noise(T, parts, cuts, 0, range(3))

    def residual_outputs(Xb, Yb):
        Z = np.asarray(Xb, dtype=np.float64) @ W
        y1 = Yb @ g - T0 - Z @ T1
        y2 = y1 - 0.5 * (np.sum((Z @ T2) * Z, axis=1) - np.trace(T2))
        return np.column_stack([y1, y2])

    Tc, parts, cuts = _batch_tensors(
        data,
        n,
        residual_outputs,
        nb,
        lambda: HermiteAccumulator(2, order=4, basis=W, n_jobs=s.n_jobs, block_size=s.block_size),
    )
    run.diag["tensor_noise_plain"] = np.array(noise)
    noise = noise[:2] + _batch_noise(Tc, parts, cuts, 0, [2]) + _batch_noise(Tc, parts, cuts, 1, [3, 4])
    run.diag["tensor_noise"] = np.array(noise)
    return [T0, T1, Tc[2][0], Tc[3][1], Tc[4][1]], noise


def _refinement_sample(data, s):
    """The samples of the refinement rounds: ``n_refine`` random rows gathered on every rank
    (:meth:`Samples.take`), or all samples when there are no more. Returns ((X_s, Y_s),
    whether they are all the samples)."""
    if s.n_refine is not None and data.n > s.n_refine:
        idx = np.sort(SampleStream(data.n, s.rng).grow(s.n_refine))
        return data.take(idx), False
    if data.distributed or data.lazy:
        return data.gather_all(), True
    return (data.X, data.Y), True


def _estimate(T, W, s, noise, polish, P2=None):
    """Steps 4-6 (ATV21 Algorithm 6) in the span, mapped back to the input space; with
    ``polish`` "pencil-cp" or "pencil" the directions come from the output pencil ``P2``
    (:func:`_output_pencil`) instead of T_3 and T_4. Returns (V0 (k, d) unit rows, a, b,
    c0, diagnostics), or None when a parameter is not finite."""
    directions = None
    if polish.startswith("pencil"):
        directions = _output_pencil(P2, T[2], s.rng, 10, "cp" if polish == "pencil-cp" else "jennrich")
    Z, a, bb, c0, d6 = _algorithm6(
        T, s.k, s.rng, noise3=noise[3], noise4=noise[4], polish=polish, directions=directions
    )
    V0 = (W @ Z).T
    V0 = np.ascontiguousarray(V0 / np.linalg.norm(V0, axis=1, keepdims=True))
    if not (np.all(np.isfinite(V0)) and np.all(np.isfinite(bb)) and np.all(np.isfinite(a))):
        return None
    return V0, a, bb, c0, d6


#: Rows of the refinement sample that the affine-lift Alg. 5 reads: enough for its support
#: solves (|S| >= d + 1) and null-space tests (2 (k + 1) + 5 confidently-off samples) when
#: units are active on a few percent of the samples; more rows only add chances that an
#: estimate's confidently-off set holds a sample where the unit is on.
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


def _lifted_fit(Xs, Ys, V, b):
    """(U, c) by least squares for (V, b) on the first LIFT_FIT_ROWS rows of the refinement
    sample (exact rows give the exact (U, c) from any rows of full rank; the certificate
    reads every sample), as a :class:`RegionRefinement` with no region round."""
    Xs, Ys = Xs[:LIFT_FIT_ROWS], Ys[:LIFT_FIT_ROWS]
    Uc, _ = fit_output_layer(Xs, Ys, V, b=b, intercept=True)
    U, c = Uc[:, :-1], Uc[:, -1]
    R = Ys - (np.maximum(Xs @ V.T + b, 0.0) @ U.T + c)
    residual = float(np.linalg.norm(R) / max(np.linalg.norm(Ys), 1e-300))
    return RegionRefinement(U, V, b, c, residual, (residual,), 0, (), 0, len(Xs), 0)


def _refine_and_certify(data, s, sample, covers_all, V0, b0, refine, pool=None, last=True):
    """Step 7: (U, c) for every output by least squares and the activation-region
    refinement (relufast's own, :func:`relufast.stages.refine.region_refine`) on the
    refinement sample. Returns (rr, whether rr.residual is over all samples): the
    certificate over all samples (a reduction over the blocks and ranks of ``data``) is
    only run when the refinement sample is fitted to ``tol``; a residual above it on the
    sample already rules the network out."""
    Xs, Ys = sample
    kw = dict(margin=s.margin, max_rounds=s.max_rounds if refine else 0, n_jobs=s.n_jobs, block_size=4096)
    lifted = None
    if pool is not None and refine and np.ndim(Ys) == 2 and Ys.shape[1] >= s.k:
        lifted = _lift_refine(Xs, Ys, V0, b0, s.n_jobs, pool)
    if lifted is not None:
        V0, b0 = lifted
        rr = _lifted_fit(Xs, Ys, V0, b0)
        whole = covers_all and len(Xs) <= LIFT_FIT_ROWS  # rr's residual is over all samples
        if pool.full and rr.residual <= s.tol:
            return (rr, True) if whole else (_certify_all(data, rr), True)
        if not last and s.k > LIFT_WAIT_K:
            # The next tensor step may certify the units still missing: the activation-region
            # refinement (costly at this k: most samples have their own region) waits for the
            # last step, from the pooled rows.
            return rr, whole
    try:
        rr = region_refine(Xs, Ys, V0, b0, tol=min(1e-14, s.tol), **kw)
    except TooManyRegions:
        # Many units (k near 20 and more): nearly every sample has its own activation
        # pattern. The regions are never more than the rows, so refine on REGION_ROWS of
        # them; the certificate below still reads every sample.
        rows = min(len(Xs), REGION_ROWS)
        rr = region_refine(Xs[:rows], Ys[:rows], V0, b0, tol=min(1e-14, s.tol), **kw)
        covers_all = covers_all and rows == len(Xs)
    if covers_all or rr.residual > s.tol:
        return rr, covers_all
    return _certify_all(data, rr), True


def _certify_all(data, rr):
    """``rr`` with its residual over all samples of ``data`` (one reduction pass)."""
    residual = relative_residual(data, None, rr.V, rr.U, data.n_jobs, RELU, b=rr.b, c=rr.c)
    return rr._replace(residual=residual, history=rr.history + (residual,))


def _restarts(run, data, s, T, W, noise, sample, covers_all, refine, n_restarts, P2=None):
    """Steps 4-7, restarted with new random contractions until the certificate passes:
    the residual over all samples decides, so a restart can only help. With one output
    the directions alternate between Jennrich on T_3/T_4 with and without a CP-ALS
    polish; with several (``P2``) and ``refine`` the output pencil joins them, first when
    m >= k (:data:`DIRECTION_MODES`). Returns (best (rr, diagnostics, a, b,
    c0, over_all) or None, residuals)."""
    best, attempts = None, []
    pool = RowPool(s.k)  # rows certified by the affine-lift Alg. 5, over the tensor steps
    if P2 is None or not refine:
        modes: tuple = ("cp", "jennrich")
    elif P2.shape[0] >= s.k:
        modes = DIRECTION_MODES
    else:  # 2 <= m < k: a pencil of fewer than k slices is worse conditioned; T_3/T_4 first
        modes = ("cp", "pencil-cp", "jennrich", "pencil")
    for attempt in range(n_restarts if refine else 1):
        with run.stage("tensor"):
            est = _estimate(T, W, s, noise, modes[attempt % len(modes)], P2)
        if est is None:
            attempts.append(float("nan"))
            continue
        V0, a, bb, c0, d6 = est
        with run.stage("refine"):
            last = attempt == (n_restarts if refine else 1) - 1
            rr, over_all = _refine_and_certify(data, s, sample, covers_all, V0, bb, refine, pool, last)
        run.counts["certify_passes"] += over_all
        attempts.append(rr.residual)
        if best is None or rr.residual < best[0].residual:
            best = (rr, d6, a, bb, c0, over_all)
        if over_all and rr.residual <= s.tol:
            break
    return best, attempts


def _unit_notes(diag, bb, noise, n):
    """Units at the detection limit (ATV21 Sec. 1.3, the set P of Lemma D.13): |b| above
    sqrt(2 log n), or a T_2 weight ``|a phi(b)|`` within 3 noise levels of the plain
    estimator ``mean y He_2`` (``noise``; conservative: the span of V comes from it).
    Recorded in the diagnostics; returns the sentence for the message ("" when none)."""
    large = np.flatnonzero(np.abs(bb) > math.sqrt(2.0 * math.log(max(n, 3))))
    diag["units_large_bias"] = tuple(int(i) for i in large)
    weak = np.flatnonzero(np.abs(diag["zeta2"]) <= 3.0 * noise[2])
    diag["units_below_noise"] = tuple(int(i) for i in weak)
    unreliable = sorted(set(diag["units_large_bias"]) | set(diag["units_below_noise"]))
    if not unreliable:
        return ""
    return (
        f" Estimated units {unreliable} are at the detection limit (T_2 weight |a phi(b)| within 3 "
        f"noise levels = {3 * noise[2]:.1e}, or |b| > sqrt(2 log n)): a unit with |b| this large is "
        "nearly always or never active and cannot be recovered at this n"
    )


def _outcome(run, data, s, rr, attempts, note, refine, prec):
    """The status: ``exact`` only when the residual over all samples is at most ``tol``
    and the region system determined every unit; never on a wrong network."""
    n, d, k = data.n, data.d, s.k
    order = np.argsort(-np.linalg.norm(rr.U, axis=0), kind="stable")
    params = dict(U=rr.U[:, order], V=rr.V[order], b=rr.b[order], c=rr.c, residual=rr.residual)
    residual, start = rr.residual, rr.history[0]
    if not refine:
        return run.result(
            Status.APPROXIMATE,
            f"ATV21 estimate (Algorithm 6) with (U, c) by least squares: relative residual "
            f"{residual:.2e} over {n} samples; refine=True makes it exact on noiseless data" + note,
            **params,
        )
    if residual <= s.tol and not rr.undetermined:
        return run.result(
            Status.EXACT,
            f"recovered {k} hidden units with biases exactly: ATV21 estimate from "
            f"{run.counts['n_estimate']} samples (residual {start:.2e}, tensor step {len(attempts)}) made exact by "
            + (
                "BJW19 Algorithm 5 on the affine lift [x, 1]; relative residual "
                if rr.rounds == 0 and rr.n_regions == 0
                else f"{rr.rounds} rounds of activation-region refinement; relative residual "
            )
            + f"{residual:.2e} over {n} samples"
            + (
                ""
                if prec.is_double
                else f" (certified at {prec.name} precision, floor {prec.floor(d, k):.1e}; fitted in float64)"
            ),
            exact=True,
            **params,
        )
    if residual <= s.tol:
        return run.result(
            Status.NON_IDENTIFIABLE,
            f"the network fits exactly (residual {residual:.2e}) but the activation regions "
            f"populated by the samples do not determine units {list(rr.undetermined)} (the "
            "region system has rank < k: such a unit is active on all or on no samples, or "
            "always together with others); more samples, or a smaller |b|, may fix it" + note,
            **params,
        )
    return run.result(
        Status.FAILED,
        f"the ATV21 estimate is outside the basin of the activation-region refinement: the "
        f"residual went from {start:.2e} to {residual:.2e} in {rr.rounds} rounds, best of "
        f"{len(attempts)} tensor steps (exact needs "
        f"<= {s.tol:.1e}). Try more samples (the estimate's error falls like n^-1/2), another "
        "random_state, or check that the outputs are noiseless (for noisy outputs use "
        "refine=False) and X standard Gaussian" + note,
        **params,
    )


def start_size(d, k):
    """First size of the adaptive estimation sample: ``max(20000, 500 d k)``. Measured on
    random teachers (``docs/atv21.md``): at (d, k, m) = (20, 8, 2), n = 1e6, a start of
    500 d k = 80,000 was exact after 0-1 doublings in 5 of 5 seeds, 1.3x faster than
    reading every sample; a start of 200 d k needed 2-3 doublings and was slower."""
    return max(20000, 500 * d * k)


#: Tensor steps tried at an estimation size below all samples before doubling it (the
#: full ``n_restarts`` are tried once every sample is used).
ADAPTIVE_RESTARTS = 2

#: At an adaptive estimation size n_e, the refinement runs on the first REFINE_FACTOR n_e
#: rows of the same random sample (at most ``n_refine``).
REFINE_FACTOR = 4


def _estimation_samples(data, s, stream, size, have):
    """The samples at estimation size ``size``: the first ``size`` rows of the random
    ``stream`` for the moments, gathered in memory on every rank (a one-process
    :class:`Samples`), and its first REFINE_FACTOR ``size`` rows (at most ``n_refine``)
    for the refinement; or, once ``size`` passes GATHER_FRACTION of n, ``data`` itself
    and the refinement sample of the last size (:func:`_refinement_sample`). Returns
    (moment samples, rows used, (refinement sample, whether it is all samples), gathered
    rows so far)."""
    if size > GATHER_FRACTION * data.n:
        return data, data.n, _refinement_sample(data, s), have
    ell = REFINE_FACTOR * size if s.n_refine is None else min(REFINE_FACTOR * size, s.n_refine)
    have = data.extend(stream, max(size, ell), have)
    sample = (have[0][:ell], have[1][:ell]), False
    return Samples(have[0][:size], have[1][:size], n_jobs=data.n_jobs), size, sample, have


def _estimate_and_refine(run, data, s, refine):
    """Steps 2-7 on a growing random sample (relufast's adaptive estimation, as in
    bjw19-gaussian): the moments of the first ``start_size(d, k)`` rows (or
    ``n_estimate``), the tensor steps and the refinement on the same rows (at most
    ``n_refine`` of them); while no network is certified over all samples (and
    determined), the estimation sample doubles, until it is every sample, where the
    refinement takes its own ``n_refine`` random rows. With ``refine=False`` or
    ``n_estimate="all"`` the moments read every sample at once. Returns (best or None,
    residuals of every tensor step)."""
    n, k = data.n, s.k
    adaptive = refine and s.n_estimate != "all"
    size = min(n, s.n_estimate or start_size(data.d, k)) if adaptive else n
    stream, have, attempts = SampleStream(n, s.rng), None, []
    best = None
    while True:
        est, size, (sample, covers_all), have = _estimation_samples(data, s, stream, size, have)
        final = size >= n
        with run.stage("moments"):
            W, g, P2 = _span_and_combination(run, est, s)
            T, noise = _hermite_tensors(run, est, s, W, g)
        run.counts.update(n_estimate=size, n_refine=len(sample[0]))
        if run.diag["span_eigenvalue_ratio"] >= 1e-12:
            restarts = s.n_restarts if final else min(s.n_restarts, ADAPTIVE_RESTARTS)
            found, tried = _restarts(run, data, s, T, W, noise, sample, covers_all, refine, restarts, P2)
            attempts += tried
            if found is not None and (best is None or found[0].residual <= best[0].residual):
                best = found
            if best is not None and best[5] and best[0].residual <= s.tol and not best[0].undetermined:
                break
        if final:
            break
        size *= 2
        run.counts["doublings"] += 1
    return best, attempts


def _atv21(X, Y, n_hidden, *, refine, comm, prec, **options):
    """The pipeline of :func:`atv21` (steps 1-7 of its Notes), one named step per call."""
    run = Run("atv21")
    data, s = _validate(X, Y, n_hidden, comm=comm, prec=prec, **options)
    run.precision = prec.name
    run.counts.update(n_samples=data.n, n_hidden=s.k, n_certify=data.n, doublings=0, certify_passes=0)
    diag = run.diag
    diag.update(backend=BACKEND, threads=data.n_jobs)
    _check_gaussian(run, data)
    best, attempts = _estimate_and_refine(run, data, s, refine)
    if best is None and diag["span_eigenvalue_ratio"] < 1e-12:
        return run.result(
            Status.FAILED,
            f"T_2 has fewer than k = {s.k} nonzero eigenvalues (ratio "
            f"{diag['span_eigenvalue_ratio']:.1e}): some unit is invisible (a_i = 0 or "
            "|b_i| very large) or two units are parallel",
        )
    if best is None:
        return run.result(
            Status.FAILED,
            "the tensor step produced non-finite parameters (degenerate "
            "Jennrich pencil) in every restart; try more samples or another random_state",
        )
    rr, d6, a, bb, c0, over_all = best
    if not over_all:
        rr = _certify_all(data, rr)
        run.counts["certify_passes"] += 1
    diag.update(d6)
    diag.update(
        estimate_a=a,
        estimate_b=bb,
        estimate_c_combined=c0,
        restarts=len(attempts),
        restart_residuals=np.array(attempts),
    )
    note = _unit_notes(diag, bb, diag["tensor_noise_plain"], data.n)
    diag.update(
        refine_history=np.array(rr.history),
        refine_rounds=rr.rounds,
        undetermined_units=rr.undetermined,
        n_regions=rr.n_regions,
        n_certain=rr.n_certain,
        n_trimmed=rr.n_trimmed,
    )
    run.counts.update(refine_rounds=rr.rounds, regions=rr.n_regions, restarts=len(attempts))
    return _outcome(run, data, s, rr, attempts, note, refine, prec)


def atv21(
    X,
    Y,
    n_hidden,
    *,
    refine=True,
    tol=1e-10,
    max_rounds=10,
    margin=0.1,
    n_restarts=8,
    n_refine=200000,
    n_estimate=None,
    n_jobs=None,
    random_state=None,
    block_size=256,
    comm=None,
    precision=None,
):
    """Recover ``Y = relu(X V^T + b) U^T + c`` for Gaussian X, k <= d, any m (ATV21 Thm 3.1).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Inputs, i.i.d. N(0, I_d) for the guarantee.
    Y : array-like of shape (n_samples, n_outputs) or (n_samples,)
        Outputs; noiseless for an exact result.
    n_hidden : int
        Number of hidden units k <= n_features.
    refine : bool, default=True
        Run the activation-region refinement after the paper's estimate (exact on noiseless
        data). False returns the paper's estimate with status ``approximate``.
    tol : float, default=1e-10
        Largest relative residual ``||Y - f(X)||_F / ||Y||_F`` accepted as exact.
    max_rounds : int, default=10
        Rounds of the region refinement.
    margin : float, default=0.1
        First-round margin of the region refinement.
    n_refine : int or None, default=200000
        Samples (a random subset) used by the rounds of the region refinement; the final
        fit of (U, c) and the certificate use all samples. None: all samples throughout.
    n_restarts : int, default=8
        Tensor steps (new random contractions; CP-ALS polish on every other one) tried
        until the refinement certifies the network; the best is returned. At an adaptive
        estimation size below all samples at most 2 are tried before the size doubles.
    n_estimate : None, int or "all", default=None
        Samples of the moment estimate (steps 2-3). None: adaptive, starting from a random
        sample of :func:`start_size` ``= max(20000, 500 d k)`` rows and doubling it while no
        network is certified over all samples, up to all of them; an int sets the start
        size; "all" reads every sample in the moments (the behaviour before adaptive
        estimation). ``refine=False`` (noisy outputs: the statistics need every sample)
        always uses all. ``counts["n_estimate"]``, ``counts["doublings"]`` and
        ``counts["certify_passes"]`` report what was used.
    n_jobs : int or None, default=None
        Threads for the C++ kernels (None or -1: all cores).
    random_state : None, int or numpy Generator
        Seeds the output combination and Jennrich's random contractions.
    block_size : int, default=256
        Samples per block of the moment kernels.
    comm : mpi4py communicator, optional
        Each rank passes its own samples; the moments, the Gaussianity probe, the
        refinement sample and the certificate are reduced or gathered over the ranks, and
        every rank returns the same result: that of one process on the concatenated
        samples, up to rounding (``docs/scale.md``).
    precision : None, str or float, optional
        Precision of the outputs (default: from Y's dtype). Below float64 ``tol`` is raised
        to the rounding floor (:mod:`relufast.stages.precision`); the region refinement
        fits in float64.

    X and Y may be NumPy memmaps (read in place, block by block) or dask arrays (row
    blocks); only the refinement sample (``n_refine`` rows), the adaptive estimation
    sample (below a quarter of n) and the Gaussianity probe are gathered in memory.

    Which stages read every sample: the certificate (the residual of the refined network,
    one pass per network fitted to ``tol`` on the refinement sample) and the finiteness
    check always; the moments only with ``n_estimate="all"``, ``refine=False``, or once the
    adaptive sample has doubled past a quarter of n.

    Returns
    -------
    RecoveryResult
        With ``b`` and ``c``. ``exact`` when the refinement reached ``tol`` over all samples
        and the region system determined every unit; ``non_identifiable`` when the fit is
        exact but some unit is undetermined (``diagnostics["undetermined_units"]``);
        ``failed`` when the estimate was outside the refinement's basin; ``approximate``
        with ``refine=False``.

    Notes
    -----
    Steps (ATV21, Algorithm 6 = Algorithm 4 with l = 1 + Algorithm 3):

    1. ``y = Y g`` for a random unit g (the paper's single output; a = U^T g).
    2. T_2 of the outputs (C++, 2 n m d^2 flops), span W (d, k) of V from its top-k
       eigenvectors (the practical option of ATV21 Sec. 3.6).
    3. T_0..T_4 of y in the span, z = W^T x (C++, ~2 n k^4 flops), in 8 mergeable batches
       whose spread gives the noise of T_3 and T_4.
    4. Alg. 4 steps 1-4: Jennrich on the joint pencil of the flattenings of T_3 and T_4,
       CP-ALS polish: directions up to sign. With m >= k outputs (and ``refine``) the
       first tensor step takes the directions from the second moments of every output
       instead (relufast's own, beyond the paper: :func:`_output_pencil`), the later ones
       alternate (:data:`DIRECTION_MODES`); ``diagnostics["directions_from"]`` says which.
    5. Alg. 2: zeta_j = SymPowLS(T_j), ``b = -zeta_3 / zeta_2``, ``a = sqrt(2 pi) e^{b^2/2} zeta_2``.
    6. Alg. 3 (FixSigns) from T_1; ``c = T_0 - sum_i a_i c_0(b_i)``.
    7. (U, c) for all outputs by least squares; region refinement (beyond the paper);
       the residual over all samples is the certificate.

    Steps 2-3 run on the adaptive estimation sample n_e (``n_estimate``): their cost is
    2 n_e (m d^2 + k^4) flops, and steps 2-7 repeat with n_e doubled until a network is
    certified over all samples.
    """
    prec = resolve_precision(Y, precision)
    with single_threaded_blas():
        return _atv21(
            X,
            Y,
            n_hidden,
            refine=refine,
            tol=tol,
            max_rounds=max_rounds,
            margin=margin,
            n_restarts=n_restarts,
            n_refine=n_refine,
            n_estimate=n_estimate,
            n_jobs=n_jobs,
            random_state=random_state,
            block_size=block_size,
            comm=comm,
            prec=prec,
        )


# ---------------------------------------------------------------------------------------
# Theorem 3.2: l = 2 (k up to d (d + 1) / 2), signs ambiguous; Algorithm 5 (fit).
# ---------------------------------------------------------------------------------------


def _algorithm4_l2(T, k, rng, noise5=0.0, noise6=0.0, n_draws=10):
    """Algorithm 4 with l = 2 on dense T_0..T_6 (one output, dimension d).

    Steps 1-4: the joint pencil of flatten(T_5; 2, 2, 1) and flatten(T_6; 2, 2, 2), whitened
    by the top-k left singular vectors of [flatten(T_5; 2, 3), flatten(T_6; 2, 4)]; the
    eigenvectors are +-vec(w_i w_i^T), whose top eigenvector is +-w_i. Step 5: Algorithm 2
    with Hermite indices r = 0..3 (j = 2..5) and q = argmax_{r in {1, 2}} |gamma_r|
    (errata: Lemma 4.5 with k = l - 2 >= 0, q the Hermite index).

    Returns (Wt (k, d) unit rows with unknown per-unit sign, a (k,), b (k,) = xi_i b_i,
    diagnostics).
    """
    d = T[1].shape[0]
    w5 = 1.0 / noise5 if noise5 > 0 else 1.0 / max(float(np.linalg.norm(T[5])), 1e-300)
    w6 = 1.0 / noise6 if noise6 > 0 else 1.0 / max(float(np.linalg.norm(T[6])), 1e-300)
    F = np.hstack([w5 * T[5].reshape(d * d, -1), w6 * T[6].reshape(d * d, -1)])
    Ul, sv, _ = np.linalg.svd(F, full_matrices=False)
    P = Ul[:, :k]
    T5 = T[5].reshape(d * d, d * d, d)
    T6 = T[6].reshape(d * d, d * d, d * d)
    T5p = np.einsum("ap,bq,abc->cpq", P, P, T5)
    T6p = np.einsum("ap,bq,abc->cpq", P, P, T6)
    pencil = np.concatenate([w5 * T5p, w6 * T6p], axis=0)
    Z0, gap = jennrich(pencil, rng, n_draws=n_draws)
    A_, Bf, Cf = cp_als(pencil, Z0)
    Z = merge_symmetric_factors(Bf, Cf)
    if not np.all(np.isfinite(Z)):
        Z = Z0
    Wt = np.empty((k, d))
    for i in range(k):
        Mi = (P @ Z[:, i]).reshape(d, d)
        ev, E = np.linalg.eigh(0.5 * (Mi + Mi.T))
        Wt[i] = E[:, np.argmax(np.abs(ev))]
    Zt = Wt.T
    gam = np.array([_sympow_ls(T[j], Zt, j) for j in range(2, 6)])  # gamma_r, r = j - 2
    q = np.where(np.abs(gam[1]) >= np.abs(gam[2]), 1, 2)
    idx = np.arange(k)
    with np.errstate(divide="ignore", invalid="ignore"):
        bt = -(gam[q + 1, idx] + q * gam[q - 1, idx]) / gam[q, idx]
        bt = np.where(np.isfinite(bt), bt, 0.0)
        hq = np.where(q == 1, bt, bt * bt - 1.0)
        at = (-1.0) ** q * _SQRT_2PI * np.exp(np.minimum(0.5 * bt**2, 700.0)) * gam[q, idx] / hq
    diag = {"flattening_singular_values": sv, "jennrich_gap": gap, "gamma": gam, "hermite_index_q": q}
    return Wt, at, bt, diag


def recover_general_from_tensors(tensors, n_hidden, *, random_state=None):
    """ATV21 Algorithm 4 with l = 2 (+ Algorithm 2) on given tensors T_0..T_6 (one output).

    Needs the w_i (x) w_i linearly independent (k <= d (d + 1) / 2). The signs of (w_i, b_i)
    are not identified (Theorem 3.2, Sec. 3.8): each unit is returned up to one common flip.

    Returns
    -------
    a : ndarray (k,), V : ndarray (k, d) unit rows, b : ndarray (k,), diagnostics : dict
    """
    T = [np.asarray(t, dtype=np.float64) for t in tensors]
    if len(T) != 7 or any(T[r].shape != (T[1].shape[0],) * r for r in range(7)):
        raise ValueError("tensors must be T_0..T_6 with T_r of shape (d,) * r")
    d = T[1].shape[0]
    k = check_positive_int(n_hidden, "n_hidden")
    if k > d * (d + 1) // 2:
        raise ValueError(f"l = 2 needs n_hidden <= d (d + 1) / 2 = {d * (d + 1) // 2}; got {k}")
    with single_threaded_blas():
        Wt, a, b, diag = _algorithm4_l2(T, k, check_random_state(random_state))
    return a, Wt, b, diag


def _fit_features(X, V, b):
    """Algorithm 5's features ``[relu(z), relu(-z), x, 1]`` with ``z = X V^T + b``."""
    Zp = X @ V.T + b
    return np.hstack([np.maximum(Zp, 0.0), np.maximum(-Zp, 0.0), X, np.ones((X.shape[0], 1))])


def _fold_units(coef, V, b):
    """Claim D.14: the least-squares coefficients (2k + d + 1, m) of Algorithm 5 rewritten as
    a ReLU network (U, V, b, c) of k + 2 r units (see :func:`fit_network`)."""
    k, d = V.shape
    alpha, alpha2, lin, const = coef[:k], coef[k : 2 * k], coef[2 * k : 2 * k + d], coef[-1]
    # relu(-z) = relu(z) - z with z = v.x + b:
    U_units = (alpha + alpha2).T  # (m, k)
    lin = lin - V.T @ alpha2  # (d, m)
    const = const - b @ alpha2
    # The linear part lin^T x (m outputs) has rank r <= min(d, m); each rank-one piece
    # s u v^T becomes two units, s v (relu(u.x) - relu(-u.x)): k + 2 units for one output.
    Ul, s, Vt = np.linalg.svd(lin, full_matrices=False)
    r = int(np.sum(s > 1e-12 * max(s[0], 1e-300))) if s.size else 0
    V_out = np.vstack([V] + [np.vstack([Ul[:, j], -Ul[:, j]]) for j in range(r)])
    b_out = np.concatenate([b, np.zeros(2 * r)])
    U_out = np.hstack([U_units] + [np.column_stack([s[j] * Vt[j], -s[j] * Vt[j]]) for j in range(r)])
    return U_out, V_out, b_out, const


def fit_network(X, Y, V, b):
    """ATV21 Algorithm 5, steps 3-5: a network of at most k + 2 units with small L2 error.

    Least squares on the features ``relu(v_i . x + b_i)``, ``relu(-v_i . x - b_i)`` (both
    signs, since Theorem 3.2 leaves the sign of each unit open) and ``(x, 1)``; the affine
    part absorbs the units that were not recovered (Lemma D.13). The fit is rewritten as a
    ReLU network (Claim D.14): ``sigma(-z) = sigma(z) - z`` folds the second feature into the
    first and into the linear part, and the linear part ``v' . x`` becomes the two units
    ``||v'|| (relu(u . x) - relu(-u . x))``; the constant is the output offset c.

    Parameters
    ----------
    X : ndarray (n, d), Y : ndarray (n, m), V : ndarray (k, d), b : ndarray (k,)

    Returns
    -------
    U : ndarray (m, k + 2 r), V : ndarray (k + 2 r, d), b : ndarray (k + 2 r,), c : ndarray (m,)
        r = rank of the linear part (at most 1 for one output: k + 2 units, as in the paper).
    """
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64).reshape(len(X), -1)
    V = np.asarray(V, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    coef = np.linalg.lstsq(_fit_features(X, V, b), Y, rcond=None)[0]  # (2k + d + 1, m)
    return _fold_units(coef, V, b)


def _fit_network_reduced(data, start, V, b):
    """:func:`fit_network` on the global rows ``start .. n - 1`` of ``data`` by a reduction:
    the normal equations of the features, summed over blocks and ranks, solved for their
    minimum-norm solution (the features are rank-deficient: relu(z) - relu(-z) = z)."""

    def one_block(Xb, Yb):
        F = _fit_features(np.asarray(Xb, dtype=np.float64), V, b)
        return {"gram": F.T @ F, "cross": F.T @ np.asarray(Yb, dtype=np.float64)}

    part = _rows(data, start, data.n)
    st = data.reduce(part.map_reduce(one_block))
    G, H = st["gram"], st["cross"]
    scale = np.sqrt(np.maximum(np.diag(G), 1e-300))
    coef = np.linalg.lstsq(G / np.outer(scale, scale), H / scale[:, None], rcond=1e-12)[0] / scale[:, None]
    return _fold_units(coef, V, b)


def atv21_general(X, Y, n_hidden, *, fit=False, tol=1e-10, n_jobs=None, random_state=None, block_size=256, comm=None):
    """ATV21 Theorem 3.2: Algorithm 4 with l = 2 (k up to d (d + 1) / 2, k > d allowed).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Inputs, i.i.d. N(0, I_d). The order-6 moment costs ~2 n d^6 flops: small d only.
    Y : array-like of shape (n_samples, n_outputs) or (n_samples,)
    n_hidden : int
        k <= d (d + 1) / 2.
    fit : bool, default=False
        Algorithm 5: tensors from the first half of the samples, then a least-squares fit on
        the second half over both signs of every recovered unit and (x, 1), rewritten as a
        network of at most k + 2 units (one output). The result is then sign-free: a network
        with small L2 error, status ``approximate`` (``exact`` if its residual over all
        samples is at most ``tol``).
    tol, n_jobs, random_state, block_size, comm
        As in :func:`atv21` (X and Y may also be memmaps or dask arrays; the fit of
        Algorithm 5 is a reduction of its normal equations).

    Returns
    -------
    RecoveryResult
        Without ``fit``: the recovered units with ``diagnostics["sign_ambiguous"]`` (each
        (v_i, b_i) is known only up to one common sign, Theorem 3.2; ``a`` has no ambiguity),
        U from T_2 of every output (sign-free), status ``approximate``. Units with
        ``|b_i| > sqrt(2 log n)`` (too large to recover at this n) are listed in
        ``diagnostics["units_large_bias"]`` and named in the message, never dropped.

    Notes
    -----
    Sampled l = 2 is far more sample-hungry than l = 1 (T_5 and T_6 errors decay like
    N^-1/2 from a large constant); expect a usable estimate only at N >> 1e7 for d = 4.
    """
    with single_threaded_blas():
        return _atv21_general(
            X,
            Y,
            n_hidden,
            fit=fit,
            tol=tol,
            n_jobs=n_jobs,
            random_state=random_state,
            block_size=block_size,
            comm=comm,
        )


def _validate_general(X, Y, n_hidden, tol, block_size, n_jobs, comm):
    """Samples and checks of :func:`atv21_general`. Returns (data, k, block_size)."""
    data = Samples.from_arrays(X, Y, comm=comm, n_jobs=resolve_n_jobs(n_jobs))
    n, d = data.n, data.d
    k = check_positive_int(n_hidden, "n_hidden")
    block_size = check_positive_int(block_size, "block_size")
    if not (isinstance(tol, (int, float, np.floating)) and np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive number; got {tol!r}")
    if k > d * (d + 1) // 2:
        raise ValueError(
            f"atv21-general (l = 2) needs n_hidden <= d (d + 1) / 2 = {d * (d + 1) // 2} "
            f"(the w_i (x) w_i must be independent); got n_hidden = {k}"
        )
    if d > 12:
        raise ValueError(
            f"atv21-general forms order-6 tensors in the input space (d^6 = {d**6} entries "
            f"per output); got d = {d} > 12"
        )
    n_min = max(4 * (d + 1), 50 * k)
    if n < n_min:
        raise InsufficientSamples(f"atv21-general needs at least {n_min} samples for d = {d}, k = {k}; got n = {n}")
    return data, k, block_size


def _general_moments(run, data, half, rng, n_jobs, block_size):
    """T_0..T_6 of ``y = Y g`` (random unit g) in the input space and T_2 of every output,
    over the global rows ``0 .. half - 1``, in NOISE_BATCHES batches for the noise."""
    d, m = data.d, data.m
    g = rng.standard_normal(m)
    g /= np.linalg.norm(g)
    T, parts, _ = _batch_tensors(
        data,
        half,
        lambda Xb, Yb: Yb @ g[:, None],
        NOISE_BATCHES,
        lambda: HermiteAccumulator(1, order=6, n_features=d, n_jobs=n_jobs, block_size=block_size),
    )
    T, parts = [t[0] for t in T], [[t[0] for t in p] for p in parts]
    noise = [float(np.sqrt(np.mean([np.sum((p[r] - T[r]) ** 2) for p in parts]) / len(parts))) for r in range(7)]
    run.diag["tensor_noise"] = np.array(noise)
    acc2 = _rows(data, 0, half).accumulate(SecondMomentAccumulator(d, m, n_jobs=n_jobs, block_size=block_size))
    acc2.set_state(data.reduce(acc2.state()))
    return T, noise, acc2.tensor()


def _general_algorithm5(run, data, half, Wt, bt, k, tol, note):
    """Algorithm 5 (``fit=True``): the k + 2 unit network fitted on the held-out rows."""
    with run.stage("fit"):
        U, V, b, c = _fit_network_reduced(data, half, Wt, bt)
        residual = relative_residual(data, None, V, U, data.n_jobs, RELU, b=b, c=c)
    exact = residual <= tol
    return run.result(
        Status.EXACT if exact else Status.APPROXIMATE,
        f"ATV21 Algorithm 5: a network of {V.shape[0]} units (the {k} recovered units with "
        f"both signs folded in, plus the linear part as unit pairs) fitted on {data.n - half} "
        f"held-out samples; relative residual {residual:.2e} over all {data.n} samples" + note,
        U=U,
        V=V,
        b=b,
        c=c,
        residual=residual,
        exact=exact,
    )


def _general_units(run, data, T2all, Wt, bt, k, note):
    """Without ``fit``: U from T_2 of every output (sign-free: ``zeta_2 = U_oi phi(b_i)``),
    c as the mean residual over all samples (a reduction), signs stated ambiguous."""
    U = np.array([_sympow_ls(T2all[o], Wt.T, 2) for o in range(data.m)]) / _phi(bt)[None, :]
    st = certify(data, Wt, None, b=bt, c=np.zeros(data.m))
    c = (st["cross"][k] - st["gram"][k, :k] @ U.T) / data.n
    residual = relative_residual(data, None, Wt, U, data.n_jobs, RELU, b=bt, c=c)
    run.diag["residual_is_sign_dependent"] = True
    return run.result(
        Status.APPROXIMATE,
        f"ATV21 Theorem 3.2 (Algorithm 4 with l = 2): {k} units, each (v_i, b_i) known only up "
        "to one common sign flip (not identifiable when the units are linearly dependent); "
        "U from T_2 is sign-free, the offset c and the residual "
        f"({residual:.2e}) depend on the signs. Use fit=True (Algorithm 5) for a network "
        "with small L2 error" + note,
        U=U,
        V=Wt,
        b=bt,
        c=c,
        residual=residual,
    )


def _atv21_general(X, Y, n_hidden, *, fit, tol, n_jobs, random_state, block_size, comm):
    run = Run("atv21-general")
    data, k, block_size = _validate_general(X, Y, n_hidden, tol, block_size, n_jobs, comm)
    n = data.n
    rng = check_random_state(random_state)
    run.counts.update(n_samples=n, n_hidden=k)
    diag = run.diag
    diag.update(backend=BACKEND)
    diag.update(gaussianity(data.take(np.arange(min(n, GAUSS_ROWS)))[0]))
    half = n // 2 if fit else n
    with run.stage("moments"):
        T, noise, T2all = _general_moments(run, data, half, rng, n_jobs, block_size)
    with run.stage("tensor"):
        Wt, a, bt, d4 = _algorithm4_l2(T, k, rng, noise5=noise[5], noise6=noise[6])
        diag.update(d4)
    large = tuple(int(i) for i in np.flatnonzero(np.abs(bt) > math.sqrt(2.0 * math.log(max(n, 3)))))
    diag["units_large_bias"] = large
    diag["sign_ambiguous"] = tuple(range(k))
    note = (
        f"; units {list(large)} have |b| > sqrt(2 log n) = {math.sqrt(2 * math.log(n)):.2f}: too large "
        "to recover at this n (their parameters are unreliable)"
        if large
        else ""
    )
    if fit:
        return _general_algorithm5(run, data, half, Wt, bt, k, tol, note)
    return _general_units(run, data, T2all, Wt, bt, k, note)
