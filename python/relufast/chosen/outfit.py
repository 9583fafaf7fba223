"""Rows of the last hidden layer's units that the searches have not found, from the outputs.

With all but a few units of the last hidden layer found (rows ``theta`` in phi-space of the
tentative layer, signs open: :mod:`.deep`), the outputs are an affine function of
``relu(zeta)`` of the rows found plus ``a_j relu(zeta_j)`` for each unit j not found. Where
those are rarely active (the last units the searches miss are), the robust least-squares fit
of the outputs on the units found (:func:`_fit_by_columns`) is exact where all of
them are inactive and stands out where one is active, and there the residual is
``a_j zeta_j(x)``: of rank one along ``a_j`` in output space, and linear in phi. Points
where one unit not found stands out are grouped by their residual's direction; each
group's residual along it is fitted by least squares on ``[relu(z~), 1]`` (z~ the tentative
layer's pre-activations; with its signs open ``[relu(z~), z~, 1]``, in whose span phi's
linear part lies, or ``[phi, 1]`` where that is narrower), mapped back to a row of Theta,
refitted through precise kinks at low precision, and proposed to the verification like any
row from kinks (:func:`.verify.verified`).

Where a rarely active unit (0.6% of Gaussian inputs, the last second-layer unit of a
trained float32 784-128-128-10) switches on few random lines and the searches reach it after
two million queries more, its active side holds about 60 of every 16,384 Gaussian points
(half at scale 3), and a few hundred of them give its row.
"""

from __future__ import annotations

import numpy as np

from .._validation import NonFiniteOutputs
from .deep import _add
from .net import features
from .residual import (
    RESIDUAL_FITS,
    RESIDUAL_FLOOR,
    RESIDUAL_OUT,
    RESIDUAL_POINTS,
    RESIDUAL_TIGHTER,
    _design,
    _fit_residual,
)
from .verify import refit_rows, verified

__all__ = ["from_outputs", "output_rows", "output_units"]

#: Largest share of the points that may stand out in the first batch. The fit of the outputs on
#: the units found (:func:`_fit_by_columns`) is exact where every unit not found is inactive
#: when those are rarely active (the last units the searches miss: 0.6% and 2% of Gaussian
#: inputs on the trained float32 784-128-128-10). A unit not found that is active on most
#: inputs is affine in the layer below where it is active; where a fit with those features
#: lowers the bar RESIDUAL_TIGHTER times or more (:func:`.residual._best_fit`'s test, here on
#: a quarter of the first batch: 3.8e-3 against 6.6e-2 with a unit of that network active on
#: 94% missing, 3.6e-3 against 3.7e-3 without it), no row is proposed: that fit, exact where
#: the unit is active, may lose units found in one state on its best half, and its residual
#: is then no unit's part of the outputs (planted 20-12-8-3, ad-hoc: 0.2 to 0.6 of it off
#: any row). The lines of :mod:`.residual` go on alone.
OUTFIT_SHARE = 0.4
#: Most units missing for which the outputs are asked (each ask costs a batch of points and
#: seconds of fits at d = 784 and 128 units on 2 cores: 2.5 s where it proposes nothing, 8-12 s
#: with a row to propose, ad-hoc replays of the trained float32 784-128-128-10's search).
OUTFIT_UNITS = 4
#: Gaussian points a batch (half at scale 1, half at scale 3): OUTFIT_POINTS per unknown of a
#: row, at least OUTFIT_SMALL and at most OUTFIT_BATCH; the most batches a search asks.
OUTFIT_POINTS, OUTFIT_SMALL, OUTFIT_BATCH, OUTFIT_BATCHES = 128, 1024, 16384, 16
#: Points that stand out, per unknown of a row and per unit not found, after which no more
#: batches are asked; a group needs OUTFIT_MIN per unknown.
OUTFIT_PER, OUTFIT_MIN = 4, 2
#: A point's residual is strong for the grouping above OUTFIT_STRONG times the bar, and two
#: strong residuals share a direction within 1 - |cos| <= OUTFIT_COS.
OUTFIT_STRONG, OUTFIT_COS = 10.0, 1e-4
#: Share of a point's residual along a group's direction that may lie across it.
OUTFIT_ACROSS = 1e-3
#: Directions of two groups within 1 - |cos| <= OUTFIT_SAME are one unit's.
OUTFIT_SAME = 1e-2
#: Passes of a group's fit, each dropping the points whose residual exceeds OUTFIT_OUT times
#: the median (points where a second unit not found, or a unit whose row is off, adds its
#: part); a group whose rms residual stays above OUTFIT_RMS of its values is no one unit.
OUTFIT_PASSES, OUTFIT_OUT, OUTFIT_RMS = 3, 20.0, 1e-2
#: Points that stood out on a proposed row's positive side needed by :func:`_explains`, and the
#: share of them the row must explain.
OUTFIT_SIDE, OUTFIT_EXPLAINED = 32, 0.9


