"""Taking a chain across a boundary it could not reach by walking (:func:`.deep._chains`).

With the signs of the tentative layer known, a chain of a unit j of the next layer that
never saw some units of the tentative layer active (its ``todo``) keeps one null direction
of its equations per such unit besides j's row; each of those directions only changes the
pre-activation where its unit is active. Where its null space has exactly that dimension,
j's pre-activation is known (up to scale) wherever the todo units are inactive, and so is
the part of j's boundary there, with where it meets the boundary of a todo unit u: the
point x* with z_u(x*) = 0 and zeta(x*) = 0 (computed by Newton steps on the two piecewise
linear equations, no query). Just before x*, on j's known boundary, the chain is put back,
facing u: its next step crosses u's boundary at x* and finds j's kink past it, on the side
where u is active. The trained diabetes 10-100-100-1 (sklearn's default widths): its
second-layer boundaries meet the active side of some first-layer units on 0.2 to 2% of it,
far from where the walks go (a diagnostic run with its signs given).
"""

from __future__ import annotations

import numpy as np

from .net import feature_jacobians, features, pre_activations, preact_jacobians
from .nullspace import _null_rows

__all__ = ["REACHES", "reach_start", "reached"]

#: Times a round a stalled chain is put back before a boundary it never crossed, and the
#: most units it may have left unseen for that.
REACHES, REACH_TODO = 4, 4


def reached(layers, M, todo, x, n, tol, loose, rng):
    """:func:`reach_start` for a chain (stacked equations M, last kink x and normal n) whose
    null space (relative tolerance ``tol``, ``loose`` as :func:`.nullspace._null_count`
    says) is one more than the units ``todo`` it never saw active (1 to REACH_TODO of them);
    None otherwise."""
    if not 1 <= len(todo) <= REACH_TODO:
        return None
    K = _null_rows(M.reshape(-1, M.shape[-1]), tol, loose)
    return reach_start(layers, K, todo, x, n, rng) if len(K) == len(todo) + 1 else None


#: Starting points of the Newton iterations (around the chain's last kink, at growing scales),
#: the iterations, and the relative residual at which they stop.
REACH_STARTS, REACH_ITERS, REACH_TOL = 48, 40, 1e-12
#: Distance before x* at which the chain is put back (at most; half the room to the nearest
#: other boundary when that is closer).
REACH_BACK = 1e-4


def _values(layers, theta, X, u):
    """(z_u, zeta) at the rows of X and their gradients (n, d) each."""
    known, tent = layers[:-1], layers[-1]
    Phi, Z = features(known, tent, X)
    zu = np.hstack(Z)[:, u]
    gu = np.concatenate(preact_jacobians(layers, X), axis=1)[:, u]
    zeta = Phi @ theta[:-1] + theta[-1]
    gz = np.einsum("D,nDd->nd", theta[:-1], feature_jacobians(known, tent, X))
    return zu, gu, zeta, gz


def _newton(layers, theta, X, u):
    """Least-norm Newton steps towards z_u = zeta = 0 from the rows of X; the points and
    whether each converged."""
    ok = np.zeros(len(X), dtype=bool)
    for _ in range(REACH_ITERS):
        zu, gu, zeta, gz = _values(layers, theta, X, u)
        nu, nz = np.linalg.norm(gu, axis=1), np.linalg.norm(gz, axis=1)
        ok = (np.abs(zu) <= REACH_TOL * nu * (1 + np.linalg.norm(X, axis=1))) & (
            np.abs(zeta) <= REACH_TOL * nz * (1 + np.linalg.norm(X, axis=1))
        )
        if ok.all():
            break
        J = np.stack([gu, gz], axis=1)  # (n, 2, d)
        G = J @ np.swapaxes(J, 1, 2)
        det = G[:, 0, 0] * G[:, 1, 1] - G[:, 0, 1] * G[:, 1, 0]
        good = np.abs(det) > 1e-12 * np.maximum(nu * nz, 1e-300) ** 2
        r = np.stack([zu, zeta], axis=1)
        y = np.zeros_like(r)
        y[good] = np.linalg.solve(G[good], r[good][:, :, None])[:, :, 0]
        step = np.einsum("nk,nkd->nd", y, J)
        X = np.where((good & ~ok)[:, None], X - step, X)
    return X, ok & np.isfinite(X).all(axis=1)


def reach_start(layers, K, todo, x0, n0, rng):
    """A point on the chain's known boundary just before the boundary of a todo unit, its
    normal, and that unit (for the chain's next step), or None.

    ``K``: orthonormal rows spanning the null space of the chain's equations (one more than
    ``todo``, the (unit, sign of z~) pairs never visited); ``x0, n0``: its last kink and
    normal."""
    known, tent = layers[:-1], layers[-1]
    d = len(x0)
    # The row of K whose boundary the chain follows: largest gradient along n0 at x0 (the
    # null directions of the todo units vanish there).
    a = (K[:, :-1] @ feature_jacobians(known, tent, x0[None])[0]) @ n0
    if not np.any(a):
        return None
    theta = a @ K
    theta = theta / np.linalg.norm(theta[:-1])
    others = np.array([u for u, _ in todo])
    signs = np.array([s for _, s in todo], dtype=float)
    for j in rng.permutation(len(todo)):
        u, s = todo[j]
        scales = np.geomspace(0.1, 30.0, REACH_STARTS)[:, None] * (1 + np.linalg.norm(x0))
        X = x0 + scales * rng.standard_normal((REACH_STARTS, d)) / np.sqrt(d)
        X, ok = _newton(layers, theta, X, u)
        if not ok.any():
            continue
        X = X[ok]
        # The other todo units on their side never visited (where theta holds)
        Z = np.hstack(pre_activations(layers, X)[0])
        inside = ((Z[:, others] * signs) < 0) | (others == u)
        X = X[inside.all(axis=1)]
        for x in X[np.argsort(np.linalg.norm(X - x0, axis=1))]:
            back = _back(layers, theta, x, u, s)
            if back is not None:
                return (*back, (u, s))
    return None


def _back(layers, theta, x, u, s):
    """The point on theta's boundary REACH_BACK (or less) before x towards the side of u that
    was visited, and the boundary's normal there; None where another boundary is that close."""
    _, gu, _, _ = _values(layers, theta, x[None], u)
    g = s * gu[0] / np.linalg.norm(gu[0])  # towards the side never visited
    probe = x - 1e-9 * g
    _, _, _, gz = _values(layers, theta, probe[None], u)
    n = gz[0] / np.linalg.norm(gz[0])
    t = g - (g @ n) * n
    if np.linalg.norm(t) < 1e-6:
        return None
    t /= np.linalg.norm(t)
    Z0 = np.hstack(pre_activations(layers, probe[None])[0])[0] > 0
    for eta in REACH_BACK * 0.5 ** np.arange(12):
        y = x - eta * t
        Z = np.hstack(pre_activations(layers, y[None])[0])[0] > 0
        if (Z == Z0).all():
            return y, n
    return None
