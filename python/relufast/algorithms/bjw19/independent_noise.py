"""BJW19 Algorithm 8 (Theorem 13): arbitrary output noise independent of X."""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..._blas import single_threaded_blas
from ..._protocol import recovery_method
from ..._result import Run, Status
from ..._validation import (
    as_float_matrix,
    check_positive_int,
    check_problem,
    check_random_state,
    check_scalar,
    resolve_n_jobs,
)
from ...stages.fit import fit_and_certify

__all__ = ["halfspace_estimate", "independent_noise", "grid_size"]


def halfspace_estimate(X, labels):
    """Plan-Vershynin estimator of a halfspace from noisy labels (BJW19 Thm 12, [PV13]).

    ``argmax_{|w| <= 1} sum_q y_q <w, x_q> = X^T y / |X^T y|`` (closed form; the paper
    calls it a convex program). ``labels`` may be (n,) or (n, k) for k halfspaces at once.
    """
    W = X.T @ labels
    return (W / np.maximum(np.linalg.norm(W, axis=0), 1e-300)).T


def grid_size(k, s, levels):
    """Number of candidate left inverses of Alg. 8, step 2: (2 levels + 1)^(k s)."""
    return (2 * levels + 1) ** (k * s)


def _fit(X, Y, V, threads=0):
    U, rel, _ = fit_and_certify(X, Y, V, threads=threads)
    return U, rel * float(np.linalg.norm(Y))


@recovery_method("bjw19-independent-noise")
def independent_noise(
    X,
    Y,
    n_hidden,
    *,
    given_M=None,
    eps=0.25,
    levels=None,
    max_guesses=100000,
    smoothing=(0.0, 0.25, 1.0),
    tol=None,
    random_state=None,
    n_jobs=None,
):
    """Approximate recovery under arbitrary noise independent of X (BJW19 Thm 13; Alg. 8).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Standard Gaussian inputs.
    Y : array-like of shape (n_samples, n_outputs)
        ``relu(X V^T) U^T + E`` with E independent of X (any law, e.g. heavy tailed).
    n_hidden : int
    given_M : array-like of shape (n_hidden, n_outputs), optional
        An approximate left inverse of U (for instance the pseudo-inverse of an estimate of
        U). Runs steps 3-4 of Alg. 8 only. Without it, the brute-force grid of step 2 is
        enumerated, which is exponential in k * m.
    eps : float, default=0.25
        Grid resolution: levels are powers of (1 + eps).
    levels : int, optional
        Magnitude levels per sign in the grid (default ``ceil(log(1/eps) / log(1 + eps)) + 1``).
    max_guesses : int, default=100000
        Refuse (ValueError naming the count) when the grid has more candidates than this.
    smoothing : sequence of float, default=(0, 0.25, 1)
        Gaussian smoothing levels of step 3a, as multiples of the RMS entry of M Y^T.
    tol : float or None, default=None
        Stop the search at the first fit whose relative residual is at most ``tol`` (the
        noise level, when known); None: try every candidate and smoothing level.
    random_state : None, int or numpy Generator
        Seeds the smoothing noise of step 3a.
    n_jobs : int or None, default=None
        Threads of the least-squares fits of U (None or -1: all cores).

    Returns
    -------
    RecoveryResult
        Status ``approximate``; ``diagnostics`` has the number of candidates, the chosen
        smoothing and whether the zero network won.

    Notes
    -----
    Step 1's sketch S is the identity here (m <= s); step 2's grid has
    signs and zero, which the paper omits (docs/bjw19.md, erratum 8); step 3c is the closed-form
    :func:`halfspace_estimate`; step 4 picks the candidate with the smallest residual,
    the zero network included (step 0).
    """
    with single_threaded_blas():
        run = Run("bjw19-independent-noise")
        X, Y, n, d, m, k = check_problem(X, Y, n_hidden)
        rng = check_random_state(random_state)
        threads = resolve_n_jobs(n_jobs)
        if tol is not None:
            tol = check_scalar(tol, "tol", kind=float, low=0.0, include_low=False)
        if not (np.isfinite(eps) and 0 < eps < 1):
            raise ValueError(f"eps must be in (0, 1); got {eps!r}")
        candidates, nu = _left_inverses(Y, k, given_M, eps, levels, max_guesses)
        res, U, V, source, eta, tried = _best_fit(
            X, Y, k, candidates, smoothing, rng, "grid" if given_M is None else "given_M", tol, threads
        )
        run.counts.update(n_samples=n, n_hidden=k, candidates=nu, fits=tried)
        run.diag.update(source=source, smoothing=eta, zero_network=V is None)
        residual = res / max(float(np.linalg.norm(Y)), 1e-300)
        if V is None:
            return run.result(Status.FAILED, "the zero network fits best: the noise dominates the signal", residual=1.0)
        return run.result(
            Status.APPROXIMATE,
            f"approximate network (BJW19 Alg. 8) from {tried} fits; relative residual {residual:.3e}",
            U=U,
            V=V,
            residual=residual,
            warn_user=False,
        )


