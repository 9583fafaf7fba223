"""MR19 column-space recovery from rectified data (Tobit-style fit of the codes)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..._blas import single_threaded_blas
from ..._result import warn
from ..._validation import check_positive_int
from .laws import _check_law
from .ml import _check_Y, ml_estimate
from .robust import _whole_data_only


@dataclass(frozen=True)
class ColumnSpace:
    """Result of :func:`column_space`.

    Attributes
    ----------
    basis : ndarray of shape (d, k)
        Orthonormal basis of the estimated column space of A.
    singular_values : ndarray
        Leading singular values of the matrix whose top-k space is taken (k + 1 of them
        when available).
    gap_ratio : float
        ``sigma_{k+1} / sigma_k`` of that matrix (a weak gap makes the space unstable).
    method : str
    from_paper : bool
        True only for ``method="ml"`` (Section 3: program (34) then the top-k SVD).
    M : ndarray of shape (n, d) or None
        The estimate of M whose row space is taken ("ml", "tobit").
    beta : ndarray of shape (d,) or None
        Bias estimates ("ml", "tobit").
    iterations : int
    message : str
    """

    basis: np.ndarray
    singular_values: np.ndarray
    gap_ratio: float
    method: str
    from_paper: bool
    M: np.ndarray | None = None
    beta: np.ndarray | None = None
    iterations: int = 0
    message: str = ""
    seconds: float = float("nan")

    def __repr__(self):
        return (
            f"ColumnSpace(method={self.method!r}, from_paper={self.from_paper}, "
            f"basis{self.basis.shape}, gap_ratio={self.gap_ratio:.3g})"
        )


def _top_right(M, k):
    _, sv, Vt = np.linalg.svd(M, full_matrices=False)
    return Vt[:k].T.copy(), sv


def _log_prior_derivs(law, beta):
    """(d/db) log p and (d^2/db^2) log p; exact for a Gaussian, central differences otherwise."""
    if law is None:
        return np.zeros_like(beta), np.zeros_like(beta)
    if getattr(getattr(law, "dist", None), "name", "") == "norm":
        m, sd = law.mean(), law.std()
        return -(beta - m) / sd**2, np.full_like(beta, -1.0 / sd**2)
    h = 1e-4 * max(law.std(), 1e-8)
    f0, fp, fm = law.logpdf(beta), law.logpdf(beta + h), law.logpdf(beta - h)
    return (fp - fm) / (2 * h), np.minimum((fp - 2 * f0 + fm) / (h * h), 0.0)


def _tobit(Y, k, law, rho, max_iter, pos_tol):
    """Algorithm R3 (relufast extension, not in MR19): censored nuclear-norm estimate.

    minimize_{X, beta} 1/2 sum_{Y>0} (X + beta - Y)^2 + 1/2 sum_{Y=0} relu(X + beta)^2
                       + rho ||X||_* - sum_i log p(beta_i)
    by alternating three Newton steps in beta with one proximal-gradient step in X (unit
    step: the smooth part is 1-Lipschitz in X), ``X <- SVT_rho(X - grad)``.
    """
    P = Y > pos_tol
    n, d = Y.shape
    X = np.zeros_like(Y)
    beta = np.zeros(d) if law is None else np.full(d, float(law.median()))
    for _ in range(max_iter):
        for _ in range(3):
            Z = X + beta
            g = np.where(P, Z - Y, np.maximum(Z, 0.0)).sum(axis=0)
            h = np.where(P, 1.0, (Z > 0)).sum(axis=0)
            dl, ddl = _log_prior_derivs(law, beta)
            g, h = g - dl, h - ddl
            beta = beta - np.where(h > 0, g / np.where(h > 0, h, 1.0), 0.0)
        Z = X + beta
        grad = np.where(P, Z - Y, np.maximum(Z, 0.0))
        U, sv, Vt = np.linalg.svd(X - grad, full_matrices=False)
        sv = np.maximum(sv - rho, 0.0)
        r = int(np.count_nonzero(sv))
        X = (U[:, :r] * sv[:r]) @ Vt[:r]
    return X, beta


def column_space(
    Y,
    k,
    *,
    method="ml",
    bias=None,
    gamma=None,
    margin=0.0,
    fill="midpoint",
    pos_tol=0.0,
    rho=None,
    max_iter=300,
    gap_warn=0.5,
    comm=None,
):
    """Estimate the column space of A from ``Y = relu(C A^T + 1 b^T)`` (MR19 Section 3).

    Parameters
    ----------
    Y : array-like of shape (n_samples, d)
        ReLU outputs, samples as rows (the paper's Y transposed).
    k : int
        Dimension of the column space (given, as in the paper), 1 <= k < min(n, d).
    method : {"ml", "centered", "tobit"}, default="ml"
        - "ml" (FROM THE PAPER, Section 3.1 and 3.2): M-hat from program (34) by
          :func:`ml_estimate` with the given ``fill``, then the top-k singular space of
          M-hat. Taken literally this is weak: (34) has no rank term, the fill is not low
          rank and beta-hat is essentially the prior's mode (docs/mr19.md).
        - "centered" (NOT in the paper; a baseline): the top-k singular space of Y with each
          coordinate's mean over the samples removed.
        - "tobit" (NOT in the paper; relufast's low-rank extension in the spirit of
          Davenport et al.'s nuclear-norm likelihood, which the paper cites): a censored
          least-squares fit with per-coordinate offsets and a nuclear-norm penalty
          ``rho ||X||_*``, solved by proximal gradient, then the top-k space of X-hat.
    bias : scipy.stats frozen distribution, optional
        The bias law. Required by "ml"; used as a prior on beta by "tobit" (None: flat).
    gamma, margin, fill, pos_tol
        Passed to :func:`ml_estimate` ("ml" only).
    rho : float, optional
        "tobit" only: nuclear-norm weight; default ``0.03 sigma_1(Y)``.
    max_iter : int, default=300
        "tobit" only: proximal-gradient iterations.
    gap_warn : float, default=0.5
        Warn when ``sigma_{k+1} / sigma_k`` exceeds this.
    comm : None
        Refused with a ``ValueError`` (as is a dask Y, with a ``TypeError``): "ml" and
        "tobit" estimate an n x d matrix (the Tobit fit thresholds its singular values
        every iteration), so MR19 needs the whole Y in one process. A memmap Y is read into
        memory.

    Returns
    -------
    ColumnSpace

    References
    ----------
    .. [1] A. Mazumdar and A. S. Rawat, "Representation Learning and Recovery in the ReLU
       Model", arXiv:1803.04304, Section 3, program (34), Section 3.2 and Theorem 5.
    .. [2] M. A. Davenport, Y. Plan, E. van den Berg and M. Wootters, "1-bit matrix
       completion", Information and Inference 3(3), 2014 (the nuclear-norm likelihood that
       "tobit" adapts).
    """
    t0 = time.perf_counter()
    _whole_data_only("column_space", comm, Y=Y)
    Y = _check_Y(Y)
    n, d = Y.shape
    k = check_positive_int(k, "k")
    if k >= min(n, d):
        raise ValueError(f"k must be smaller than min(n_samples, d) = {min(n, d)}; got k = {k}")
    if method not in ("ml", "centered", "tobit"):
        raise ValueError(f"method must be 'ml', 'centered' or 'tobit'; got {method!r}")
    M = beta = None
    its = 0
    with single_threaded_blas():
        if method == "ml":
            if bias is None:
                raise ValueError(
                    "method='ml' needs the bias law (bias=a scipy.stats frozen distribution): "
                    "the likelihood (34) uses its density"
                )
            est = ml_estimate(Y, bias=bias, gamma=gamma, margin=margin, fill=fill, pos_tol=pos_tol)
            M, beta = est.M, est.beta
            basis, sv = _top_right(M, k)
        elif method == "centered":
            basis, sv = _top_right(Y - Y.mean(axis=0), k)
        else:
            law = None if bias is None else _check_law(bias, allow_point=False)
            if rho is None:
                rho = 0.03 * np.linalg.norm(Y, 2)
            rho = float(rho)
            if not np.isfinite(rho) or rho <= 0:
                raise ValueError(f"rho must be a positive number; got {rho!r}")
            max_iter = check_positive_int(max_iter, "max_iter")
            M, beta = _tobit(Y, k, law, rho, max_iter, pos_tol)
            its = max_iter
            basis, sv = _top_right(M, k)
    sk = sv[k - 1]
    if sk <= 1e-12 * max(sv[0], 1e-300):
        raise ValueError(
            f"the estimate has numerical rank < k = {k} (sigma_k = {sk:.3g}): rank_deficient_estimate; "
            "lower k or, for 'tobit', lower rho"
        )
    gap = float(sv[k] / sk) if sv.size > k else 0.0
    msg = "ok"
    if gap > gap_warn:
        msg = f"weak spectral gap: sigma_(k+1) / sigma_k = {gap:.2f} > {gap_warn}; the estimated space is unstable" + (
            " (expected for the paper's 'ml' estimate: try method='tobit')" if method == "ml" else ""
        )
        warn(msg)
    return ColumnSpace(
        basis=basis,
        singular_values=sv[: k + 1].copy(),
        gap_ratio=gap,
        method=method,
        from_paper=method == "ml",
        M=M,
        beta=beta,
        iterations=its,
        message=msg,
        seconds=time.perf_counter() - t0,
    )
