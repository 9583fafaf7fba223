"""Chosen-query extraction of deep ReLU networks (``relufast.extract(..., queries="chosen")``).

Stages, each written once: critical points on lines (:mod:`.lines`), the hyperplane of a
critical point from the jump of the local linear map (:mod:`.hyperplanes`), the first layer
(:mod:`.first_layer`), the deeper layers peeled with the earlier ones known (:mod:`.deep`,
:mod:`.cluster`),
signs, output layer, exact polish and certificate (:mod:`.fit`, its probes in :mod:`.probes`), all driven by
:func:`extract_chosen` (:mod:`.driver`); :class:`DeepResult` holds several hidden layers.
"""

from .driver import extract_chosen
from .result import DeepResult

__all__ = ["extract_chosen", "DeepResult"]
