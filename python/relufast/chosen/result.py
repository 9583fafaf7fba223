"""The result of a chosen-query extraction of a network with several hidden layers."""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .._result import Status

__all__ = ["DeepResult"]


@dataclass(frozen=True)
class DeepResult:
    """An extracted ReLU network ``y = W_{L+1} relu(... relu(W_1 x + b_1) ...) + b_{L+1}``.

    Attributes
    ----------
    layers : list of (W, b)
        Every layer, the output layer last; W of shape (n_out, n_in). Hidden rows have unit
        norm (a network is identified up to permutation and positive scaling of the units
        of each hidden layer); None when nothing could be extracted.
    status : Status
    message : str
    method : str
        ``"chosen"``.
    exact : bool
        True only when the network reproduces the model to the precision of its outputs on
        every probe of the certificate (:mod:`relufast.chosen.probes`: scales 1 to 1e4 and
        beyond, both sides of every extracted boundary, wedges between nearly parallel ones).
    residual : float
        The largest relative error over the certificate's probes (each relative to the
        outputs' scale at its probe's scale).
    seconds, counts, diagnostics : mapping
        Per-stage wall time; ``counts["queries"]`` (and model calls); certificate figures
        (``diagnostics["certificate_errors"]`` by kind of probe, ``["certificate_scales"]``
        by scale, ``["certificate_queries"]`` against ``["extraction_queries"]``) and the
        queries asked in each stage of ``seconds`` (``diagnostics["queries_by_stage"]``).
    precision : str
        Precision at which the certificate holds (``"float32"`` for float32 models).
    undetermined_units : tuple of (layer, unit)
        Units no query showed (1-based hidden layer, 0-based unit), returned never active
        and read by nothing: the function is certified without them
        (``diagnostics["undetermined_units"]`` counts them).
    """

    layers: Any
    status: Status
    message: str
    method: str = "chosen"
    exact: bool = False
    residual: float = float("nan")
    seconds: Mapping[str, float] = field(default_factory=dict)
    counts: Mapping[str, int] = field(default_factory=dict)
    diagnostics: Mapping[str, Any] = field(default_factory=dict)
    precision: str = "float64"
    undetermined_units: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "status", Status(self.status))
        for name in ("seconds", "counts", "diagnostics"):
            object.__setattr__(self, name, types.MappingProxyType(dict(getattr(self, name) or {})))
        if self.layers is not None:
            frozen = []
            for W, b in self.layers:
                W, b = np.array(W, dtype=np.float64), np.array(b, dtype=np.float64)
                W.setflags(write=False)
                b.setflags(write=False)
                frozen.append((W, b))
            object.__setattr__(self, "layers", frozen)

    @property
    def n_hidden(self) -> tuple:
        """Widths of the hidden layers."""
        return () if self.layers is None else tuple(W.shape[0] for W, _ in self.layers[:-1])

    @property
    def success(self) -> bool:
        return self.status in (Status.EXACT, Status.APPROXIMATE) and self.layers is not None

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Network outputs of shape (n_samples, n_outputs)."""
        if self.layers is None:
            raise ValueError(f"this result has no parameters (status {self.status.value})")
        H = np.asarray(X, dtype=np.float64)
        for W, b in self.layers[:-1]:
            H = np.maximum(H @ W.T + b, 0.0)
        W, b = self.layers[-1]
        return H @ W.T + b

    def __repr__(self) -> str:
        shape = "" if self.layers is None else f", widths {self.n_hidden}"
        return (
            f"DeepResult(method={self.method!r}, status={self.status.value!r}, exact={self.exact}, "
            f"residual={self.residual:.3g}{shape})"
        )
