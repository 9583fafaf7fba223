"""Hermite coefficients of GP19's activations, the activation table and row matching."""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import integrate, special

from ..._validation import check_positive_int
from ...activations import GP19_ACTIVATIONS
from ...stages.hermite import gaussian_pdf, hermite_he, relu_coefficient, step_coefficient

#: Phi^{-1}(0.6) - Phi^{-1}(0.4): the spread of the 0.4 and 0.6 quantiles (Algorithm 2).
_QUANTILE_SPREAD = float(special.ndtri(0.6) - special.ndtri(0.4))
#: |u_4| below this fraction of |u_2| counts as a vanishing fourth Hermite coefficient.
_DEGENERATE_RATIO = 1e-3
#: Condition number of W (estimated from the top block of M_2) from which Step 1 warns:
#: a kappa = 11 teacher failed in our measurements (max angle > 1 rad), kappa = 1.6 worked.
_KAPPA_WARN = 10.0
#: Step 1 (TPM) stops once 1 - |cos| between iterates < 1e-24 (a move < 1.4e-12): the rows
#: are then at their fixed points to rounding, so one process, ranks and dask agree to 1e-13
#: at d = 10; with 1e-10 (a move of 1.4e-5) the stops fell on rounding-amplified paths (1e-8).
_TPM_TOL = 1e-24
#: L-BFGS's gtol for the landscapes of Sec. 2.1 and App. B.4.
_LANDSCAPE_GTOL = 1e-10

_STEP1_ACTIVATIONS = ("relu", "step", "sigmoid", "square")
#: The Stein update's background band sits this far below the band at (t_1 + t_2) / 2.
_BACKGROUND_SHIFT = 1.25
_EVEN = ("abs", "square")


class _Unit:
    """GP19's activation as the hidden map of a result's network (``u(V x + b)``)."""

    def __init__(self, name, reflect=False):
        self.name = name + ("(-a)" if reflect else "")
        self._u = _activation(name)
        self._reflect = reflect
        self.degree = {"relu": 1.0, "step": 0.0}.get(name)

    @property
    def homogeneous(self):
        return self.degree is not None

    def __call__(self, Z):
        Z = np.asarray(Z, dtype=np.float64)
        return self._u(-Z if self._reflect else Z)

    def __repr__(self):
        return f"gp19 activation {self.name}"


def _activation(name):
    return GP19_ACTIVATIONS[name]


def hermite_coeffs(activation, t, kmax=4):
    """Normalised Hermite coefficients ``u_k = E[u(g - t) h_k(g)]``, ``h_k = He_k / sqrt(k!)``.

    Parameters
    ----------
    activation : {"relu", "step", "sigmoid", "abs", "square"}
    t : float
        Threshold.
    kmax : int, default=4

    Returns
    -------
    ndarray of shape (kmax + 1,)

    Notes
    -----
    GP19 App. A.3 with the exact forms (its Lemma 10 bound t^3 is t^2, erratum 4):
    ReLU ``u_0 = phi(t) - t Phi^c(t)``, ``u_1 = Phi^c(t)``, ``u_k = phi(t) He_{k-2}(t) / sqrt(k!)``;
    step ``u_0 = Phi^c(t)``, ``u_k = phi(t) He_{k-1}(t) / sqrt(k!)``. Other activations by
    adaptive quadrature with a break point at t.
    """
    t = float(t)
    kmax = check_positive_int(kmax, "kmax", minimum=0)
    out = np.zeros(kmax + 1)
    if activation == "relu":
        for k in range(kmax + 1):  # u(g - t) = relu(g + b) with b = -t
            out[k] = relu_coefficient(k, -t) / math.sqrt(math.factorial(k))
        return out
    if activation == "step":
        for k in range(kmax + 1):
            out[k] = step_coefficient(k, -t) / math.sqrt(math.factorial(k))
        return out
    if activation not in ("sigmoid", "abs", "square"):
        raise ValueError(f"activation must be one of 'relu', 'step', 'sigmoid', 'abs', 'square'; got {activation!r}")
    u = _activation(activation)
    for k in range(kmax + 1):
        norm = math.sqrt(math.factorial(k))

        def integrand(g, k=k, norm=norm):
            return float(u(np.asarray(g - t))) * float(hermite_he(k, g)) / norm * float(gaussian_pdf(g))

        with warnings.catch_warnings():  # round-off notices near the requested 1e-12
            warnings.simplefilter("ignore", integrate.IntegrationWarning)
            lo = integrate.quad(integrand, -np.inf, t, epsabs=1e-14, epsrel=1e-12, limit=200)[0]
            hi = integrate.quad(integrand, t, np.inf, epsabs=1e-14, epsrel=1e-12, limit=200)[0]
        out[k] = lo + hi
    return out


# ---- data access: samples or queries --------------------------------------------------------
