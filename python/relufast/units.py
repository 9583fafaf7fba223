"""Units the data cannot see, and units the data can hardly tell apart.

A unit that is never active on the inputs (a dead unit: ``v . x + b < 0`` on every
sample) or whose output column is zero (a pruned unit) has no effect on the outputs: no
method can recover it, and asking for ``n_hidden`` units including it makes an exact
method fail. :func:`visible_units` counts the units the outputs show, from the rank of the
centred outputs (exact when m exceeds the number of visible units) and from the spectrum
of the second Hermite moment ``T_2 = E[y (x x^T - I)]`` of a random output combination
(Gaussian inputs). :func:`near_duplicates` names pairs of recovered rows that are nearly
parallel and the samples that separate them.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .stages.diagnostics import RANK_TOL
from .stages.fit import max_abs, power_of_two_scale
from .stages.precision import resolve_precision

__all__ = ["Visibility", "visible_units", "near_duplicates", "NEAR_DUPLICATE_COS"]

#: Recovered rows with |cos| above this are reported as a near-duplicate pair.
NEAR_DUPLICATE_COS = 0.98
#: Rows sampled for the estimate (the rank and the moment are cheap on this many).
VISIBLE_ROWS = 50000


class Visibility(NamedTuple):
    """Visible hidden units of (X, Y).

    Attributes
    ----------
    count : int
        Estimated number of units the outputs show.
    output_rank : int
        Numerical rank of the centred outputs (at the outputs' precision).
    moment_count : int or None
        Eigenvalues of T_2 above its sampling floor (None when m <= output_rank does not
        need it).
    moment_spectrum : ndarray
        |eigenvalues| of T_2, decreasing.
    """

    count: int
    output_rank: int
    moment_count: int | None
    moment_spectrum: np.ndarray


def visible_units(X, Y, *, precision=None, random_state=0) -> Visibility:
    """Estimate the number of hidden units visible in the outputs.

    Parameters
    ----------
    X : array-like of shape (n, d)
    Y : array-like of shape (n, m) or (n,)
    precision : None, str or float
        Precision of Y (default: from its dtype); sets the rank threshold.
    random_state : int or Generator
        The random output combination of the moment.

    Returns
    -------
    Visibility

    Notes
    -----
    With m outputs and k_v visible units, the centred outputs have rank min(m, k_v) for
    generic U (the features relu(X V^T + b) are linearly independent), so a rank below m
    is the count. Otherwise the count is the number of eigenvalues of T_2 above the
    sampling floor ``4 std(y) (sqrt(d/n) + d/n)`` (the edge of a Wishart-like noise
    spectrum, with margin); units whose ``phi(b_i)`` is tiny (very negative biases) fall
    below it, as they should: the data then hardly see them.
    """
    prec = resolve_precision(Y, precision)
    X = np.asarray(X, dtype=np.float64)[:VISIBLE_ROWS]
    Y = np.asarray(Y, dtype=np.float64).reshape(len(np.asarray(Y)), -1)[:VISIBLE_ROWS]
    n, d = X.shape
    m = Y.shape[1]
    # Every test below is invariant to the scale of Y: scale it (exactly) to avoid overflow.
    Y = Y * power_of_two_scale(max_abs(Y))
    Yc = Y - Y.mean(axis=0)
    sv = np.linalg.svd(Yc, compute_uv=False)
    rank_tol = prec.tol(RANK_TOL, d, 0)
    rank = int(np.sum(sv > rank_tol * sv[0])) if sv.size and sv[0] > 0 else 0
    rng = np.random.default_rng(random_state)
    y = Yc @ rng.standard_normal(m)
    T = (X * y[:, None]).T @ X / n
    ev = np.sort(np.abs(np.linalg.eigvalsh(0.5 * (T + T.T))))[::-1]
    floor = 4.0 * float(np.std(y)) * (math.sqrt(d / n) + d / n)
    moment = int(np.sum(ev > floor))
    count = rank if rank < m else max(moment, rank)
    return Visibility(count, rank, moment, ev)


def invisible_message(visible: int, n_hidden: int) -> str:
    """The message when fewer units are visible than asked for (empty otherwise)."""
    if visible >= n_hidden:
        return ""
    return (
        f"{n_hidden - visible} of {n_hidden} units are never active on these inputs or have a zero "
        f"output column (dead or pruned units leave no trace in the outputs); n_hidden={visible} "
        "recovers the rest"
    )


def near_duplicates(V, n_features=None, *, threshold=NEAR_DUPLICATE_COS):
    """Pairs of rows of V with |cos| >= threshold, and the samples that separate them.

    Two units at angle theta differ only on the inputs between their hyperplanes, a
    fraction ``theta / pi`` of Gaussian inputs, and a moment estimate must be accurate to
    well below theta: ``n ~ d / theta^2`` samples (order of magnitude, constant 10).

    Returns a list of (i, j, cos, samples_needed).
    """
    V = np.asarray(V, dtype=np.float64)
    if V.ndim != 2 or V.shape[0] < 2:
        return []
    d = V.shape[1] if n_features is None else n_features
    W = V / np.maximum(np.linalg.norm(V, axis=1, keepdims=True), 1e-300)
    C = W @ W.T
    out = []
    for i in range(len(W)):
        for j in range(i + 1, len(W)):
            c = float(C[i, j])
            if c >= threshold:
                theta = math.acos(min(c, 1.0))
                need = int(10 * d / max(theta, 1e-8) ** 2)
                out.append((i, j, c, need))
    return out


def near_duplicate_message(pairs) -> str:
    if not pairs:
        return ""
    parts = [
        f"units {i} and {j} are near-duplicates (recovered rows at cos {c:.5f}: the pair "
        f"separates only with at least about {need:.1e} samples, more if the true rows are closer)"
        for i, j, c, need in pairs
    ]
    return "; ".join(parts)
