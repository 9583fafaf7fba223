"""Bakshi, Jayaram, Woodruff: learning two-layer rectified networks in polynomial time.

References
----------
.. [1] A. Bakshi, R. Jayaram, D. P. Woodruff. Learning two layer rectified neural networks
   in polynomial time. Proceedings of the Thirty-Second Conference on Learning Theory
   (COLT 2019), PMLR 99:195-268, 2019.

Functions and the paper
-----------------------
``enumeration``
    Theorem 1: exact recovery for any X when rank(Y) = k. Lemma 1 (candidate sign
    patterns, C++), Algorithm 1 (Iterative LP on HiGHS, ``iterative_lp``) and
    Algorithm 2 (ExactNeuralNet), with the exact support solve where |S| >= d.
``noisy``
    Theorem 10: i.i.d. sub-Gaussian output noise. Tensor estimate, Algorithm 6 (signs by
    projections, ``sign_by_projection``), U by least squares; opt-in ``polish``.
``ica``
    Theorem 4: orthonormal V. Algorithm 3 with relufast's FastICA (``fastica``) and the
    exact refinement of Algorithm 5.
``independent_noise``
    Theorem 13: arbitrary noise independent of X. Algorithm 8 with the halfspace
    estimator of Theorem 12 (``halfspace_estimate``), a ``given_M`` mode and a capped grid.
``sparse_noise``
    Section 8, Theorem 14: sparse gross corruption of the outputs. Principal component
    pursuit, the Gaussian pipeline, then an exact polish on the uncorrupted entries.
``fpt``
    Theorem 11: exact recovery for Gaussian X and rank-deficient U (m < k allowed),
    Algorithm 7 with corrections (pairwise independent columns, m >= 2).
``gaussian``
    Theorem 7: exact recovery for Gaussian inputs, noiseless outputs, rank-k U and V.
    Algorithm 4 (tensor estimate of V up to signs) followed by Algorithm 5 (exact
    recovery of signs and values from sparsity patterns), then U by least squares.
    Departures from the paper (``docs/bjw19.md`` lists them with their tests):

    * Alg. 4, step 3 uses the third-order score tensor, which is zero for ReLU
      (E[relu(z) He_3(z)] = 0). relufast uses the second-order moment with
      the output mode kept, an m x d x d tensor decomposed by Jennrich's algorithm (needs
      m >= k), polished by CP-ALS, with candidates pooled over random contractions.
    * Alg. 5, step 2 thresholds at tau = 1/poly(l); relufast uses the margin form (only
      coordinates where the estimate is confidently negative), which tolerates angle
      errors of ~0.3 rad and certifies each row.
    * Alg. 5, step 3 multiplies w in R^k by A (m rows); relufast uses an orthonormal
      k-row basis of the output span.

Modules: ``gaussian``, ``enumeration``, ``fpt``, ``noisy``, ``sparse_noise``, ``ica``,
``independent_noise`` (one per theorem).
"""

from ...stages.fit import polish
from .enumeration import enumeration, iterative_lp
from .fpt import fpt
from .gaussian import gaussian
from .ica import fastica, ica
from .independent_noise import halfspace_estimate, independent_noise
from .noisy import noisy, sign_by_projection
from .sparse_noise import sparse_noise

CITATION = (
    "A. Bakshi, R. Jayaram, D. P. Woodruff. Learning two layer rectified neural networks in "
    "polynomial time. COLT 2019, PMLR 99:195-268."
)

__all__ = [
    "gaussian",
    "enumeration",
    "fpt",
    "noisy",
    "sparse_noise",
    "ica",
    "independent_noise",
    "fastica",
    "halfspace_estimate",
    "iterative_lp",
    "sign_by_projection",
    "polish",
    "CITATION",
]