def _left_inverses(Y, k, given_M, eps, levels, max_guesses):
    """Alg. 8 step 2: the candidate left inverses M of U, ``given_M`` alone or the signed
    grid with zero (docs/bjw19.md, erratum 8) of magnitudes ``top (1 + eps)^-j``. Returns
    (an iterable of (k, m) matrices, their number)."""
    n, m = Y.shape
    if given_M is not None:
        M0 = as_float_matrix(given_M, "given_M")
        if M0.shape != (k, m):
            raise ValueError(f"given_M must have shape (n_hidden, n_outputs) = ({k}, {m}); got {M0.shape}")
        return [M0], 1
    L = levels if levels is not None else int(math.ceil(math.log(1 / eps) / math.log1p(eps))) + 1
    L = check_positive_int(L, "levels")
    nu = grid_size(k, m, L)
    if nu > max_guesses:
        raise ValueError(
            f"the brute-force grid of Alg. 8 has (2 * {L} + 1)^(k m) = {nu:.3g} candidate left "
            f"inverses for k = {k}, m = {m}, above max_guesses = {max_guesses}; pass given_M "
            "(e.g. from bjw19-noisy's U), a coarser eps, or raise max_guesses"
        )
    # Entries of U^+ are at most 1 / sigma_min(U); estimate the scale from Y
    # (E relu(z)^2 = 1/2 for unit rows), then powers of (1 + eps) below it.
    sk = np.linalg.svd(Y, compute_uv=False)[min(k, m) - 1]
    top = math.sqrt(n / 2.0) / max(sk, 1e-300)
    mags = top * (1 + eps) ** (-np.arange(L))
    values = np.concatenate([[0.0], mags, -mags])
    return (np.array(c).reshape(k, m) for c in itertools.product(values, repeat=k * m)), nu


def _best_fit(X, Y, k, candidates, smoothing, rng, source, tol=None, threads=0):
    """Alg. 8 steps 3-4: for each candidate M and smoothing level, the halfspaces of
    sign(M Y^T + noise) (:func:`halfspace_estimate`), U by least squares, and the smallest
    residual, the zero network included (step 0); stops at a relative residual <= ``tol``.
    Returns (residual norm, U, V or None, source, smoothing, fits tried)."""
    y_norm = float(np.linalg.norm(Y))
    best = (y_norm, np.zeros((Y.shape[1], k)), None, "zero network", None)
    tried = 0
    for M in candidates:
        Z = Y @ M.T  # (n, k): approximately relu(X V^T) plus independent noise
        rms = float(np.sqrt(np.mean(Z * Z)))
        for eta in smoothing:
            tried += 1
            noisy = Z + eta * rms * rng.standard_normal(Z.shape) if eta > 0 else Z
            V = halfspace_estimate(X, np.sign(noisy))
            if not np.all(np.isfinite(V)):
                continue
            U, res = _fit(X, Y, V, threads)
            if res < best[0]:
                best = (res, U, V, source, eta)
            if tol is not None and best[0] <= tol * y_norm:
                return (*best, tried)
    return (*best, tried)
