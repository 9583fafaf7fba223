"""Goel and Panigrahy: the lowest layer of a deep network under high-threshold activations.

References
----------
.. [1] S. Goel, R. Panigrahy. Recovering the lowest layer of deep networks with high
   threshold activations. arXiv:1903.09231, 2019.

Model (samples are rows): ``f(x) = P(u(W x - t))`` with ``x ~ N(0, I_n)``, hidden weights W
(d, n) with unit rows, one known threshold t, an activation u (ReLU, the 0/1 step the paper
writes as sgn, sigmoid) and a polynomial P of the hidden units (multilinear in Sec. 2 of
the paper) whose linear coefficients are positive. relufast returns W as ``V`` with unit
rows; the result's ``U``, ``b``, ``c`` give only the one-hidden-layer part ``f_lin`` of f
(P's higher terms are not recovered).

Functions and the paper
-----------------------
``hermite_coeffs``
    App. A.1/A.3: the normalised Hermite coefficients of ``u(a - t)`` (closed forms for
    ReLU and step, quadrature otherwise).
``lowest_layer`` (``method="gp19"``)
    Step 1 (Sec. 2.1, App. B.1-B.4): ``landscape="tpm"`` (default) is the whitened
    fourth-order tensor power method, the change of variables of the paper's proof of
    Claim 1 (its minimisers are those of the landscape G); ``"one-by-one"`` minimises the
    paper's G(z) with deflation; ``"simultaneous"`` minimises G(B) of App. B.4 (Thm 11/12)
    with the corrected psi. Step 2 (Sec. 2.2): ``refine="paper"`` is Algorithm 1
    (RefineEstimate) with Algorithm 2 (EstimateTanAlpha); ``refine="stein"`` is a faster
    Stein-direction update that is NOT in the paper. With ``f=callable`` instead of data,
    the method draws its own Gaussian queries (the paper's oracle access).
``halfspaces`` (``method="gp19-halfspaces"``)
    Sec. 2.3, Thm 6: intersections (and unions) of halfspaces far from the origin.
``correlation_graph_supports`` (``method="gp19-support"``)
    Sec. 4, Algorithm 3 (ConstructCorrelationGraph), Thm 8.
``even_activation`` (``method="gp19-even"``)
    Sec. 4, Thm 10: even activations, orthonormal W, by deflated projected ascent of
    ``s_4 E[f h_4(z.x)]``.

Statistics of order 4 are streamed by the C++ kernel of
:class:`relufast.stages.moments.Hermite4Accumulator` (contractions with the current
directions, active-row filtering). Every pass over the samples goes through
:class:`relufast.stages.reduce.Samples`, so the methods take ``comm=`` (MPI ranks), memmaps
and dask arrays; Step 1 and Thm 10 use :func:`relufast.stages.tensor.power_iteration` with a
streamed operator. See ``docs/gp19.md`` for the paper's errata relufast corrects and for
the scale-out.
"""

from __future__ import annotations

from ...metrics import row_angles
from .coefficients import hermite_coeffs
from .pipeline import lowest_layer
from .step2 import estimate_tan_alpha, refine_estimate
from .variants import correlation_graph_supports, even_activation, halfspaces

CITATION = (
    "S. Goel, R. Panigrahy. Recovering the lowest layer of deep networks with high threshold "
    "activations. arXiv:1903.09231, 2019."
)

__all__ = [
    "CITATION",
    "hermite_coeffs",
    "lowest_layer",
    "halfspaces",
    "correlation_graph_supports",
    "even_activation",
    "estimate_tan_alpha",
    "refine_estimate",
    "row_angles",
]
