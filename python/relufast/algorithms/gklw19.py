"""Ge, Kuditipudi, Li, Wang: learning two-layer neural networks with symmetric inputs.

References
----------
.. [1] R. Ge, R. Kuditipudi, Z. Li, X. Wang. Learning two-layer neural networks with
   symmetric inputs. International Conference on Learning Representations (ICLR), 2019.
   arXiv:1810.06793.

Model: ``y = A relu(W x) + noise`` with x symmetric (x and -x equally likely), W (k, d)
with k <= d, A (m, k) of full column rank; in relufast's names U = A and V = W.

Functions and the paper
-----------------------
``single_neuron``
    Algorithm 1: ``w = 2 E[x x^T]^{-1} E[y x]``.
``detector_matrix``
    The matrix T of the pure-neuron detector (Algorithms 2-3, steps 2-4), in the
    covariance form of docs/gklw19.md (a streaming C++ accumulation; the k d^3 tensor is never
    formed). ``centred=True`` is the noise-corrected detector of Algorithm 3 (eq. 11).
``recover``
    Algorithms 2-4: null space of T (step 3), simultaneous diagonalisation (steps 4-5), sign
    fix, Algorithm 1 for each unit, A = Z^{-1} (steps 6-8); non-square A by Algorithm 4.
    ``practical=True`` is the paper's Section 4 variant: CP-ALS over 10k null-space slices,
    best of several restarts, then W refit with A fixed (accelerated gradient descent).
    Beyond the paper: the certificate (residual over all samples and BJW19 Algorithm 5 for
    every row) behind ``exact``, the activation-region refinement that makes the estimate
    exact on noiseless data, and thresholds at the outputs' precision (docs/gklw19.md).
``population_detector``
    Lemma 19: closed form of T for Gaussian input (for tests and diagnostics).
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np

from .._blas import single_threaded_blas
from .._deadline import check as check_deadline
from .._protocol import recovery_method
from .._result import Run, Status, warn
from .._validation import check_n_hidden, check_positive_int, check_random_state, check_xy, resolve_n_jobs
from ..stages.diagnostics import input_null_space
from ..stages.fit import certify, max_abs, residual_from_stats
from ..stages.moments import detector_matrix, detector_matrix_reference  # noqa: F401 (re-exported for tests)
from ..stages.precision import refine_tolerances, resolve_precision
from ..stages.reduce import Samples, SampleStream
from ..stages.refine import output_basis, refine_if_noiseless, refine_rows, region_refine
from ..stages.tensor import cp_als, jennrich, merge_symmetric_factors

__all__ = [
    "CITATION",
    "single_neuron",
    "detector_matrix",
    "recover",
    "population_detector",
    "symmetry_statistic",
    "vech_weighted",
    "mat_star",
]

CITATION = "R. Ge, R. Kuditipudi, Z. Li, X. Wang. Learning two-layer neural networks with symmetric inputs. ICLR 2019."


def single_neuron(X, y):
    """GKLW19 Algorithm 1: ``w = 2 E[x x^T]^{-1} E[y x]`` for ``y = relu(w . x) + noise``.

    Exact on a symmetrised sample (each x with -x) and unbiased for symmetric inputs
    (Lemma 1: E[relu(w.x) x] = E[x x^T] w / 2).
    """
    X, Y = check_xy(X, y)
    n = X.shape[0]
    C = X.T @ X / n
    return 2.0 * np.linalg.solve(C, X.T @ Y / n).T.squeeze()


def vech_weighted(S):
    """Upper triangle of a symmetric matrix, sqrt(2) on the off-diagonal (an isometry)."""
    d = S.shape[0]
    iu = np.triu_indices(d)
    w = np.where(iu[0] == iu[1], 1.0, math.sqrt(2.0))
    return S[iu] * w


def mat_star(v, k):
    """Inverse of the unweighted vec* (upper triangle, row-major): symmetric k x k matrix."""
    M = np.zeros((k, k))
    M[np.triu_indices(k)] = v
    return M + np.triu(M, 1).T


def population_detector(W, A, *, centred=True):
    """T for Gaussian input N(0, I) from the closed form of Lemma 19 (W (k, d), A (k, k)).

    ``m_ij = (phi cos phi - sin phi) |w_i| |w_j| / pi`` and
    ``N_ij = m_ij I + (phi / pi)(w_i w_j^T + w_j w_i^T) - (sin phi / pi)(|w_i|/|w_j| w_j w_j^T
    + |w_j|/|w_i| w_i w_i^T)``; column (a, c) of T is ``sum_{i<j} (A^T U^(ac) A)_ij
    (N_ij - m_ij I)`` (Alg. 3; Alg. 2 drops the ``m_ij I`` term).
    """
    k, d = W.shape
    iu = np.triu_indices(k)
    cols = []
    terms = {}
    for i in range(k):
        for j in range(i + 1, k):
            ni, nj = np.linalg.norm(W[i]), np.linalg.norm(W[j])
            phi = math.acos(np.clip(W[i] @ W[j] / (ni * nj), -1, 1))
            m = (phi * math.cos(phi) - math.sin(phi)) * ni * nj / math.pi
            N = (
                m * np.eye(d)
                + phi / math.pi * (np.outer(W[i], W[j]) + np.outer(W[j], W[i]))
                - math.sin(phi) / math.pi * (ni / nj * np.outer(W[j], W[j]) + nj / ni * np.outer(W[i], W[i]))
            )
            terms[i, j] = N - (m * np.eye(d) if centred else 0.0)
    for a, c in zip(*iu):
        Uac = np.zeros((k, k))
        Uac[a, c] = Uac[c, a] = 1.0
        if a == c:
            Uac[a, a] = 1.0
        coef = A.T @ Uac @ A
        col = sum(coef[i, j] * terms[i, j] for (i, j) in terms)
        cols.append(vech_weighted(col if not np.isscalar(col) else np.zeros((d, d))))
    return np.array(cols).T


#: Random samples (the same on every rank) used by the cheap checks and the choice of candidate.
PROBE_ROWS = 20000


def symmetry_statistic(X, rows=PROBE_ROWS):
    """Largest standardised odd moment (mean and third moment along the axes): about 1 for
    symmetric data, large when x and -x are not equally likely."""
    Xs = X[: min(len(X), rows)]
    N = len(Xs)
    mean_z = np.abs(Xs.mean(axis=0)) / (Xs.std(axis=0) / math.sqrt(N) + 1e-300)
    third = np.mean(Xs**3, axis=0)
    sd3 = np.sqrt(np.maximum(np.mean(Xs**6, axis=0), 1e-300) / N)
    return float(max(mean_z.max(), (np.abs(third) / sd3).max()))


def _refit_W(X, Y, A, V, steps):
    """W refit with A fixed (the paper's Sec. 4 uses gradient descent): Nesterov-accelerated
    gradient descent on (1/2n) |Y - relu(X W^T) A^T|^2 with step 1/L, L = |A|^2 |X|^2 / n."""
    n = X.shape[0]
    L = np.linalg.norm(A, 2) ** 2 * np.linalg.norm(X, 2) ** 2 / n
    W, Wprev = V.copy(), V.copy()
    for t in range(steps):
        check_deadline("in a gklw19 step")
        Z = W + (t / (t + 3.0)) * (W - Wprev)
        H = X @ Z.T
        R = np.maximum(H, 0.0) @ A.T - Y
        G = ((R @ A) * (H > 0)).T @ X / n
        Wprev, W = W, Z - G / L
    return W


@recovery_method("gklw19")
def recover(
    X,
    Y,
    n_hidden,
    *,
    noise_corrected=True,
    practical=False,
    n_draws=20,
    n_slices=None,
    als_restarts=10,
    als_iter=300,
    refit_steps=200,
    tol=1e-9,
    refine=True,
    precision=None,
    n_jobs=None,
    random_state=None,
    comm=None,
):
    """Recover ``y = A relu(W x) (+ noise)`` for symmetric inputs (GKLW19 Algorithms 1-4).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Inputs from a symmetric distribution (Gaussian, mixtures of +-mu Gaussians,
        Laplace, discrete symmetric, ...).
    Y : array-like of shape (n_samples, n_outputs)
        Outputs, n_outputs >= n_hidden (A of full column rank).
    n_hidden : int
        k <= n_features.
    noise_corrected : bool, default=True
        Algorithm 3's detector (default) or Algorithm 2's.
    practical : bool, default=False
        The paper's Section 4 variant: CP-ALS on ``n_slices`` (default 10 k) random elements
        of the null space from ``als_restarts`` random starts of ``als_iter`` iterations;
        those and ``n_draws`` simultaneous-diagonalisation draws are the candidates, and the
        one whose network fits the data best is kept (the paper's "best one" criterion is
        unstated; selecting by the ALS residual alone failed on 1 trial in 5 at d = 16-24);
        then W is refit with A fixed by ``refit_steps`` steps of accelerated gradient descent.
    n_draws : int, default=20
        Random pairs for the simultaneous diagonalisation (steps 4-5). Without
        ``practical`` the best-separated draw is kept (docs/gklw19.md).
    tol : float, default=1e-9
        Relative residual below which the fit counts as noiseless (a symmetrised noiseless
        sample gives machine precision); raised to the rounding floor of the outputs'
        precision.
    refine : bool, default=True
        When the paper's estimate is not exact, try the activation-region refinement
        (:func:`relufast.stages.refine.region_refine`, bias-free; relufast's own step, not in
        the paper) on a probe sample of at most ``PROBE_ROWS`` rows. It is kept only when it
        brings the residual there to ``tol`` (noiseless data) and the refined network is then
        certified over all samples; on noisy data the paper's estimate is returned unchanged.
    precision : None, str or float, optional
        Precision of the outputs (default: from Y's dtype, e.g. float32). Below float64 the
        zero tests (the rank of the detector, the residual, the row certificates) use
        thresholds raised to the rounding floor (:mod:`relufast.stages.precision`), and an
        exact result is polished in float64 (bias-free region refinement on the probe sample);
        ``result.precision`` names it.
    n_jobs, random_state, comm
        Threads of the C++ kernels; seed or Generator; mpi4py communicator (each rank
        passes its own samples).

    Returns
    -------
    RecoveryResult
        ``exact`` when the relative residual over all samples is at most ``tol`` and every
        row is certified by BJW19 Algorithm 5 on the output span (the network is then
        identified by the data); ``approximate`` otherwise (noisy data); ``failed`` when the
        recovered network explains none of the outputs; ``non_identifiable`` for zero
        outputs, inputs in a subspace or a rank-deficient distinguishing matrix;
        ``unsupported`` for m < k. Every status but ``exact`` and ``approximate`` warns.
        ``diagnostics['distinguishing_sigma']`` is sigma_{k(k-1)/2}(T) / sigma_1(T), which
        is zero when the distinguishing matrix is rank-deficient;
        ``diagnostics['symmetry_statistic']`` near 1 for symmetric inputs (a warning above
        6); ``diagnostics['region_refine_residual']`` the probe residual the refinement
        reached when it ran.
    """
    prec = resolve_precision(Y, precision)
    opt = dict(noise_corrected=noise_corrected, practical=practical, n_draws=n_draws, n_slices=n_slices)
    opt.update(als_restarts=als_restarts, als_iter=als_iter, refit_steps=refit_steps, tol=tol, refine=refine)
    opt.update(n_jobs=n_jobs)
    with single_threaded_blas():
        return _recover(X, Y, n_hidden, opt, prec, random_state, comm)


def _recover(X, Y, n_hidden, opt, prec, random_state, comm):
    """GKLW19 Algorithms 2-4 (and the Sec. 4 variant) as named steps; see :func:`recover`."""
    run = Run("gklw19")
    run.precision = prec.name
    data, k, rng = _validate(X, Y, n_hidden, opt, random_state, comm)
    run.counts.update(n_samples=data.n, n_hidden=k)
    if data.m < k:
        return run.result(
            Status.UNSUPPORTED, f"gklw19 needs A of full column rank, so m >= k; got m = {data.m} < k = {k}"
        )
    # A random probe sample (the same on every rank) for the cheap checks and the choice
    # among candidates; the detector and the residual read every sample.
    Xs, Ys = data.extend(SampleStream(data.n, rng), min(data.n, PROBE_ROWS))
    refusal = _check_inputs(data, Xs, Ys, run.diag)
    if refusal is not None:
        return run.result(*refusal)
    t = time.perf_counter()
    Pl, (T, C, P) = _detector(data, k, opt)
    run.seconds["detector"] = time.perf_counter() - t
    t = time.perf_counter()
    S, refusal = _null_space(T, k, prec.tol(RANK_TOL, data.d, k), run.diag)
    if refusal is not None:
        return run.result(*refusal)
    cands = _candidates(S, k, rng, opt, run.diag)
    run.seconds["decomposition"] = time.perf_counter() - t
    t = time.perf_counter()
    best = _select(data, cands, Pl, C, P, Xs, Ys)
    if best is None:
        return run.result(Status.FAILED, "the recovered pure-neuron directions are linearly dependent")
    V, A = best
    run.counts["candidates"] = len(cands)
    if opt["practical"] and opt["refit_steps"]:
        V = _refit_W(data.X, data.Y, A, V, opt["refit_steps"])
    s_norm = np.linalg.norm(V, axis=1)
    V, A = V / s_norm[:, None], A * s_norm[None, :]
    fit = _certify(data, V, A, Xs, Ys, prec, opt)
    refined = None
    if opt["refine"] and not fit.exact and np.isfinite(fit.residual) and fit.residual < 1.0:
        refined = _region_refinement(data, fit, Xs, Ys, prec, opt, run)
    run.counts["certified_rows"] = (refined or fit).certified
    run.seconds["fit"] = time.perf_counter() - t
    return _outcome(run, data, fit, refined, Pl is not None, prec, opt, (Xs, Ys))


def _validate(X, Y, n_hidden, opt, random_state, comm):
    """Check the arguments (ValueError/TypeError); returns (samples, k, generator)."""
    threads = resolve_n_jobs(opt["n_jobs"])
    data = Samples.from_arrays(X, Y, comm=comm, n_jobs=threads)
    n, d = data.n, data.d
    k = check_n_hidden(n_hidden, d)
    opt["n_draws"] = check_positive_int(opt["n_draws"], "n_draws")
    opt["als_restarts"] = check_positive_int(opt["als_restarts"], "als_restarts")
    opt["refit_steps"] = check_positive_int(opt["refit_steps"], "refit_steps", minimum=0)
    opt["threads"] = threads
    rng = check_random_state(random_state)
    if not (np.isfinite(opt["tol"]) and opt["tol"] > 0):
        raise ValueError(f"tol must be a positive number; got {opt['tol']!r}")
    if not isinstance(opt["refine"], (bool, np.bool_)):
        raise TypeError(f"refine must be True or False; got {type(opt['refine']).__name__}")
    if opt["practical"] and opt["refit_steps"] and (data.distributed or data.lazy):
        raise ValueError(
            "practical=True with refit_steps > 0 needs the samples in memory on one "
            "process; got " + ("an MPI communicator" if data.distributed else "dask arrays") + ": use refit_steps=0"
        )
    if n < (d * (d + 1)) // 2 + 1:
        raise ValueError(f"gklw19 needs more samples than d (d + 1) / 2 = {d * (d + 1) // 2} for d = {d}; got n = {n}")
    return data, k, rng


def _check_inputs(data, Xs, Ys, diag):
    """The data checks before the moments (Alg. 1 needs E[x x^T] invertible; the model needs
    symmetric x). Returns (status, message) for data that determine no network, else None;
    asymmetric inputs only warn."""
    n, d = data.n, data.d
    on = "the outputs" if len(Xs) == n else f"a random sample of {len(Xs)} rows"
    if max_abs(Ys) == 0:
        return (
            Status.NON_IDENTIFIABLE,
            f"the outputs are all zero ({on}): the network U = 0 fits them with any W, so W is "
            "not determined by the data (nothing to recover)",
        )
    null = input_null_space(Xs)
    if null.shape[0]:
        diag["input_null_space"] = null
        return (
            Status.NON_IDENTIFIABLE,
            f"the inputs span a subspace of dimension {d - null.shape[0]} < d = {d} on {on} "
            "(duplicated, zero or linearly dependent input columns): W is not determined along the "
            f"{null.shape[0]} direction(s) in diagnostics['input_null_space'], and Algorithm 1 "
            "needs E[x x^T] invertible. Drop the redundant columns and map W back",
        )
    sym = symmetry_statistic(Xs)
    diag["symmetry_statistic"] = sym
    if sym > 6.0:
        warn(
            f"X does not look symmetric (largest standardised odd moment {sym:.1f}); GKLW19 assumes "
            "x and -x equally likely, so the detector is biased"
        )
    return None


def _detector(data, k, opt):
    """Alg. 4 steps 1-2 (m > k: outputs projected on the top-k left singular vectors P_l of
    E[y x^T]), then the detector matrix T of Alg. 2-3 step 2 (Alg. 3's eq. 11 when
    ``noise_corrected``). Returns (P_l or None, (T, C, P))."""
    Pl = None
    if data.m > k:
        st = data.map_reduce(lambda Xb, Yb: {"count": float(len(Xb)), "yx": Yb.T @ Xb})
        Pfull = st["yx"] / st["count"]
        Pl = np.linalg.svd(Pfull, full_matrices=False)[0][:, :k]
    return Pl, detector_matrix(data, Pl, centred=opt["noise_corrected"], n_jobs=opt["n_jobs"])


#: sigma_{k(k-1)/2}(T) / sigma_1(T) below which the distinguishing matrix is rank-deficient
#: (float64 outputs; raised to the rounding floor at lower precision).
RANK_TOL = 1e-10


def _null_space(T, k, rank_tol, diag):
    """Alg. 2-3 step 3: the k least right singular vectors S of T span {vec*(z_i z_i^T)}.

    Returns (S, None), or (None, (status, message)) when the distinguishing matrix is
    rank-deficient (sigma_{k(k-1)/2}(T) / sigma_1(T) below ``rank_tol``).
    """
    k2 = k * (k - 1) // 2
    # T is tall (d(d+1)/2 >= k(k+1)/2 rows): QR first, then the SVD of the small R.
    R = np.linalg.qr(T, mode="r") if T.shape[0] > T.shape[1] else T
    _, s, Vt = np.linalg.svd(R, full_matrices=True)
    s_full = np.zeros(Vt.shape[0])
    s_full[: len(s)] = s
    gap = float(s_full[k2 - 1] / s_full[0]) if k2 >= 1 and s_full[0] > 0 else 1.0
    diag["distinguishing_sigma"] = gap
    diag["null_sigma"] = float(s_full[k2] / s_full[0]) if len(s_full) > k2 and s_full[0] > 0 else 0.0
    if k2 >= 1 and gap < rank_tol:
        return None, (
            Status.NON_IDENTIFIABLE,
            f"the distinguishing matrix is rank-deficient (sigma_(k(k-1)/2)(T) / sigma_1(T) = {gap:.2e}): "
            "the pure-neuron detector has spurious zeros (GKLW19 needs N or M of full column rank)",
        )
    return Vt[-k:].T, None


def _candidates(S, k, rng, opt, diag):
    """Alg. 2-3 steps 4-5: the pure-neuron directions z_i (as columns) from the null space.

    Without ``practical``: simultaneous diagonalisation of mat*(S zeta_1), mat*(S zeta_2),
    the best-separated of ``n_draws`` draws. With it (Sec. 4): CP-ALS on 10 k random
    null-space slices from ``als_restarts`` starts, and every single draw, all candidates.
    """
    slices = np.array([mat_star(S[:, j], k) for j in range(k)])  # (k, k, k)
    cands = []
    if opt["practical"]:
        ns = 10 * k if opt["n_slices"] is None else check_positive_int(opt["n_slices"], "n_slices")
        G = rng.standard_normal((ns, k))
        R = np.linalg.qr(G)[1]  # CP-ALS on G x slices equals CP-ALS on R x slices
        Tc = np.einsum("rj,jab->rab", R, slices)
        als_res = []
        for _ in range(opt["als_restarts"]):
            check_deadline("in a gklw19 ALS restart")
            B0 = rng.standard_normal((k, k))
            B0 /= np.linalg.norm(B0, axis=0)
            Af, Bf, Cf = cp_als(Tc, B0, n_iter=opt["als_iter"])
            als_res.append(float(np.linalg.norm(Tc - np.einsum("ir,jr,kr->ijk", Af, Bf, Cf)) / np.linalg.norm(Tc)))
            cands.append(merge_symmetric_factors(Bf, Cf))
        diag["als_residual"] = float(min(als_res))
        # Every simultaneous-diagonalisation draw is a candidate too; the fit decides.
        draws = [jennrich(slices, rng, n_draws=1) for _ in range(opt["n_draws"])]
        cands += [z for z, _ in draws]
        diag["eigen_gap"] = max(g for _, g in draws)
    else:
        Zj, egap = jennrich(slices, rng, n_draws=opt["n_draws"])
        diag["eigen_gap"] = egap
        cands.append(Zj)
    return cands


def _select(data, cands, Pl, C, P, Xs, Ys):
    """Alg. 2-3 steps 6-8 for every candidate: sign fix by z_i . mean(y), Algorithm 1 for
    every unit (V = 2 Z P C^{-1}), A = Z^{-1} (times P_l for Alg. 4). With several
    candidates (practical variant) the one whose network fits the probe sample best is kept.

    Returns (V, A), or None when every candidate's directions are linearly dependent.
    """
    ybar = data.map_reduce(lambda Xb, Yb: {"count": float(len(Yb)), "y": Yb.sum(axis=0)})
    ybar = ybar["y"] / ybar["count"]
    if Pl is not None:
        ybar = ybar @ Pl
    CiPt = np.linalg.solve(C, P.T).T  # P C^{-1}
    best = None
    for Zc in cands:
        Z = Zc.T.copy()  # rows z_i
        Z *= np.where(Z @ ybar < 0, -1.0, 1.0)[:, None]
        try:
            Ainv = np.linalg.inv(Z)
        except np.linalg.LinAlgError:
            continue
        Vc = 2.0 * Z @ CiPt
        Ac = Ainv if Pl is None else Pl @ Ainv
        fit = float(np.linalg.norm(Ys - np.maximum(Xs @ Vc.T, 0.0) @ Ac.T))
        if best is None or fit < best[0]:
            best = (fit, Vc, Ac)
    return None if best is None else best[1:]


class _Fit(NamedTuple):
    """A network with its certificate: residual over all samples, rows certified."""

    V: np.ndarray
    A: np.ndarray
    residual: float
    mse: float
    certified: int
    exact: bool


def _certify(data, V, A, Xs, Ys, prec, opt):
    """The certificate (relufast, as for every method): the relative residual over all
    samples and, when it is at most ``tol``, every row certified by the exact refinement of
    BJW19 Alg. 5 on the output span of the probe sample. ``exact`` means both: the fit
    reproduces the data and the rows are identified by them."""
    k, d = V.shape
    tol = prec.tol(opt["tol"], d, k)
    cert = certify(data, V, A)
    residual = residual_from_stats(cert)
    mse = float(cert["sq_residual"] / (data.n * data.m))
    certified = 0
    if residual <= tol:
        ell = min(len(Xs), max(1000, 25 * d, 100 * k))
        Xr, Yr = Xs[:ell], Ys[:ell]
        out = refine_rows(output_basis(Yr, k)[0], Xr, V, n_jobs=opt["threads"], **refine_tolerances(prec, d, k))
        certified = int(np.sum(out["certified"]))
    return _Fit(V, A, residual, mse, certified, bool(residual <= tol and certified == k))


def _region_refinement(data, fit, Xs, Ys, prec, opt, run):
    """Activation-region refinement of a non-exact estimate (relufast's own step, not in
    GKLW19): bias-free, on the probe sample; kept when it shows the data noiseless there,
    then certified over all samples like the paper's estimate. Returns the certified
    :class:`_Fit`, or None (noisy data, or the certificate over all samples failed)."""
    k, d = fit.V.shape
    rr, probe_residual = refine_if_noiseless(
        Xs, Ys, fit.A, fit.V, tol=prec.tol(opt["tol"], d, k), bias=False, offset=False, n_jobs=opt["n_jobs"]
    )
    run.diag["region_refine_residual"] = probe_residual
    if rr is None:
        return None
    run.counts["region_rounds"] = rr.rounds
    refined = _certify(data, rr.V, rr.U, Xs, Ys, prec, opt)
    return refined if refined.exact else None


def _outcome(run, data, fit, refined, alg4, prec, opt, probe):
    """The result: ``exact`` with the certificate, else ``approximate``; ``failed`` for a
    network that explains none of the outputs or is not finite. Exact results certified
    below float64 are polished in float64 (:func:`_polish`)."""
    k, d = fit.V.shape
    run.diag["mse"] = fit.mse
    if not np.isfinite(fit.residual):
        return run.result(
            Status.FAILED,
            "the fitted network is not finite (the detector's null space gave no usable directions)",
            U=fit.A,
            V=fit.V,
            residual=fit.residual,
        )
    if fit.residual >= 1.0:
        return run.result(
            Status.FAILED,
            f"the recovered network explains none of the outputs (relative "
            f"residual {fit.residual:.3g} >= 1, no better than predicting 0): the data are not "
            "those of a network with symmetric inputs and n_hidden units",
            U=fit.A,
            V=fit.V,
            residual=fit.residual,
        )
    name = "practical variant" if opt["practical"] else "Algorithm 3" if opt["noise_corrected"] else "Algorithm 2"
    msg = (
        f"GKLW19 ({name}{', Algorithm 4 for m > k' if alg4 else ''}): relative residual {fit.residual:.3e}, "
        f"{fit.certified} of {k} rows certified"
    )
    final = fit
    if refined is not None:
        final = refined
        run.diag["mse"] = refined.mse
        msg += (
            f"; the data are noiseless: activation-region refinement (relufast, beyond the paper) made it "
            f"exact, relative residual {refined.residual:.3e}, {refined.certified} of {k} rows certified"
        )
    elif "region_refine_residual" in run.diag:
        msg += (
            f"; activation-region refinement reached {run.diag['region_refine_residual']:.2e} on the probe "
            "sample, not noiseless: the estimate is approximate"
        )
    V, A, residual = final.V, final.A, final.residual
    if final.exact and not prec.is_double:
        with run.stage("polish"):
            V, A, residual = _polish(data, final, probe[0], probe[1], opt)
        msg += f" (certified at {prec.name} precision, floor {prec.floor(d, k):.1e}; polished in float64)"
    status = Status.EXACT if final.exact else Status.APPROXIMATE
    return run.result(status, msg, U=A, V=V, exact=final.exact, residual=residual, warn_user=False)


#: Region rounds of the float64 polish (each a C++ pass over the probe sample; 1-2 suffice
#: from a network exact to the outputs' rounding).
POLISH_ROUNDS = 4


def _polish(data, fit, Xs, Ys, opt):
    """Float64 polish of a network certified below float64 (relufast, beyond the paper):
    bias-free activation-region refinement on the probe sample (C++ passes; the dense
    Gauss-Newton of :func:`relufast.stages.precision.polish_at_precision` took 17 s at
    d = k = m = 20), kept only when its residual over all samples is not larger.

    Returns (V, A, residual over all samples).
    """
    try:
        rr = region_refine(
            Xs, Ys, fit.V, None, fit.A, None, max_rounds=POLISH_ROUNDS, n_jobs=opt["n_jobs"], bias=False, offset=False
        )
    except np.linalg.LinAlgError:
        return fit.V, fit.A, fit.residual
    residual = residual_from_stats(certify(data, rr.V, rr.U))
    if residual <= fit.residual and not rr.undetermined:
        return rr.V, rr.U, residual
    return fit.V, fit.A, fit.residual
