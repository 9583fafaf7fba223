"""MR19 Problem R: the maximum-likelihood estimate of the rectified codes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize_scalar

from ..._result import warn
from ..._validation import as_float_matrix
from .laws import _check_law
from .robust import _whole_data_only


class InfeasibleError(ValueError):
    """Program (34) is infeasible: gamma is too small (or the margin too big) for some rows.

    Attributes
    ----------
    rows : ndarray
        Coordinates (the paper's rows of Y; our columns) whose constraints cannot hold.
    gamma_min : float
        The smallest gamma that makes every row feasible.
    """

    def __init__(self, message, rows, gamma_min):
        super().__init__(message)
        self.rows = rows
        self.gamma_min = gamma_min


#: scipy.stats laws whose density is symmetric and unimodal (mode = median).
_SYMMETRIC_UNIMODAL = ("norm", "laplace", "logistic", "cauchy", "t")


@dataclass(frozen=True)
class MLEstimate:
    """Result of :func:`ml_estimate` (MR19 program (34)), samples as rows.

    Attributes
    ----------
    M : ndarray of shape (n, d)
        The estimate of ``M = C A^T`` (the paper's M-hat transposed).
    beta : ndarray of shape (d,)
        Bias estimate per coordinate; NaN where the coordinate is zero in every sample.
    n_positive : ndarray of shape (d,)
        s_i, the number of positive observations of each coordinate.
    row_status : ndarray of shape (d,), str
        "ok", "zero_row", "all_positive" or "non_unique_bias".
    fill : str
        The rule used for the entries the ReLU cut (34 leaves them free).
    gamma : float
        The box ``||M||_inf <= gamma`` used (given, or the smallest feasible one).
    """

    M: np.ndarray
    beta: np.ndarray
    n_positive: np.ndarray
    row_status: np.ndarray
    fill: str
    gamma: float
    margin: float


def _mode_in(law, lo, hi):
    """argmax of log p over [lo, hi] (non-empty, within the support): clip(mode) for the
    unimodal laws relufast knows, the midpoint for a uniform law (flat: any point is
    optimal), a grid plus bounded refinement otherwise."""
    name = getattr(getattr(law, "dist", None), "name", "")
    if name in _SYMMETRIC_UNIMODAL:
        return np.clip(float(law.median()), lo, hi), "unimodal"
    if name == "expon":
        return np.clip(float(law.support()[0]), lo, hi), "unimodal"
    if name == "uniform":
        return 0.5 * (lo + hi), "flat"
    out = np.empty_like(lo)
    for i in range(lo.size):
        if hi[i] - lo[i] <= 0:
            out[i] = lo[i]
            continue
        grid = np.linspace(lo[i], hi[i], 201)
        j = int(np.argmax(law.logpdf(grid)))
        a, b = grid[max(j - 1, 0)], grid[min(j + 1, 200)]
        r = minimize_scalar(lambda x: -law.logpdf(x), bounds=(a, b), method="bounded", options={"xatol": 1e-12})
        out[i] = r.x if -r.fun >= law.logpdf(grid[j]) else grid[j]
    return out, "searched"


def _positive_stats(Y, pos_tol):
    P = Y > pos_tol
    s = P.sum(axis=0)
    big = np.where(P, Y, -np.inf).max(axis=0)
    small = np.where(P, Y, np.inf).min(axis=0)
    return P, s, big, small


def _check_Y(Y):
    Y = as_float_matrix(Y, "Y")
    if (Y < 0).any():
        raise ValueError(f"Y must be a ReLU output (entries >= 0); found {int((Y < 0).sum())} negative entries")
    return Y


def ml_estimate(Y, *, bias, gamma=None, margin=0.0, fill="midpoint", pos_tol=0.0, comm=None):
    """The maximum-likelihood estimate of M, MR19 program (34), solved exactly row by row.

    (34) maximises the likelihood (33) over ``||X||_inf <= gamma`` and the constraint set
    (29), read in its index-matched (convex) form: in a row i of the paper's Y (a
    coordinate here), ``X_ij + beta_i = Y_ij`` on the positive entries N_i, and the cut
    entries lie at least ``margin`` below them. Eliminating X leaves, per row,
    ``beta_i = argmax log p`` over ``[max_{N_i} Y - gamma, min_{N_i} Y + gamma - margin]``
    (clip of the mode for a unimodal law, the midpoint for a uniform one). Rows without a
    positive entry get ``X = -gamma``. (34) has no rank term, so the cut entries are left
    free in ``[-gamma, min_{N_i} Y - beta_i - margin]``; ``fill`` chooses one.

    Parameters
    ----------
    Y : array-like of shape (n_samples, d)
        ReLU outputs (samples as rows; the paper's Y transposed).
    bias : scipy.stats frozen continuous distribution
        The bias law p (the likelihood needs a density).
    gamma : float, optional
        The box; default the smallest feasible value (times 1 + 1e-9).
    margin : float, default=0.0
        The paper's v in (29) (0 gives plain consistency).
    fill : {"midpoint", "upper", "lower"}, default="midpoint"
        Value of the cut entries within their interval (relufast's choice; the paper does
        not fix it). "lower" is -gamma.
    pos_tol : float, default=0.0
        Entries ``<= pos_tol`` count as zero (for slightly noisy Y).
    comm : None
        Refused with a ``ValueError`` (as is a dask Y, with a ``TypeError``): the estimate
        M-hat is an n x d matrix, not a sum over row blocks. A memmap Y is read into memory.

    Returns
    -------
    MLEstimate

    Raises
    ------
    InfeasibleError
        Some row cannot satisfy (34) with this gamma and margin; the message names the rows
        and the smallest workable gamma.
    """
    _whole_data_only("ml_estimate", comm, Y=Y)
    Y = _check_Y(Y)
    law = _check_law(bias, allow_point=False)
    n, d = Y.shape
    margin = float(margin)
    if not np.isfinite(margin) or margin < 0:
        raise ValueError(f"margin must be >= 0; got {margin!r}")
    if fill not in ("midpoint", "upper", "lower"):
        raise ValueError(f"fill must be 'midpoint', 'upper' or 'lower'; got {fill!r}")
    P, s, big, small = _positive_stats(Y, pos_tol)
    has = s > 0
    cut = s < n
    need = np.where(has, (big - small + margin * cut) / 2.0, 0.0)
    gamma_min = float(need.max()) if need.size else 0.0
    if gamma is None:
        gamma = max(gamma_min * (1.0 + 1e-9), np.finfo(float).tiny)
    gamma = float(gamma)
    if not np.isfinite(gamma) or gamma <= 0:
        raise ValueError(f"gamma must be a positive number; got {gamma!r}")
    if margin >= 2 * gamma:
        raise ValueError(f"margin must be smaller than 2 gamma = {2 * gamma}; got {margin}")
    if not has.any():
        raise ValueError("every coordinate of Y is zero in every sample: nothing is identifiable")
    lo = big - gamma
    hi = small + gamma - margin * cut
    s_lo, s_hi = law.support()
    lo, hi = np.maximum(lo, s_lo), np.minimum(hi, s_hi)
    bad = np.flatnonzero(has & (lo > hi))
    if bad.size:
        raise InfeasibleError(
            f"program (34) is infeasible for {bad.size} coordinate(s) (rows of the paper's Y) "
            f"{bad[:10].tolist()}{' ...' if bad.size > 10 else ''} with gamma = {gamma:g} and "
            f"margin = {margin:g}: need gamma >= {gamma_min:g} (and the bias law's support must "
            "meet each row's interval)",
            bad,
            gamma_min,
        )
    beta = np.full(d, np.nan)
    idx = np.flatnonzero(has)
    beta[idx], kind = _mode_in(law, lo[idx], hi[idx])
    status = np.where(has, np.where(cut, "ok", "all_positive"), "zero_row").astype(object)
    if kind == "flat":
        status[idx] = "non_unique_bias"
    top = np.where(has, small - beta - margin, -gamma)
    fill_val = {"midpoint": 0.5 * (top - gamma), "upper": top, "lower": np.full(d, -gamma)}[fill]
    fill_val = np.where(has, fill_val, -gamma)
    M = np.where(P, Y - np.where(has, beta, 0.0), fill_val)
    zero_frac = 1.0 - has.mean()
    if zero_frac > 0.5:
        warn(
            f"{zero_frac:.0%} of the coordinates are zero in every sample: (34) fills them with -gamma "
            "and they carry no information about the column space"
        )
    if kind == "searched":
        warn(
            "the bias law is not one relufast knows to be unimodal: beta was found by a 1-D grid search (nonconvex_ml)"
        )
    if margin > 0 and n > 1 + 2 * gamma / margin:
        warn(
            f"n = {n} > 1 + 2 gamma / margin = {1 + 2 * gamma / margin:.3g}: the premise of the paper's "
            "Lemma 2 (consecutive gaps >= margin) cannot hold"
        )
    return MLEstimate(
        M=M, beta=beta, n_positive=s, row_status=status.astype(str), fill=fill, gamma=gamma, margin=margin
    )
