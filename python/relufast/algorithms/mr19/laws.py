"""Bias laws of the MR19 model: moments, tails and the calibrated regularisation."""

from __future__ import annotations

import numbers

import numpy as np
from scipy.optimize import brentq
from scipy.special import ndtr

from ..._validation import check_positive_int
from ...stages.hermite import gaussian_pdf

# ----------------------------------------------------------------------------------------------
# Bias laws
# ----------------------------------------------------------------------------------------------


def _check_law(bias, *, allow_point=True, name="bias"):
    """A bias law: a real number (every coordinate has this bias) or a scipy.stats frozen
    continuous distribution (i.i.d. coordinates)."""
    if hasattr(bias, "cdf") and hasattr(bias, "pdf") and hasattr(bias, "expect"):
        return bias
    if isinstance(bias, numbers.Real) and not isinstance(bias, (bool, np.bool_)):
        if not np.isfinite(float(bias)):
            raise ValueError(f"{name} must be finite; got {bias!r}")
        if not allow_point:
            raise ValueError(
                f"{name} must be a law with a density (a scipy.stats frozen continuous distribution): "
                f"the likelihood (33)-(34) needs p; got the constant {bias!r}"
            )
        return float(bias)
    raise TypeError(
        f"{name} must be a real number or a scipy.stats frozen continuous distribution; got {type(bias).__name__}"
    )


def _law_key(law):
    """A hashable key for a bias law (a constant, or a frozen law's name and parameters), or
    None when the law's parameters are not plain numbers (then nothing is cached)."""
    if isinstance(law, float):
        return ("const", law)
    try:
        key = (law.dist.name, tuple(law.args), tuple(sorted(law.kwds.items())))
        hash(key)
        return key
    except (AttributeError, TypeError):
        return None


#: mu, sigma^2, eta^2 and the calibrated lambda depend only on (law, d, delta): cached.
_CACHE: dict = {}


def _cached(key, compute):
    if key is None or any(part is None for part in key):
        return compute()
    if key not in _CACHE:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        _CACHE[key] = compute()
    return _CACHE[key]


def _expect(law, f):
    """E[f(B)] for a constant or a frozen law."""
    if isinstance(law, float):
        return float(f(np.float64(law)))
    return float(law.expect(f))


def bias_moments(bias=0.0):
    """Theorem 4's scale parameters for a bias law.

    ``mu = E[g relu(g + B)] = E[Phi(B)]`` (the target of (47) is mu c*), and the two
    parameters of eq. (58), ``sigma^2 = E[(relu(g + B) - mu g)^2]`` and
    ``eta^2 = E[g^2 (relu(g + B) - mu g)^2]``, g ~ N(0, 1) independent of B. The closed
    forms (Stein's lemma and truncated-normal moments) are derived for relufast, not in
    the paper.

    Parameters
    ----------
    bias : float or scipy.stats frozen distribution, default=0.0

    Returns
    -------
    mu, sigma2, eta2 : float
    """
    law = _check_law(bias)
    return _cached(("moments", _law_key(law)), lambda: _bias_moments(law))


def _bias_moments(law):
    mu = _expect(law, ndtr)
    s2 = _expect(law, lambda b: (1.0 + b * b) * ndtr(b) + b * gaussian_pdf(b)) - mu * mu

    def m234(b):
        M2 = ndtr(b) - b * gaussian_pdf(b)
        M3 = (b * b + 2.0) * gaussian_pdf(b)
        M4 = 3.0 * M2 - b**3 * gaussian_pdf(b)
        return M2, M3, M4

    def first(b):
        M2, M3, M4 = m234(b)
        return M4 + 2.0 * b * M3 + b * b * M2

    def second(b):
        _, M3, M4 = m234(b)
        return M4 + b * M3

    eta2 = _expect(law, first) - 2.0 * mu * _expect(law, second) + 3.0 * mu * mu
    return mu, s2, eta2


def _tail_fixed_b(t, b, mu):
    """P(|Z| > t), Z = relu(G + b) - mu G, for a fixed b and the law's mu in (0, 1)."""
    a = 1.0 - mu

    def up(lo):  # P(G > lo)
        return ndtr(-lo)

    def between(lo, hi):
        return np.where(hi > lo, ndtr(hi) - ndtr(lo), 0.0)

    # G > -b: Z = (1 - mu) G + b;  G <= -b: Z = -mu G.
    return (
        up(np.maximum(-b, (t - b) / a))
        + between(-b, (-t - b) / a)
        + between(t / mu, -b)
        + ndtr(np.minimum(-t / mu, -b))
    )


def abs_z_tail(t, bias=0.0):
    """P(|Z| > t) for the misfit ``Z = relu(G + B) - mu G`` of one coordinate (closed form
    for a constant bias, integrated over the law otherwise). Derived for relufast."""
    law = _check_law(bias)
    mu = _expect(law, ndtr)
    if not 0.0 < mu < 1.0:
        raise ValueError(f"the bias law gives mu = {mu}; need 0 < mu < 1")
    return _expect(law, lambda b: _tail_fixed_b(t, b, mu))


def calibrated_lam(d, bias=0.0, delta=0.0, *, kappa=2.0):
    """relufast's default lambda for (47): ``kappa (q_{1-1/d}(|Z|) + delta) / d``.

    Theorem 4 asks for ``lambda >= 2 ||z + w||_inf / d``; ``||z||_inf`` over d coordinates is
    about the (1 - 1/d)-quantile of |Z|, found here by bisection on :func:`abs_z_tail`.
    Assumes ``||c*|| = 1`` as Theorem 4 does (lambda scales with ``||c*||``). Not in the
    paper. For b = 0: ``tau = lambda d = Phi^{-1}(1 - 1/(2d)) + 2 delta``.
    """
    d = check_positive_int(d, "d", minimum=2)
    law = _check_law(bias)
    key = _law_key(law)
    return _cached(
        ("lam", key, d, float(delta), float(kappa)) if key is not None else None,
        lambda: _calibrated_lam(d, law, float(delta), float(kappa)),
    )


def _calibrated_lam(d, law, delta, kappa):
    mu = bias_moments(law)[0]
    if not 0.0 < mu < 1.0:
        raise ValueError(f"the bias law gives mu = {mu}; need 0 < mu < 1")
    target = 1.0 / d

    def g(t):
        return _expect(law, lambda b: _tail_fixed_b(t, b, mu)) - target

    hi = 1.0
    while g(hi) > 0:
        hi *= 2.0
    q = brentq(g, 0.0, hi, xtol=1e-12)
    return kappa * (q + float(delta)) / d


def theory_lam(A, c, b, w, *, bias=None):
    """Theorem 4's lambda, ``2 ||z + w||_inf / d`` with ``z = relu(A c + b) - mu A c``.

    Needs the truth (c*, b, w), so it is for tests and studies. ``bias`` (the law, for mu)
    defaults to the constant ``b[0]`` when every entry of b is equal.
    """
    A = np.asarray(A, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    b = np.broadcast_to(np.asarray(b, dtype=np.float64), np.shape(w))
    if bias is None:
        if not np.all(b == b.flat[0]):
            raise ValueError("b varies across coordinates: pass its law as bias= (for mu)")
        bias = float(b.flat[0])
    mu = bias_moments(bias)[0]
    Ac = c @ A.T
    z = np.maximum(Ac + b, 0.0) - mu * Ac
    return 2.0 * np.max(np.abs(z + w), axis=-1) / A.shape[0]


# ----------------------------------------------------------------------------------------------
# Problem D: the generalized LASSO (47)
# ----------------------------------------------------------------------------------------------
