"""Signs, the output layer, the exact polish and the certificate of a chosen-query extraction.

Signs ([CCHRSS24] solve sign recovery in polynomial time by neuron wiggles; relufast uses an
exact linear identity instead). A unit found with the wrong sign gives ``relu(-z) =
relu(z) - z``: the layer after it is then affine in ``phi = [relu(z~), h]`` with a term
``beta . h = -sum_{j wrong} v_j w~_j . h``. Fitting that layer in phi-space (the output layer
by least squares, a hidden layer from its boundaries, :mod:`.deep`) and solving
``beta = -sum_j delta_j v_j w~_j`` for delta in {0, 1} gives the units to flip
(:func:`resolve_signs`). For one hidden layer this is the least-squares trick of the
chosen-query note: the fitted linear term is minus the sum of the flipped units. When the
layer has more units than that term has equations (one hidden layer: k > d m), least
squares cannot find the 0/1 solution; it is then a low-density subset-sum problem, solved
by lattice reduction (:func:`relufast._knapsack.binary_combination`).

Polish (beyond the papers, as the activation-region refinement of two-layer relufast
methods): with every layer estimated, points far from every boundary have a known
activation pattern, on which the network is a polynomial in its weights; Gauss-Newton on
all layers at once (float64 least squares) takes the weights from finite-difference
accuracy to the rounding of the outputs (:func:`polish`).

References
----------
.. [CJM20] N. Carlini, M. Jagielski, I. Mironov, "Cryptanalytic Extraction of Neural Network
   Models", CRYPTO 2020.
.. [CCHRSS24] I. A. Canales-Martinez, J. Chavez-Saab, A. Hambitzer, F. Rodriguez-Henriquez,
   N. Satpute, A. Shamir, "Polynomial Time Cryptanalytic Extraction of Neural Network
   Models", EUROCRYPT 2024.
"""

from __future__ import annotations

import numpy as np

from .._knapsack import sign_flips
from .net import features, forward, pre_activations
from .probes import (
    MAX_TOP_SCALE,
    MIN_TOP_SCALE,
    REACH_FACTOR,
    certificate_probes,
    magnitude,
    probe_errors,
    reach,
    send,
)

__all__ = ["resolve_signs", "output_layer", "polish", "certify", "cert_tolerance"]


def resolve_signs(Wt, bt, coef, beta, const):
    """Flip the units of a tentative layer whose sign the next layer shows to be wrong.

    Parameters
    ----------
    Wt, bt : tentative layer (k, k_prev), (k,)
    coef : ndarray of shape (q, k)
        Next layer's coefficients on relu(z~).
    beta : ndarray of shape (q, k_prev)
        Next layer's coefficients on h (the linear term).
    const : ndarray of shape (q,)

    Returns
    -------
    W, b, next_W, next_b, ok
        The layer with signs fixed, the next layer on relu(z) alone, and whether every
        delta was near 0 or 1 and the linear term vanished after the flip.
    """
    flip, ok = sign_flips(Wt, coef, beta)
    s = np.where(flip, -1.0, 1.0)
    next_b = const + coef[:, flip] @ bt[flip]
    return Wt * s[:, None], bt * s, coef.copy(), next_b, ok


def output_layer(known, tentative, X, Y, *, oriented=False):
    """The output layer by least squares on ``[relu(z~_L), h_{L-1}, 1]``, and the signs of
    the last hidden layer from its linear term (:func:`resolve_signs`); with ``oriented``
    (every sign known, :mod:`.signs`) by least squares on ``[relu(z_L), 1]`` alone, which
    also holds when the layer is wider than its inputs times the outputs (the linear term
    cannot settle the signs there).

    Returns (last hidden layer (W, b), output layer (W_o, c), ok)."""
    if oriented:
        Z, H = pre_activations([*known, tentative], X)
        C = _lstsq(np.hstack([H, np.ones((len(X), 1))]), Y)
        return tentative, (C[:-1].T, C[-1]), True
    Phi, _ = features(known, tentative, X)
    A = np.hstack([Phi, np.ones((len(X), 1))])
    C = _lstsq(A, Y)
    k = tentative[0].shape[0]
    coef, beta, const = C[:k].T, C[k:-1].T, C[-1]
    W, b, _, _, ok = resolve_signs(tentative[0], tentative[1], coef, beta, const)
    Z, H = pre_activations([*known, (W, b)], X)
    C = _lstsq(np.hstack([H, np.ones((len(X), 1))]), Y)
    return (W, b), (C[:-1].T, C[-1]), ok


def _lstsq(A, Y):
    """Minimum-norm least squares (the coefficients of units no point sees stay 0, which
    the sign resolution needs: a basic solution of a rank-deficient system is not)."""
    return np.linalg.lstsq(A, Y, rcond=None)[0]


def _params(hidden, out):
    return np.concatenate([np.concatenate([W.ravel(), b]) for W, b in [*hidden, out]])


