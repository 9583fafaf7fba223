"""The result of a recovery: :class:`RecoveryResult` (returned by every method in
``relufast.METHODS``, by ``recover`` and by ``extract`` with one hidden layer; ``extract``
with several returns a ``DeepResult`` and the ``mr19`` functions their own result types),
its :class:`Status`, :class:`RelufastWarning` and the :class:`Run` a method builds it with."""

from __future__ import annotations

import time
import types
import warnings
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Optional

import numpy as np
from numpy.typing import ArrayLike

from ._deadline import check as check_deadline
from .network import Network

__all__ = ["RecoveryResult", "Status", "RelufastWarning", "Run", "DOCS_URL"]

#: Where relufast's documentation pages live (messages name a page there, not a local path).
DOCS_URL = "https://github.com/relufast/relufast/blob/main/docs"


class RelufastWarning(UserWarning):
    """Degenerate data, non-convergence or an unmet assumption; the result's status says which."""


class Status(str, Enum):
    """Outcome of a recovery. Compares equal to its string value."""

    EXACT = "exact"  #: every row certified and the fit residual at machine precision
    APPROXIMATE = "approximate"  #: an estimate; the data are not exactly realizable (noise)
    FAILED = "failed"  #: the method could not certify k rows; the estimate is unreliable
    RANK_DEFICIENT = "rank_deficient"  #: the outputs have rank < n_hidden
    INSUFFICIENT_SAMPLES = "insufficient_samples"  #: too few samples for the method
    UNSUPPORTED = "unsupported"  #: the data's shape is outside what the method handles
    NON_IDENTIFIABLE = "non_identifiable"  #: the data do not determine the network

    def __str__(self):
        return self.value


def _freeze(mapping):
    return types.MappingProxyType(dict(mapping or {}))


def _plain(value):
    """Read-only mappings (at any depth) as dicts, for pickling."""
    if isinstance(value, (dict, types.MappingProxyType)):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_plain(v) for v in value)
    return value


def _rebuild_result(values):
    return RecoveryResult(**values)