def _linear(known, tent, X, oriented=False):
    """(features in which a unit of the next layer is affine on its active side, their kind),
    and phi: ``"relu"`` for ``[relu(z~), 1]`` (the signs of the tentative layer settled: no
    term linear in the layer below), ``"narrow"`` for ``[relu(z~), z~, 1]`` (a wrong sign adds
    a term linear in z~), else ``"phi"`` for ``[phi, 1]``."""
    Phi, Z = features(known, tent, X)
    kt = tent[0].shape[0]
    one = np.ones((len(X), 1))
    if oriented:
        return np.hstack([Phi[:, :kt], one]), "relu", Phi
    if 2 * kt < Phi.shape[1]:
        return np.hstack([Phi[:, :kt], Z[-1], one]), "narrow", Phi
    return np.hstack([Phi, one]), "phi", Phi


def _theta(tent, c, kind):
    """A row of Theta (on ``[phi, 1]``) from coefficients on the features of :func:`_linear`."""
    if kind == "phi":
        return c
    kt, lin = tent[0].shape
    if kind == "relu":
        return np.concatenate([c[:kt], np.zeros(lin), c[-1:]])
    alpha, beta = c[:kt], c[kt : 2 * kt]
    return np.concatenate([alpha, beta @ tent[0], [beta @ tent[1] + c[-1]]])


def _normal(F, Y):
    """Coefficients of the least-squares fit of Y on F from the normal equations (a quarter of
    the time of a least-squares solve at 16,384 x 255: 0.04 s against 0.16 s, ad-hoc)."""
    return np.linalg.lstsq(F.T @ F, F.T @ Y, rcond=None)[0]


