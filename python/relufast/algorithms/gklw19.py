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
    Algorithms 2-4: null space of T, simultaneous diagonalisation, sign fix, Algorithm 1
    for each unit, A = Z^{-1}; non-square A by Algorithm 4. ``practical=True`` is the
    paper's Section 4 variant: CP-ALS over 10k null-space slices, best of several restarts,
    then W refit with A fixed.
``population_detector``
    Lemma 19: closed form of T for Gaussian input (for tests and diagnostics).
"""

from __future__ import annotations

import math
import time

import numpy as np

from .._blas import single_threaded_blas
from .._result import Run, Status, recovery_method, warn
from .._validation import check_n_hidden, check_positive_int, check_random_state, check_xy, resolve_n_jobs
from ..stages.diagnostics import input_null_space
from ..stages.fit import certify, max_abs, residual_from_stats
from ..stages.moments import detector_matrix, detector_matrix_reference  # noqa: F401 (re-exported for tests)
from ..stages.reduce import Samples, SampleStream
from ..stages.refine import output_basis, refine_rows
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
        Relative residual below which the result is reported exact (a symmetrised
        noiseless sample gives machine precision).

    Returns
    -------
    RecoveryResult
        ``diagnostics['distinguishing_sigma']`` is sigma_{k(k-1)/2}(T) / sigma_1(T), which
        is zero when the distinguishing matrix is rank-deficient (then the status is
        ``non_identifiable``); ``diagnostics['symmetry_statistic']`` near 1 for symmetric
        inputs (a warning above 6).
    """
    with single_threaded_blas():
        return _recover(
            X,
            Y,
            n_hidden,
            noise_corrected=noise_corrected,
            practical=practical,
            n_draws=n_draws,
            n_slices=n_slices,
            als_restarts=als_restarts,
            als_iter=als_iter,
            refit_steps=refit_steps,
            tol=tol,
            n_jobs=n_jobs,
            random_state=random_state,
            comm=comm,
        )


