"""Awasthi, Tang, Vijayaraghavan: depth-2 networks with general ReLU activations (biases).

References
----------
.. [1] P. Awasthi, A. Tang, A. Vijayaraghavan. Efficient algorithms for learning depth-2
   neural networks with general ReLU activations. Advances in Neural Information
   Processing Systems 34 (NeurIPS 2021). arXiv:2107.10209.

Model: ``Y = relu(X V^T + b) U^T + c`` with x ~ N(0, I_d), V (k, d) with unit rows, hidden
biases b (k,), output layer U (m, k) and offset c (m,); any m >= 1 (Y may be 1-D). The
paper writes one output ``f(x) = sum_i a_i relu(<w_i, x> + b_i)``; with m outputs relufast
runs the paper on a random combination ``y g`` of the outputs (``a = U^T g``) and fits
``(U, c)`` for all outputs by least squares at the end.

Functions and the paper
-----------------------
``atv21``
    Theorem 3.1: Algorithm 6 (robust Algorithm 4 with l = 1, then Algorithm 3). The span
    of V from T_2; T_0..T_4 in that k-dimensional span (C++ kernel); Jennrich on the
    flattenings of T_3 and T_4; Algorithm 2 (RecoverScalars) from T_2 and T_3;
    Algorithm 3 (FixSigns) from T_1; c from T_0. Then relufast's activation-region
    refinement (:func:`relufast.stages.refine.region_refine`, not in the paper) makes the
    estimate exact on noiseless data, certified by the residual over all samples.
``hermite_coefficient``
    Lemma 3.5: ``c_r(b)`` with ``E[relu(w.x + b) He_r(x)] = c_r(b) w^(x r)``.
``population_tensors``
    The exact coefficient tensors ``f_r`` of a network (for tests and studies).
``recover_from_tensors``
    Algorithms 4 (l = 1) + 2 + 3 on given tensors (dense, any dimension).

Departures from the paper (``docs/atv21.md``): the two Jennrich calls on T_3 and T_4 are
one call on the pencil of both (their third modes concatenated, each scaled by its
estimated noise), which sees every unit since He_1 and He_2 have no common root and
needs no rank thresholds; Algorithms 1-3 are reconstructed from the appendix; the
refinement step is relufast's own.
"""

from __future__ import annotations

from .general import atv21_general, fit_network, recover_general_from_tensors
from .pipeline import atv21, start_size
from .tensors import hermite_coefficient, population_tensors, recover_from_tensors

__all__ = [
    "atv21",
    "atv21_general",
    "hermite_coefficient",
    "population_tensors",
    "recover_from_tensors",
    "recover_general_from_tensors",
    "fit_network",
    "start_size",
    "CITATION",
]

CITATION = (
    "P. Awasthi, A. Tang, A. Vijayaraghavan. Efficient algorithms for learning depth-2 neural "
    "networks with general ReLU activations. NeurIPS 2021 (arXiv:2107.10209)."
)