@dataclass(frozen=True)
class RecoveryResult:
    """Recovered two-layer network ``y = U relu(V x + b) + c`` with status and certificate.

    Attributes
    ----------
    U : ndarray of shape (n_outputs, n_hidden) or None
        Output layer. Columns carry the scale of the hidden units.
    V : ndarray of shape (n_hidden, n_features) or None
        Hidden layer with unit-norm rows.
    status : Status
        One of :class:`Status`: ``exact``, ``approximate``, ``failed``, ``rank_deficient``,
        ``insufficient_samples``, ``unsupported``, ``non_identifiable``.
    message : str
        What happened, and what to try when it did not work.
    method : str
        Name of the method in the registry of :func:`relufast.recover`.
    exact : bool
        True only when the network is identified by the data (every row certified by the
        method's exact step) and the relative residual of the fit over all samples is at
        most the tolerance. Never true for a result with non-finite parameters.
    residual : float
        Relative residual ``||Y - f(X V^T + b) U^T - c||_F / ||Y||_F`` over all samples.
    seconds : mapping
        Wall time per stage.
    counts : mapping
        Sizes and counts (samples used, candidates tried, rows certified, ...).
    diagnostics : mapping
        Method-specific figures (per-row certificates, singular values, gaps, ...).
    activation : Activation or None
        The rectified activation of the model (None: ReLU).
    b : ndarray of shape (n_hidden,) or None
        Hidden biases (zeros for methods whose model has none).
    c : ndarray of shape (n_outputs,) or None
        Output offset (zeros for methods whose model has none).
    precision : str
        Precision at which the certificate holds: ``"float64"``, or ``"float32"`` (etc.)
        when the outputs were known only to that precision; the thresholds then derive
        from its rounding floor (:mod:`relufast.stages.precision`).
    undetermined_units : tuple of int
        Hidden units (indices into the rows of V) that the samples cannot determine: never
        active on the samples, a contribution to the outputs below the certificate's
        tolerance (a zero output column, constant outputs), active samples that span fewer
        than d dimensions, or (models with an output offset) active on every sample. A
        result with such units is never ``exact`` (status ``non_identifiable``; the reasons
        are in ``diagnostics["undetermined_reasons"]``).
    """

    U: Optional[np.ndarray]
    V: Optional[np.ndarray]
    status: Status
    message: str
    method: str
    exact: bool = False
    residual: float = float("nan")
    seconds: Mapping[str, float] = field(default_factory=dict)
    counts: Mapping[str, int] = field(default_factory=dict)
    diagnostics: Mapping[str, Any] = field(default_factory=dict)
    activation: Any = None  #: the rectified activation (None means ReLU)
    b: Optional[np.ndarray] = None
    c: Optional[np.ndarray] = None
    precision: str = "float64"
    undetermined_units: tuple = ()

    def __reduce__(self):
        # The read-only mappings (types.MappingProxyType) do not pickle: pickle the fields
        # with plain dicts and rebuild (frozen again) on loading.
        return (_rebuild_result, ({f.name: _plain(getattr(self, f.name)) for f in fields(self)},))

    def __post_init__(self):
        object.__setattr__(self, "status", Status(self.status))
        object.__setattr__(self, "undetermined_units", tuple(int(i) for i in self.undetermined_units))
        object.__setattr__(self, "seconds", _freeze(self.seconds))
        object.__setattr__(self, "counts", _freeze(self.counts))
        object.__setattr__(self, "diagnostics", _freeze(self.diagnostics))
        if self.U is not None and self.V is not None:
            net = Network(self.U, self.V, self.b, self.c)
            for name in ("U", "V", "b", "c"):
                object.__setattr__(self, name, getattr(net, name))
        else:
            for name in ("U", "V", "b", "c"):
                a = getattr(self, name)
                if a is not None:
                    a = np.array(a, dtype=np.float64, copy=True)
                    a.setflags(write=False)
                    object.__setattr__(self, name, a)
        if self.exact and not self.has_finite_parameters:
            raise ValueError("an exact result must have finite parameters")

    @property
    def has_finite_parameters(self) -> bool:
        """True when U and V exist and every parameter is finite."""
        return (
            self.U is not None
            and self.V is not None
            and all(np.all(np.isfinite(getattr(self, a))) for a in ("U", "V", "b", "c"))
        )

    @property
    def network(self) -> Optional[Network]:
        """The recovered :class:`relufast.network.Network` (None without parameters)."""
        if self.U is None or self.V is None:
            return None
        return Network(self.U, self.V, self.b, self.c, self.activation)

    @property
    def success(self) -> bool:
        """True for ``exact`` and ``approximate`` results with finite parameters (an
        approximate two-layer fit with a NaN residual is ``failed``: :func:`settle`)."""
        return self.status in (Status.EXACT, Status.APPROXIMATE) and self.has_finite_parameters

    @property
    def n_hidden(self) -> Optional[int]:
        return None if self.V is None else self.V.shape[0]

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Network output ``f(X V^T + b) U^T + c`` for inputs X of shape (n_samples, n_features)."""
        net = self.network
        if net is None:
            raise ValueError(f"this result has no parameters (status {self.status.value})")
        return net.predict(X)

    def to_torch(self, *, dtype: Any = None) -> Any:
        """The network as ``torch.nn.Sequential(Linear, ReLU, Linear)`` (needs torch)."""
        from .bridges import to_torch

        return to_torch(self, dtype=dtype)

    def to_sklearn(self) -> Any:
        """The network as a scikit-learn ``MLPRegressor`` with its weights set (needs scikit-learn)."""
        from .bridges import to_sklearn

        return to_sklearn(self)

    def __repr__(self) -> str:
        net = self.network
        shape = "" if net is None else f", U{net.U.shape}, V{net.V.shape}"
        if net is not None and net.has_bias:
            shape += ", with biases"
        return (
            f"RecoveryResult(method={self.method!r}, status={self.status.value!r}, "
            f"exact={self.exact}, residual={self.residual:.3g}{shape})"
        )


def warn(message: str, stacklevel: Optional[int] = None) -> None:
    """Issue a RelufastWarning attributed to the first caller outside the relufast package."""
    if stacklevel is None:
        import os
        import sys

        pkg = os.path.dirname(os.path.abspath(__file__))
        frame: Optional[types.FrameType] = sys._getframe(1)
        stacklevel = 2
        while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(pkg):
            frame, stacklevel = frame.f_back, stacklevel + 1
    warnings.warn(message, RelufastWarning, stacklevel=stacklevel)


class Run:
    """Bookkeeping shared by every method: stage timings, counts, diagnostics and the
    :class:`RecoveryResult` the run ends with (warning the user unless told otherwise)."""

    def __init__(self, method, **counts):
        self.method = method
        self.t_start = time.perf_counter()
        self.seconds = {}
        self.counts = dict(counts)
        self.diag = {}
        self.precision = "float64"  # set by methods that certify at the outputs' precision
        self.current: str | None = None  # the stage running now (progress reports)
        self.raised_in: str | None = None
        # A count to charge to each stage (the chosen mode's model queries): ``metered[name]``.
        self.meter: Callable[[], int] | None = None
        self.metered: dict[str, int] = {}

    @contextmanager
    def stage(self, name):
        """Times the stage ``name`` (``seconds[name]``); a ``time_limit`` that passed stops the
        method before the stage starts (:mod:`relufast._deadline`)."""
        check_deadline(f"before the stage {name!r}")
        t, outer = time.perf_counter(), self.current
        m0 = self.meter() if self.meter is not None else None
        self.current = name
        try:
            yield
        except BaseException:
            self.raised_in = self.raised_in or name  # the innermost stage an exception left
            raise
        finally:
            self.current = outer
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t
            if m0 is not None and self.meter is not None:
                self.metered[name] = self.metered.get(name, 0) + self.meter() - m0

    def result(
        self,
        status,
        message,
        *,
        U=None,
        V=None,
        b=None,
        c=None,
        exact=False,
        residual=float("nan"),
        activation=None,
        warn_user=None,
    ):
        """The final result; ``warn_user`` defaults to: warn unless the status is exact.

        A result whose parameters are not all finite is never exact or approximate: it is
        turned into ``failed`` here, so no method can report NaN weights as a success.
        """
        self.seconds["total"] = time.perf_counter() - self.t_start
        finite = U is not None and V is not None and all(a is None or np.all(np.isfinite(a)) for a in (U, V, b, c))
        if Status(status) in (Status.EXACT, Status.APPROXIMATE) and not finite:
            status, exact = Status.FAILED, False
            message = f"{message} [the parameters are not finite: no estimate could be formed]"
        if (exact or Status(status) == Status.EXACT) and not np.isfinite(residual):
            # inf/NaN is never a certificate (an overflowed or 0/0 residual).
            status, exact = Status.FAILED, False
            message = f"{message} [the residual is not finite: not a certificate]"
        res = RecoveryResult(
            U=U,
            V=V,
            b=b,
            c=c,
            status=status,
            message=message,
            method=self.method,
            exact=exact,
            residual=residual,
            seconds=self.seconds,
            counts=self.counts,
            diagnostics=self.diag,
            activation=activation,
            precision=self.precision,
        )
        if (Status(status) != Status.EXACT) if warn_user is None else warn_user:
            warn(message)
        return res