def _unpack(theta, shapes):
    layers, i = [], 0
    for o, n in shapes:
        W = theta[i : i + o * n].reshape(o, n)
        i += o * n
        layers.append((W, theta[i : i + o]))
        i += o
    return layers[:-1], layers[-1]


def _jacobian(hidden, out, X):
    """Jacobian (n m, P) of the outputs in all weights, activation patterns held fixed."""
    Z, H_last = pre_activations(hidden, X)
    Hs = [np.asarray(X, dtype=np.float64)] + [np.maximum(z, 0.0) for z in Z]
    n, m = len(X), out[0].shape[0]
    G = np.broadcast_to(np.eye(m), (n, m, m))  # d y / d z of the current layer
    blocks = [np.concatenate([np.einsum("nmi,nj->nmij", G, Hs[-1]).reshape(n, m, -1), G], axis=2)]
    Wn = out[0]
    for li in range(len(hidden) - 1, -1, -1):
        G = np.einsum("nmi,ij->nmj", G, Wn) * (Z[li] > 0)[:, None, :]
        blocks.append(np.concatenate([np.einsum("nmi,nj->nmij", G, Hs[li]).reshape(n, m, -1), G], axis=2))
        Wn = hidden[li][0]
    return np.concatenate(blocks[::-1], axis=2).reshape(n * m, -1)


def polish(hidden, out, X, Y, *, margin, target=0.0, n_iter=4):
    """Gauss-Newton on all weights over the points whose pattern is certain (every
    pre-activation at least ``margin`` times its layer's scale from zero), stopping once
    the relative residual is at most ``target``. The normal equations are solved with a
    ridge at the rounding level (the positive scaling of each unit leaves J^T J singular).

    Returns (hidden, out, relative residual on the points used, points used)."""
    shapes = [W.shape for W, _ in [*hidden, out]]
    best = (hidden, out, np.inf, 0)
    for _ in range(n_iter + 1):
        Z, _ = pre_activations(hidden, X)
        safe = np.ones(len(X), dtype=bool)
        for z in Z:
            safe &= (np.abs(z) > margin * (np.abs(z).max(axis=0) + 1e-300)).all(axis=1)
        Xs, Ys = X[safe], Y[safe]
        if len(Xs) == 0:
            break
        R = (Ys - forward(hidden, out, Xs)).ravel()
        res = float(np.linalg.norm(R) / max(np.linalg.norm(Ys), 1e-300))
        if res < best[2]:
            best = (hidden, out, res, int(safe.sum()))
        if res <= target or res >= 0.5 * best[2] and res > best[2]:
            break
        J = _jacobian(hidden, out, Xs)
        A = J.T @ J
        A[np.diag_indices_from(A)] += 1e-13 * float(np.max(np.diag(A)))
        step = np.linalg.solve(A, J.T @ R)
        hidden, out = _unpack(_params(hidden, out) + step, shapes)
    return best


def cert_tolerance(eps, widths):
    """Relative error under which the extraction reproduces the model to the precision of
    its outputs: CERT_FACTOR * eps * sqrt(d + sum of widths) * depth."""
    return CERT_FACTOR * eps * float(np.sqrt(sum(widths))) * (len(widths) - 1)


#: Margin of the certificate over the rounding of a forward pass (float32 residuals of the
#: true network measured at 0.3-0.5 eps sqrt(d) per layer, :mod:`relufast.stages.precision`).
CERT_FACTOR = 16.0


