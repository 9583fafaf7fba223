"""Stages shared by the papers' pipelines; each is written once and only stages call the
compiled core.

======================  ===================================================================
``moments``             streaming, mergeable Hermite moments over C++ kernels
``tensor``              span, projection, Jennrich, CP-ALS (small dense tensors)
``patterns``            candidate sign patterns (C++ enumeration, streaming with progress)
``refine``              exact refinement of approximate rows (BJW19 Alg. 5, C++)
``fit``                 output layer, residual certificate, Gauss-Newton polish
``diagnostics``         Gaussianity, numerical rank, whitening, refinement subset
``highs``               LP sessions on HiGHS (the only importer of highspy)
``robust_pca``          principal component pursuit (sparse + low-rank split)
``reduce``              reductions of partial sums: local, MPI, dask
======================  ===================================================================
"""

from . import diagnostics, fit, highs, moments, patterns, reduce, refine, robust_pca, tensor

__all__ = ["moments", "tensor", "patterns", "refine", "fit", "diagnostics", "highs", "robust_pca", "reduce"]
