"""Stages shared by the papers' pipelines; each is written once and only stages call the
compiled core.

======================  ===================================================================
``moments``             streaming, mergeable Hermite moments over C++ kernels
``tensor``              span, projection, Jennrich, CP-ALS (small dense tensors)
``patterns``            candidate sign patterns (C++ enumeration, streaming with progress)
``refine``              exact refinement of approximate rows (BJW19 Alg. 5, C++) and the
                        activation-region refinement (with or without biases)
``fit``                 output layer, residual certificate, Gauss-Newton polish
``diagnostics``         Gaussianity, numerical rank, whitening, refinement subset
``highs``               LP sessions on HiGHS (the only importer of highspy)
``robust_pca``          principal component pursuit (sparse + low-rank split)
``reduce``              where samples live (NumPy, memmap, dask, MPI) and their reductions
``precision``           thresholds from the precision the outputs are known to
``hermite``             Gaussian density, Hermite polynomials, Hermite coefficients
``levmar``              Levenberg-Marquardt on every parameter of the biased model
``candidates``          CP-ALS candidate rows certified by Alg. 5 and pooled (at size)
``pool``                the pool of certified rows, one per hidden unit
======================  ===================================================================
"""

from . import (
    candidates,
    diagnostics,
    fit,
    hermite,
    highs,
    levmar,
    moments,
    patterns,
    pool,
    precision,
    reduce,
    refine,
    robust_pca,
    tensor,
)

__all__ = [
    "moments",
    "tensor",
    "patterns",
    "refine",
    "fit",
    "diagnostics",
    "highs",
    "robust_pca",
    "reduce",
    "precision",
    "hermite",
    "levmar",
    "candidates",
    "pool",
]