def certify(oracle, hidden, out, rng, *, top=None, readable=None):
    """Compare the extracted network with the model on the probes of :mod:`.probes`: fresh
    Gaussian points at scales from 1 to ``max(1e4, 10 R)`` (R the largest scale at which an
    extracted unit switches), both sides of every extracted boundary and the wedges between
    nearly parallel first-layer boundaries, in :data:`.probes.CALLS` calls of the model that each
    also ask the same few points (a model that answers them differently is not a function).

    Parameters
    ----------
    oracle : Oracle
    hidden, out : the extracted network
    rng : numpy Generator
    top : float or None
        Largest scale (default from :func:`.probes.certificate_probes`); lowered for models
        whose output dtype would overflow there.
    readable : callable or None
        Outputs (n, m) -> bool (n,): where the model's outputs can be read (a classifier's
        logits from its probabilities, :func:`relufast.bridges.logit_function`). The largest
        scale is lowered to where the extracted network's outputs are readable on Gaussian
        points (``"readable_scale"`` in the result).

    Returns
    -------
    dict
        ``"error"`` (the largest relative error over all probes), ``"by_scale"``,
        ``"by_family"``, ``"worst"`` (:func:`.probes.probe_errors`), ``"queries"`` (probes
        sent), ``"calls"``, ``"counts"`` (probes per family), ``"top_scale"`` and
        ``"inconsistent"`` (the largest change of an answer to a repeated point between calls,
        relative to the outputs' scale at scale 1).
    """
    d = oracle.d
    cap = _overflow_scale(oracle, hidden, out, rng, d)
    if top is None:
        top = min(MAX_TOP_SCALE, max(MIN_TOP_SCALE, REACH_FACTOR * reach(hidden, rng)))
    legible = np.inf if readable is None else _readable_scale(hidden, out, rng, d, readable)
    X, group, family, scales = certificate_probes(hidden, rng, top=min(top, cap, legible))
    Y, Xr, R = send(oracle, X, rng)
    calls, reps = R.shape[:2]
    X, Y = np.vstack([X, np.tile(Xr, (calls, 1))]), np.vstack([Y, R.reshape(calls * reps, -1)])
    group = np.concatenate([group, np.zeros(calls * reps, dtype=int)])
    family = np.concatenate([family, np.full(calls * reps, "repeats", dtype=object)])
    P, M = forward(hidden, out, X), magnitude(hidden, out, X)
    errs = probe_errors(Y, P, M, group, family, scales)
    at1 = group == 0
    den = max(float(np.abs(Y[at1][np.isfinite(Y[at1])]).max(initial=0.0)), float(M[at1].max()), 1e-300)
    with np.errstate(invalid="ignore"):
        changed = np.nan_to_num(np.abs(R - R[:1]), nan=np.inf).max() / den
    errs.update(
        error=float(errs["worst"][2]),
        queries=len(X),
        calls=calls,
        counts={str(f): int((family == f).sum()) for f in dict.fromkeys(family)},
        top_scale=float(scales[-1]),
        inconsistent=float(changed),
        readable_scale=float(legible),
    )
    return errs


def _readable_scale(hidden, out, rng, d, readable):
    """Largest scale (1 to MAX_TOP_SCALE, steps of 2^(1/4)) at which the extracted network's
    outputs on READABLE_POINTS Gaussian points are all ``readable`` (at least 1)."""
    X = rng.standard_normal((READABLE_POINTS, d))
    best = 1.0
    for s in np.geomspace(1.0, MAX_TOP_SCALE, int(4 * np.log2(MAX_TOP_SCALE)) + 1):
        if not np.all(readable(forward(hidden, out, s * X))):
            break
        best = float(s)
    return best


#: Gaussian points on which the readable scale is judged.
READABLE_POINTS = 256


def _overflow_scale(oracle, hidden, out, rng, d):
    """Largest scale at which the model's outputs stay 1e-3 of the largest finite number of
    their dtype (float64: no limit below MAX_TOP_SCALE), from the extracted network's
    magnitude at scale 1 (which grows at most linearly with the scale)."""
    name = oracle.answer_dtype or "float64"
    big = float(np.finfo(name).max) if np.dtype(name).kind == "f" else float(np.finfo(np.float64).max)
    M1 = float(magnitude(hidden, out, rng.standard_normal((16, d))).max())
    return max(1.0, 1e-3 * big / max(M1, 1e-300))


def sign_block(theta, Wt):
    """The equations (B, y) on the flips delta that a row ``(v, beta, c)`` on phi gives,
    ``sum_i delta_i v_i w~_i = -beta`` (:func:`.fit.resolve_signs`), scaled by 1 / |v|."""
    kt, dp = Wt.shape
    v0, beta0 = theta[:kt], theta[kt : kt + dp]
    size = np.linalg.norm(v0)
    return (v0[None, :] * Wt.T) / size, -beta0 / size


def signs_from_rows(tent, Theta, rows):
    """The flips of the tentative layer from the units found (rows of Theta) and the sign
    equations of unfinished chains (:func:`.deep._unfinished_sign_rows`), where together they
    determine every flip (full column rank) and least squares lands within SIGN_ROUND of a
    0/1 vector that leaves a residual under SIGN_REST of the right-hand side; else None."""
    Wt = tent[0]
    kt = Wt.shape[0]
    blocks = list(rows) + [sign_block(theta, Wt) for theta in Theta]
    if not blocks:
        return None
    A = np.vstack([B for B, _ in blocks])
    y = np.concatenate([b for _, b in blocks])
    if len(A) < kt or np.linalg.matrix_rank(A) < kt:
        return None
    delta, *_ = np.linalg.lstsq(A, y, rcond=None)
    flip = delta > 0.5
    rest = np.linalg.norm(A @ flip - y)
    if np.max(np.minimum(np.abs(delta), np.abs(delta - 1))) > SIGN_ROUND or rest > SIGN_REST * np.linalg.norm(y):
        return None
    return flip


#: Largest distance of a least-squares flip from 0 or 1, and largest residual of the 0/1
#: flips relative to the right-hand side, for :func:`signs_from_rows` to settle the signs.
SIGN_ROUND, SIGN_REST = 0.1, 1e-4