def _recover(
    X,
    Y,
    n_hidden,
    *,
    noise_corrected,
    practical,
    n_draws,
    n_slices,
    als_restarts,
    als_iter,
    refit_steps,
    tol,
    n_jobs,
    random_state,
    comm,
):
    run = Run("gklw19")
    threads = resolve_n_jobs(n_jobs)
    data = Samples.from_arrays(X, Y, comm=comm, n_jobs=threads)
    n, d, m = data.n, data.d, data.m
    k = check_n_hidden(n_hidden, d)
    n_draws = check_positive_int(n_draws, "n_draws")
    als_restarts = check_positive_int(als_restarts, "als_restarts")
    refit_steps = check_positive_int(refit_steps, "refit_steps", minimum=0)
    rng = check_random_state(random_state)
    if practical and refit_steps and (data.distributed or data.lazy):
        raise ValueError(
            "practical=True with refit_steps > 0 needs the samples in memory on one "
            "process; got " + ("an MPI communicator" if data.distributed else "dask arrays") + ": use refit_steps=0"
        )
    k2 = k * (k - 1) // 2
    if n < (d * (d + 1)) // 2 + 1:
        raise ValueError(f"gklw19 needs more samples than d (d + 1) / 2 = {d * (d + 1) // 2} for d = {d}; got n = {n}")
    seconds, counts, diag = run.seconds, run.counts, run.diag
    counts.update(n_samples=n, n_hidden=k)
    stop = run.result

    if m < k:
        return stop(Status.UNSUPPORTED, f"gklw19 needs A of full column rank, so m >= k; got m = {m} < k = {k}")
    # A random probe sample (the same on every rank) for the cheap checks and the choice
    # among candidates; the detector and the residual read every sample.
    Xs, Ys = data.extend(SampleStream(n, rng), min(n, PROBE_ROWS))
    on = "the outputs" if len(Xs) == n else f"a random sample of {len(Xs)} rows"
    if max_abs(Ys) == 0:
        return stop(
            Status.NON_IDENTIFIABLE,
            f"the outputs are all zero ({on}): the network U = 0 fits them with any W, so W is "
            "not determined by the data (nothing to recover)",
        )
    null = input_null_space(Xs)
    if null.shape[0]:
        diag["input_null_space"] = null
        return stop(
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

    # Algorithm 4: project non-square outputs on the top-k left singular vectors of E[y x^T].
    t = time.perf_counter()
    Pl = None
    if m > k:
        st = data.map_reduce(lambda Xb, Yb: {"count": float(len(Xb)), "yx": Yb.T @ Xb})
        Pfull = st["yx"] / st["count"]
        Pl = np.linalg.svd(Pfull, full_matrices=False)[0][:, :k]
    T, C, P = detector_matrix(data, Pl, centred=noise_corrected, n_jobs=n_jobs)
    seconds["detector"] = time.perf_counter() - t

    # Step 3: the k least right singular vectors of T span {vec*(z_i z_i^T)}.
    t = time.perf_counter()
    # T is tall (d(d+1)/2 >= k(k+1)/2 rows): QR first, then the SVD of the small R.
    R = np.linalg.qr(T, mode="r") if T.shape[0] > T.shape[1] else T
    _, s, Vt = np.linalg.svd(R, full_matrices=True)
    s_full = np.zeros(Vt.shape[0])
    s_full[: len(s)] = s
    S = Vt[-k:].T
    gap = float(s_full[k2 - 1] / s_full[0]) if k2 >= 1 and s_full[0] > 0 else 1.0
    diag["distinguishing_sigma"] = gap
    diag["null_sigma"] = float(s_full[k2] / s_full[0]) if len(s_full) > k2 and s_full[0] > 0 else 0.0
    if k2 >= 1 and gap < 1e-10:
        return stop(
            Status.NON_IDENTIFIABLE,
            f"the distinguishing matrix is rank-deficient (sigma_(k(k-1)/2)(T) / sigma_1(T) = {gap:.2e}): "
            "the pure-neuron detector has spurious zeros (GKLW19 needs N or M of full column rank)",
        )
    slices = np.array([mat_star(S[:, j], k) for j in range(k)])  # (k, k, k)
    cands = []
    if practical:
        ns = 10 * k if n_slices is None else check_positive_int(n_slices, "n_slices")
        G = rng.standard_normal((ns, k))
        R = np.linalg.qr(G)[1]  # CP-ALS on G x slices equals CP-ALS on R x slices
        Tc = np.einsum("rj,jab->rab", R, slices)
        als_res = []
        for _ in range(als_restarts):
            B0 = rng.standard_normal((k, k))
            B0 /= np.linalg.norm(B0, axis=0)
            Af, Bf, Cf = cp_als(Tc, B0, n_iter=als_iter)
            als_res.append(float(np.linalg.norm(Tc - np.einsum("ir,jr,kr->ijk", Af, Bf, Cf)) / np.linalg.norm(Tc)))
            cands.append(merge_symmetric_factors(Bf, Cf))
        diag["als_residual"] = float(min(als_res))
    if practical:
        # Every simultaneous-diagonalisation draw is a candidate too; the fit decides.
        draws = [jennrich(slices, rng, n_draws=1) for _ in range(n_draws)]
        cands += [z for z, _ in draws]
        diag["eigen_gap"] = max(g for _, g in draws)
    else:
        Zj, egap = jennrich(slices, rng, n_draws=n_draws)
        diag["eigen_gap"] = egap
        cands.append(Zj)
    seconds["decomposition"] = time.perf_counter() - t

    # Steps 6-8: sign fix, Algorithm 1 for every unit, A = Z^{-1}. With several candidates
    # (practical variant) keep the one whose network fits the data best.
    t = time.perf_counter()
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
    if best is None:
        return stop(Status.FAILED, "the recovered pure-neuron directions are linearly dependent")
    _, V, A = best
    counts["candidates"] = len(cands)
    if practical and refit_steps:
        V = _refit_W(data.X, data.Y, A, V, refit_steps)
    s_norm = np.linalg.norm(V, axis=1)
    V, A = V / s_norm[:, None], A * s_norm[None, :]
    cert = certify(data, V, A)
    residual = residual_from_stats(cert)
    diag["mse"] = float(cert["sq_residual"] / (n * m))
    # "exact" means identified: the fit reproduces the data and every row is certified by
    # the exact refinement (BJW19 Alg. 5 on the output span), as for every other method.
    certified = 0
    if residual <= tol:
        ell = min(len(Xs), max(1000, 25 * d, 100 * k))
        Xr, Yr = Xs[:ell], Ys[:ell]
        certified = int(np.sum(refine_rows(output_basis(Yr, k)[0], Xr, V, n_jobs=threads)["certified"]))
    counts["certified_rows"] = certified
    seconds["fit"] = time.perf_counter() - t
    exact = bool(residual <= tol and certified == k)
    status = Status.EXACT if exact else Status.APPROXIMATE
    if np.isfinite(residual) and residual >= 1.0:
        return run.result(
            Status.FAILED,
            f"the recovered network explains none of the outputs (relative "
            f"residual {residual:.3g} >= 1, no better than predicting 0): the data are not "
            "those of a network with symmetric inputs and n_hidden units",
            U=A,
            V=V,
            residual=residual,
        )
    if not np.isfinite(residual):
        return run.result(
            Status.FAILED,
            "the fitted network is not finite (the detector's null space gave no usable directions)",
            U=A,
            V=V,
            residual=residual,
        )
    msg = (
        f"GKLW19 ({'practical variant' if practical else 'Algorithm 3' if noise_corrected else 'Algorithm 2'}"
        f"{', Algorithm 4 for m > k' if Pl is not None else ''}): relative residual {residual:.3e}, "
        f"{certified} of {k} rows certified"
    )
    return run.result(status, msg, U=A, V=V, exact=exact, residual=residual, warn_user=False)