def _gaussian(rng, n, d):
    """n Gaussian points in d dimensions, half at scale 1 and half at scale 3."""
    return np.vstack([rng.standard_normal((n // 2, d)), 3.0 * rng.standard_normal((n - n // 2, d))])


def _fit_by_columns(F, Y, floor):
    """Row norms of the residual of the least-squares fit of Y on the design F, its
    coefficients, and the bar above which a point stands out. Fitted again (RESIDUAL_FITS
    times at most) on the points that each column's support fits best: for every column,
    the half of the points where it is nonzero whose residuals are lowest (the constant
    column: the best half of all points). A fit on the best half of all points alone
    (:func:`.residual._fit_residual`) may leave out every point where a unit found rarely
    switches on, and then gives that unit no weight: on planted 20-12-8-3 networks with two
    units not found (ad-hoc), 1,742 and 3,200 of 16,384 points stood out where neither was
    active; none with the columns' halves."""
    nz = F != 0
    use = np.ones(len(F), dtype=bool)
    for _ in range(RESIDUAL_FITS):
        # The sets from the normal equations, the coefficients from least squares.
        r = np.linalg.norm(Y - F @ _normal(F[use], Y[use]), axis=1)
        best = np.zeros(len(F), dtype=bool)
        for c in np.nonzero(nz.any(axis=0))[0]:
            best |= nz[:, c] & (r <= np.median(r[nz[:, c]]))
        if np.array_equal(best, use):
            break
        use = best
    # Then on the points within the bar, the bar from their median each time (a column's
    # best half holds points of a unit not found where it is active with that column's).
    coef = np.linalg.lstsq(F[use], Y[use], rcond=None)[0]
    r = np.linalg.norm(Y - F @ coef, axis=1)
    for _ in range(RESIDUAL_FITS):
        bar = max(RESIDUAL_OUT * float(np.median(r[use])), floor)
        within = r <= bar
        if np.array_equal(within, use):
            break
        use = within
        coef = np.linalg.lstsq(F[use], Y[use], rcond=None)[0]
        r = np.linalg.norm(Y - F @ coef, axis=1)
    return r, coef, bar


def _batch(tent, oriented):
    """Points a batch: OUTFIT_POINTS per unknown of a row (the columns of :func:`_linear`'s
    features), within OUTFIT_SMALL and OUTFIT_BATCH."""
    kt, lin = tent[0].shape
    p = kt + 1 if oriented else (2 * kt + 1 if 2 * kt < kt + lin else kt + lin + 1)
    return int(np.clip(OUTFIT_POINTS * p, OUTFIT_SMALL, OUTFIT_BATCH))


def _standing_out(oracle, known, tent, Theta, rng, oriented, missing):
    """(features, residuals) at the Gaussian points where the outputs' fit on the rows found
    stands out, the bar, and the features' kind (:func:`_linear`); None where the model does not
    answer there or nothing stands out."""
    d, n = oracle.d, _batch(tent, oriented)
    G_out, R_out = [], []
    fit = None
    for _ in range(OUTFIT_BATCHES):
        X = _gaussian(rng, n, d)
        try:
            Y = oracle(X)
        except NonFiniteOutputs:
            break
        G, kind, Phi = _linear(known, tent, X, oriented)
        F = _design(Phi, Theta)
        if fit is None:
            floor = RESIDUAL_FLOOR * oracle.eps * float(np.abs(Y).max())
            # First the bars of the two fits of .residual._best_fit on a quarter of the points.
            kt = tent[0].shape[0]
            cols = kt if oriented or Phi.shape[1] > RESIDUAL_POINTS // 4 else Phi.shape[1]
            plain, lin = (_fit_residual(_design(Phi[::4], Theta, c), Y[::4], floor, _normal)[2] for c in (0, cols))
            if lin * RESIDUAL_TIGHTER < plain:
                return None  # a unit not found that is active on most inputs
            r, coef, bar = _fit_by_columns(F, Y, floor)
            if np.mean(r > bar) > OUTFIT_SHARE:
                return None
            fit = coef, bar
        coef, bar = fit
        R = Y - F @ coef
        out = np.linalg.norm(R, axis=1) > bar
        G_out.append(G[out])
        R_out.append(R[out])
        have = sum(len(r) for r in R_out)
        if have >= OUTFIT_PER * G.shape[1] * missing or have * OUTFIT_BATCHES < OUTFIT_MIN * G.shape[1]:
            break  # enough, or too few to come by OUTFIT_BATCHES (none where every unit is found)
    if fit is None or not sum(len(r) for r in R_out):
        return None
    return np.vstack(G_out), np.vstack(R_out), fit[1], kind


def _directions(R, bar):
    """Unit directions in output space along which groups of strong residuals lie (largest
    group first)."""
    r = np.linalg.norm(R, axis=1)
    D = R[r > OUTFIT_STRONG * bar] / r[r > OUTFIT_STRONG * bar, None]
    dirs: list = []
    left = np.ones(len(D), dtype=bool)
    while left.sum():
        Dl = D[left]
        near = np.abs(Dl @ Dl.T) > 1 - OUTFIT_COS
        i = int(np.argmax(near.sum(axis=1)))
        grp = np.nonzero(left)[0][near[i]]
        v = np.linalg.svd(D[grp], full_matrices=False)[2][0]
        if not any(abs(v @ u) > 1 - OUTFIT_SAME for u in dirs):  # one unit's points split by noise
            dirs.append(v)
        left[grp] = False
    return dirs


def _row(G, t):
    """Least-squares coefficients of t on G, dropping outliers (OUTFIT_PASSES); None where the
    points left are too few or the fit misses (not one unit)."""
    use = np.ones(len(t), dtype=bool)
    for _ in range(OUTFIT_PASSES):
        if use.sum() < OUTFIT_MIN * G.shape[1]:
            return None
        c = np.linalg.lstsq(G[use], t[use], rcond=None)[0]
        e = np.abs(G @ c - t)
        use = e <= OUTFIT_OUT * max(float(np.median(e[use])), 1e-300)
    ok = np.sqrt(np.mean(e[use] ** 2)) <= OUTFIT_RMS * np.sqrt(np.mean(t[use] ** 2))
    return c if ok and use.sum() >= OUTFIT_MIN * G.shape[1] else None


def output_rows(oracle, known, tent, Theta, rng, oriented=False, missing=1):
    """Candidate rows of Theta (on ``[phi, 1]`` of ``tent``) for the last hidden layer's
    units not found, from the residual of the outputs' fit on the rows found (``Theta``);
    ``oriented``: the signs of ``tent`` are settled; ``missing``: the units not found.
    Returns an array of rows (none where nothing stands out or no group fits one unit)."""
    got = _standing_out(oracle, known, tent, Theta, rng, oriented, missing)
    empty = np.zeros((0, Theta.shape[1]))
    if got is None:
        return empty
    G, R, bar, kind = got
    rows = []
    for v in _directions(R, bar)[: 2 * missing]:
        t = R @ v
        # Points of this direction alone: what is left across it stays under the bar or a
        # share OUTFIT_ACROSS of the residual along it (the fit's own error grows with it).
        mine = np.linalg.norm(R - t[:, None] * v[None, :], axis=1) <= np.maximum(bar, OUTFIT_ACROSS * np.abs(t))
        c = _row(G[mine], t[mine])
        if c is not None:  # oriented: positive where the unit stands out (active)
            rows.append(np.sign(np.median(t[mine])) * _theta(tent, c, kind))
    return np.array(rows) if rows else empty


def output_units(oracle, known, tent, k, rng, carry, oriented=False):
    """The rows of :func:`output_rows` that pass the verification, added to
    ``carry["Theta"]`` (the search's units found, :func:`.deep.next_layer`; once for each
    number of units found); returns the number added."""
    Theta = carry["Theta"]
    if carry.get("outfit_tried") == len(Theta) or len(Theta) >= k:
        return 0
    carry["outfit_tried"] = len(Theta)
    rows = output_rows(oracle, known, tent, Theta, rng, oriented, k - len(Theta))
    if not len(rows):
        return 0
    tol = 0.5 * oracle.window()
    if oracle.low_precision:
        rows = _refined(oracle, known, tent, Theta, rows, rng)
    hold = verified(oracle, known, tent, rows, rng, carry, tol)
    if not hold.all():  # a rarely active unit's kinks show at 66-88% of its crossings
        hold |= _explains(oracle, known, tent, Theta, rows, rng)
    carry["Theta"] = _add(Theta, rows[hold], k, tol)
    carry["output_rows"] = carry.get("output_rows", 0) + len(carry["Theta"]) - len(Theta)
    return len(carry["Theta"]) - len(Theta)


def from_outputs(oracle, known, tent, Theta, k, rng, carry, oriented=False, least=0):
    """The rows found (``Theta``) with those :func:`output_units` adds, asked again while it
    adds some, from ``least`` units found on and with at most OUTFIT_UNITS of the k missing
    (the searches call it every round: :func:`.deep._gathered`, ``carry["outfit"]``); kept
    in ``carry["Theta"]``."""
    if not least <= len(Theta) < k or k - len(Theta) > OUTFIT_UNITS:
        return Theta
    carry["Theta"] = Theta
    while len(carry["Theta"]) < k:
        if not output_units(oracle, known, tent, k, rng, carry, oriented):
            break
    return carry["Theta"]


def _explains(oracle, known, tent, Theta, rows, rng):
    """Whether each row (oriented: positive where its unit is active) explains the outputs
    where they stand out of the fit on the rows found: on a new batch of Gaussian points,
    with the row's unit added to the fit (:func:`_fit_by_columns`), OUTFIT_EXPLAINED of the
    points that stood out on its positive side (OUTFIT_SIDE of them at least) fit within
    the bar of the fit without it.

    The test of kinks at predicted crossings (:func:`.verify.verified`) needs all 4 of 4
    random lines, or 7 of 8, and a rarely active unit's kinks show at 66-88% of its
    crossings in float32 (the last two second-layer units of the trained float32
    784-128-128-10; 7 of 8, 2 of 3 and 6 of 6 with the rows fitted to its true weights through
    the first layer found, ad-hoc), where the searches went on for two million queries."""
    X = _gaussian(rng, _batch(tent, True), oracle.d)
    try:
        Y = oracle(X)
    except NonFiniteOutputs:
        return np.zeros(len(rows), dtype=bool)
    Phi = features(known, tent, X)[0]
    floor = RESIDUAL_FLOOR * oracle.eps * float(np.abs(Y).max())
    r, _, bar = _fit_by_columns(_design(Phi, Theta), Y, floor)
    ok = np.zeros(len(rows), dtype=bool)
    for i, row in enumerate(rows):
        side = (r > bar) & (Phi @ row[:-1] + row[-1] > 0)
        if side.sum() >= OUTFIT_SIDE:
            r2 = _fit_by_columns(_design(Phi, np.vstack([Theta, row])), Y, floor)[0]
            ok[i] = np.mean(r2[side] <= bar) >= OUTFIT_EXPLAINED
    return ok


def _refined(oracle, known, tent, Theta, rows, rng):
    """Low precision, the signs of ``tent`` settled (no row reads the layer below it): the
    proposed rows refitted through precise kinks (:func:`.verify.refit_rows`), as they are
    otherwise. A row from the outputs is as far off as the rows found (4e-4 on the trained
    float32 784-128-128-10, ad-hoc), and its predicted crossings miss the verification's
    windows."""
    if np.any(np.vstack([Theta, rows])[:, tent[0].shape[0] : -1] != 0):
        return rows
    return refit_rows(oracle, known, tent, Theta, rows, rng, last=True)
