"""ATV21 Theorem 3.2: l = 2 (k up to d (d + 1) / 2), signs ambiguous; Algorithm 5 (fit)."""

import math

import numpy as np

from ..._blas import single_threaded_blas
from ..._knapsack import sign_flips
from ..._native import BACKEND
from ..._protocol import recovery_method
from ..._result import Run, Status
from ..._validation import (
    InsufficientSamples,
    check_positive_int,
    check_random_state,
    resolve_n_jobs,
)
from ...activations import RELU
from ...stages.diagnostics import GAUSS_ROWS, gaussianity
from ...stages.fit import relative_residual
from ...stages.hermite import SQRT_2PI
from ...stages.moments import HermiteAccumulator
from ...stages.reduce import Samples
from ...stages.tensor import cp_als, jennrich, merge_symmetric_factors
from .sample_tensors import _batch_tensors, _rows
from .tensors import NOISE_BATCHES, _sympow_ls


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
        at = (-1.0) ** q * SQRT_2PI * np.exp(np.minimum(0.5 * bt**2, 700.0)) * gam[q, idx] / hq
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


@recovery_method("atv21-general", whiten=True)
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
        (v_i, b_i) is known only up to one common sign, Theorem 3.2), oriented by the
        linear term of a least-squares fit (``diagnostics["units_flipped"]``,
        ``["signs_resolved"]``) and U, c fitted by least squares over all samples (relufast's
        departure: the paper's U from T_2 / phi(b_i) blows up for large |b_i|), status
        ``approximate`` with that network's residual. Units with
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
    """T_0..T_6 of ``y = Y g`` (random unit g) in the input space, over the global rows
    ``0 .. half - 1``, in NOISE_BATCHES batches for the noise."""
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
    return T, noise


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


def _normal_solve(G, H):
    """Minimum-norm least squares from normal equations (G = F^T F, H = F^T Y), columns
    scaled to unit diagonal; a feature that is (numerically) zero on every sample, as a unit
    never active there, gets coefficient 0 (scaling it up amplified rounding to 1e137)."""
    diag = np.diag(G)
    keep = diag > 1e-24 * max(float(diag.max(initial=0.0)), 1e-300)
    C = np.zeros((G.shape[0], H.shape[1]))
    if keep.any():
        s = np.sqrt(diag[keep])
        Gk = G[np.ix_(keep, keep)] / np.outer(s, s)
        C[keep] = np.linalg.lstsq(Gk, H[keep] / s[:, None], rcond=1e-12)[0] / s[:, None]
    return C


def _general_units(run, data, Wt, bt, k, note):
    """Without ``fit``: the recovered units with the signs their linear term asks for, and U,
    c by least squares over all samples (a reduction of the normal equations).

    Theorem 3.2 leaves the sign of each (v_i, b_i) open. A unit taken with the wrong sign
    fits as ``relu(-z) = relu(z) - z``: least squares on ``[relu(z~), x, 1]`` puts minus the
    flipped units' ``u_i v_i^T`` in its linear term, and the 0/1 flips solve that linear
    system (:func:`relufast._knapsack.sign_flips`, by lattice reduction when k > d m).
    U is then refitted on ``[relu(z), 1]``. With T_2 / phi(b_i) instead (the paper's
    formula), U blows up for a unit with a large |b_i| (phi(b_i) tiny) and the residual with
    it (``test_atv21_general_residual_is_that_of_a_fitted_network`` bounds both)."""
    d = data.d

    def one_block(Xb, Yb):
        Xb = np.asarray(Xb, dtype=np.float64)
        F = np.hstack([np.maximum(Xb @ Wt.T + bt, 0.0), Xb, np.ones((len(Xb), 1))])
        return {"gram": F.T @ F, "cross": F.T @ np.asarray(Yb, dtype=np.float64)}

    st = data.reduce(_rows(data, 0, data.n).map_reduce(one_block))
    C = _normal_solve(st["gram"], st["cross"])
    flip, ok = sign_flips(Wt, C[:k].T, C[k : k + d].T)
    s = np.where(flip, -1.0, 1.0)
    W, b, flipped = Wt * s[:, None], bt * s, np.nonzero(flip)[0]
    # U and c for the oriented units: [relu(z), 1] is the first block of the same normal
    # equations with z's sign changed for the flipped units (relu(-z) = relu(z) - z).
    T = np.zeros((k + d + 1, k + 1))
    T[:k, :k] = np.eye(k)
    T[k + d, k] = 1.0
    for i in flipped:  # relu(-z_i) = relu(z_i) - v_i.x - b_i
        T[k : k + d, i] = -Wt[i]
        T[k + d, i] = -bt[i]
    G2, H2 = T.T @ st["gram"] @ T, T.T @ st["cross"]
    C2 = _normal_solve(G2, H2)
    U, c = C2[:k].T, C2[k]
    residual = relative_residual(data, None, W, U, data.n_jobs, RELU, b=b, c=c)
    run.diag.update(signs_resolved=bool(ok), units_flipped=tuple(int(i) for i in flipped))
    signs = (
        "signs chosen by the linear term of a least-squares fit"
        if ok
        else "signs rounded from the linear term of a least-squares fit (which is not the one of flipped "
        "units: the estimate is too rough, or the data are not this model)"
    )
    return run.result(
        Status.APPROXIMATE,
        f"ATV21 Theorem 3.2 (Algorithm 4 with l = 2): {k} units, each (v_i, b_i) known only up "
        f"to one common sign flip (not identifiable when the units are linearly dependent); {signs}, "
        f"U and c by least squares over all {data.n} samples: relative residual {residual:.2e}. "
        "fit=True (Algorithm 5) gives a network with small L2 error without choosing signs" + note,
        U=U,
        V=W,
        b=b,
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
        T, noise = _general_moments(run, data, half, rng, n_jobs, block_size)
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
    return _general_units(run, data, Wt, bt, k, note)
