"""Notes on what may have caused a result that is not exact (float32 data, a nonzero input
mean, the rank of Y against n_hidden, a constant offset), appended to its message by the
method protocol (:mod:`relufast._protocol`)."""

from __future__ import annotations

import numpy as np

from ._result import Status
from ._units import plain_array

#: Samples ``auto`` uses for its cheap checks and for the first enumeration run.
AUTO_CHECK_ROWS = 20000
#: A coordinate mean this many standard errors from zero (and above 5% of its standard
#: deviation) means X is not centred.
MEAN_Z_LIMIT = 6.0


# --------------------------------------------------------------------------- causes
def _float32_note(X, Y, options):
    tol = options.get("tol", 1e-10)
    notes = []
    given = options.get("precision")
    for name, A in (("X", X), ("Y", Y)):
        dt = getattr(A, "dtype", None)
        if name == "Y" and isinstance(given, str) and given in ("float32", "float16"):
            dt = np.dtype(given)  # auto converted Y to float64; its precision travels as an option
        if dt is not None and np.issubdtype(dt, np.floating) and np.finfo(dt).eps > 1e-12:
            eps = float(np.finfo(dt).eps)
            notes.append(
                f"{name} is {np.dtype(dt).name} (relative precision {eps:.1e}), so a relative "
                f"residual below tol = {tol:.0e} is out of reach unless the data are exact in "
                f"that precision; pass float64 data, or tol={10 * eps:.0e} to certify at "
                f"{np.dtype(dt).name} precision"
            )
    return notes


def causes(res, X, Y, n_hidden, options):
    """Notes on what may have caused a non-exact result, appended to its message."""
    if res.status == Status.EXACT:
        return []
    notes = _float32_note(X, Y, options)
    if res.precision != "float64":  # the method already judged Y at its precision
        notes = [t for t in notes if not t.startswith("Y is")]
    Xa, Ya = plain_array(X), plain_array(Y)
    if Xa is None or Ya is None or Xa.ndim != 2:
        return notes
    Ya = Ya.reshape(len(Ya), -1)
    Xs = np.asarray(Xa[:AUTO_CHECK_ROWS], dtype=np.float64)
    Ys = np.asarray(Ya[: min(len(Ya), 2000)], dtype=np.float64)
    if len(Xs) > 2:
        mz, rel = _mean_statistic(Xs)
        if mz > MEAN_Z_LIMIT and rel > 0.05:
            notes.append(
                f"X has a nonzero mean (largest |mean| / sd = {rel:.2f}): the methods assume "
                "centred inputs, and an input offset acts as hidden biases b = V mean(X); "
                "use atv21 (biases and offsets)"
            )
    if Ys.shape[0] > Ys.shape[1] and isinstance(n_hidden, (int, np.integer)):
        from .stages.diagnostics import RANK_FLOOR, RANK_TOL, numerical_rank, output_singular_values
        from .stages.precision import resolve_precision

        try:
            rtol = resolve_precision(Y, options.get("precision")).tol(RANK_TOL, Xs.shape[1], int(n_hidden))
        except (TypeError, ValueError):
            rtol = RANK_TOL
        r = numerical_rank(np.linalg.svd(Ys, compute_uv=False), rtol)
        rc = numerical_rank(np.linalg.svd(Ys - Ys.mean(axis=0), compute_uv=False), rtol)
        m = Ys.shape[1]
        if r < min(n_hidden, m):  # rank(Y) < k only if every sample says so, at the rounding floor
            sv = output_singular_values(np.asarray(Ya, dtype=np.float64))
            r_all = numerical_rank(sv, max(rtol * RANK_FLOOR / RANK_TOL, RANK_FLOOR))
            if r_all >= min(n_hidden, m):
                notes.append(
                    f"rank(Y) = {r_all} over all {len(Ya)} samples, but sigma_{n_hidden} / sigma_1 = "
                    f"{sv[n_hidden - 1] / sv[0]:.1e}: a unit is weak (small output column) or active on few samples"
                )
                r = r_all
                Yc = np.asarray(Ya, dtype=np.float64)
                rc = numerical_rank(
                    output_singular_values(Yc - Yc.mean(axis=0)), max(rtol * RANK_FLOOR / RANK_TOL, RANK_FLOOR)
                )
        if r < min(n_hidden, m):  # with m < n_hidden outputs, rank(Y) = m says nothing
            notes.append(
                f"rank(Y) = {r} < n_hidden = {n_hidden}: either n_hidden is larger than the number "
                "of hidden units the outputs show, or U has rank < k (bjw19-fpt handles "
                "rank-deficient U)"
            )
        elif r > n_hidden and r < min(m, Ys.shape[0]) and not (rc < r and rc == n_hidden):
            notes.append(
                f"rank(Y) = {r} > n_hidden = {n_hidden} with a clear gap after sigma_{r}: the "
                f"outputs look like a network with {r} hidden units; try n_hidden = {r}"
            )
        if rc < r and rc >= 1:
            notes.append(
                f"the centred outputs have rank {rc} < rank(Y) = {r}: Y looks like it has a "
                "constant offset c (y = U relu(V x + b) + c); use atv21 (biases and offsets)"
            )
    return notes


def _mean_statistic(Xs):
    """(largest |mean_j| in standard errors, largest |mean_j| / sd_j) over the coordinates."""
    mu = Xs.mean(axis=0)
    sd = Xs.std(axis=0)
    ok = sd > 0
    if not np.any(ok):
        return 0.0, 0.0
    z = np.abs(mu[ok]) / (sd[ok] / np.sqrt(len(Xs)))
    return float(z.max()), float((np.abs(mu[ok]) / sd[ok]).max())
