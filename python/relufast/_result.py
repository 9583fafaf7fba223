"""The result object every relufast entry point returns."""

from __future__ import annotations

import time
import types
import warnings
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Optional

import numpy as np
from numpy.typing import ArrayLike

from .network import Network

__all__ = ["RecoveryResult", "Status", "RelufastWarning", "Run", "recovery_method"]


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

    @contextmanager
    def stage(self, name):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t

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


def _agreed_seed(function, options):
    """Options with ``random_state=None`` replaced, under an MPI ``comm``, by rank 0's fresh
    seed: every rank must draw the same random numbers, or the ranks take different paths and
    wait for each other in different collectives. Other options are returned unchanged (an
    invalid comm is left to the method's own check, which names what was expected)."""
    comm = options.get("comm")
    if comm is None or not hasattr(comm, "allgather") or options.get("random_state") is not None:
        return options
    import inspect

    try:
        params = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return options
    if "random_state" not in params:
        return options
    seed = int(np.random.SeedSequence().generate_state(1, np.uint64)[0])
    return {**options, "random_state": int(comm.allgather(seed)[0])}


def call_method(name, function, X, Y, n_hidden, options):
    """``function(X, Y, n_hidden, **options)``, with a numerical breakdown inside it (numpy or
    scipy ``LinAlgError``) returned as a ``failed`` result naming the cause. Under an MPI
    ``comm`` an unset ``random_state`` becomes one seed agreed by every rank."""
    options = _agreed_seed(function, options)
    try:
        return function(X, Y, n_hidden, **options)
    except np.linalg.LinAlgError as exc:
        return Run(name).result(
            Status.FAILED,
            f"{name}: a linear-algebra step broke down ({exc}); the data are numerically "
            "degenerate for this method (collinear or constant inputs, or outputs of extreme "
            "dynamic range)",
        )


#: Methods whose model has hidden biases and an output offset c.
OFFSET_MODELS = ("atv21", "atv21-general")


class _Outputs:
    """Figures of every sample's outputs from one pass over Y (no temporaries of the size
    of Y; reduced over MPI ranks): whether Y is constant (or zero), ||Y||_F, and how much
    predicting the mean of Y explains."""

    def __init__(self, samples):
        from .stages.fit import max_abs, power_of_two_scale

        self.n = samples.n
        _, head = samples.take(np.arange(min(samples.n, 4096)))
        top = max_abs(head)
        scale = power_of_two_scale(top) if np.isfinite(top) and top > 0 else 1.0
        m = samples.m
        s1, s2, hi, lo = np.zeros(m), np.zeros(m), np.full(m, -np.inf), np.full(m, np.inf)
        with np.errstate(over="ignore", invalid="ignore"):  # outputs far above the head's scale
            for Xb, Yb in samples.blocks(bounded=True):
                Yb = np.asarray(Yb.compute() if hasattr(Yb, "compute") else Yb)
                if len(Yb) == 0:
                    continue
                if samples.lazy and not np.all(np.isfinite(Xb)):  # dask: no method checked X yet
                    hi = lo = np.full(m, np.nan)
                    break
                Ys = Yb if scale == 1.0 else Yb * scale
                s1 += Ys.sum(axis=0, dtype=np.float64)
                s2 += np.einsum("ij,ij->j", Ys, Ys, dtype=np.float64)
                # np.maximum, not fmax: a NaN must propagate to be seen
                hi, lo = np.maximum(hi, Ys.max(axis=0)), np.minimum(lo, Ys.min(axis=0))
                if not (np.all(np.isfinite(hi)) and np.all(np.isfinite(lo))):
                    hi = lo = np.full(m, np.nan)  # NaN or inf in Y
                    break
        bad = 0
        if not (np.all(np.isfinite(hi)) and np.all(np.isfinite(lo))):  # count them for the message
            bad = sum(
                _count_nonfinite(Yb) + (_count_nonfinite(Xb) if samples.lazy else 0)
                for Xb, Yb in samples.blocks(bounded=True)
            )
        if samples.distributed:
            parts = samples.allgather((s1, s2, hi, lo, bad))
            s1, s2 = sum(p[0] for p in parts), sum(p[1] for p in parts)
            hi = np.max([p[2] for p in parts], axis=0)
            lo = np.min([p[3] for p in parts], axis=0)
            bad = sum(p[4] for p in parts)
        if bad:
            where = " over all ranks" if samples.distributed else ""
            raise ValueError(f"X and Y must contain only finite values; found {bad} NaN or infinite entries{where}")
        self.constant = bool(np.all(hi == lo))
        self.zero = self.constant and not np.any(hi)
        sy = float(np.sum(s2))
        centred = float(np.sum(np.maximum(s2 - s1**2 / max(self.n, 1), 0.0)))
        self.norm = float(np.sqrt(sy)) / scale  # ||Y||_F
        #: relative residual of predicting the mean of Y: ||Y - mean(Y)||_F / ||Y||_F
        self.mean_residual = float(np.sqrt(centred / sy)) if sy > 0 else float("nan")


def _count_nonfinite(A):
    return int(np.count_nonzero(~np.isfinite(np.asarray(A))))


def _samples_of(X, Y, options):
    """The caller's samples as a :class:`relufast.stages.reduce.Samples`, in place (no
    float64 copy of float32 arrays or memmaps: every check converts one block at a time),
    or None when the method's own validation must speak (the ranks agree on which)."""
    from .stages.reduce import Samples, check_comm, is_dask

    try:
        comm = check_comm(options.get("comm"))
    except (TypeError, ValueError):
        return None

    def local():
        Xa = X if is_dask(X) else np.asarray(X)
        Ya = Y if is_dask(Y) else np.asarray(Y)
        if Ya.ndim == 1:
            Ya = Ya[:, None]
        for A in (Xa, Ya):
            dt = A.dtype
            if A.ndim != 2 or not np.issubdtype(dt, np.number) or np.issubdtype(dt, np.complexfloating):
                return None
        return (Xa, Ya) if Xa.shape[0] == Ya.shape[0] and min(Xa.shape[1], Ya.shape[1]) > 0 else None

    try:
        arrays = local()
    except Exception:  # noqa: BLE001 - ragged or exotic input: the method's validation reports it
        arrays = None
    shape = (-1, -1, -1) if arrays is None else (int(arrays[0].shape[0]), *(int(a.shape[1]) for a in arrays))
    shapes = [shape] if comm is None else [tuple(s) for s in comm.allgather(shape)]
    counts = [s[0] for s in shapes]
    if min(counts) < 0 or sum(counts) == 0 or len({s[1:] for s in shapes}) > 1:
        return None  # the method names what is wrong, on every rank
    return Samples(arrays[0], arrays[1], comm=comm, counts=counts)


def _constant_outputs(name, samples, outputs, n_hidden):
    """The result for constant outputs: no hidden unit is visible in them."""
    from ._validation import check_positive_int

    k = check_positive_int(n_hidden, "n_hidden")
    run = Run(name)
    run.diag["undetermined_reasons"] = {i: "the outputs are constant" for i in range(k)}
    res = run.result(
        Status.NON_IDENTIFIABLE,
        f"{name}: the outputs are {'all zero' if outputs.zero else 'constant'} over all {samples.n} samples, "
        "so no hidden unit is "
        "visible in them: every network whose units are inactive (or have zero output weights) "
        "fits, and none is determined",
    )
    return _replace(res, undetermined_units=tuple(range(k)))


def _replace(res, **changes):
    import dataclasses

    return dataclasses.replace(res, **changes)


def _useful(res, outputs):
    """An approximate fit must explain more than predicting the mean of Y; NaN never counts."""
    if res.status != Status.APPROXIMATE:
        return res
    r, base = res.residual, outputs.mean_residual
    if np.isfinite(r) and not (np.isfinite(base) and r >= base):
        return res
    why = (
        "its relative residual is not finite"
        if not np.isfinite(r)
        else f"its relative residual {r:.3g} is no better than predicting the mean of Y ({base:.3g})"
    )
    message = f"{res.message} [not a useful fit: {why}]"
    warn(message)
    return _replace(res, status=Status.FAILED, exact=False, message=message)


def _undetermined(name, res, samples, outputs, options):
    """Units the samples cannot determine (:func:`relufast.units.undetermined_units`) in a
    fit that is exact (or non_identifiable): listed in the result, never ``exact``."""
    if res.status not in (Status.EXACT, Status.NON_IDENTIFIABLE) or not res.has_finite_parameters:
        return res
    if res.activation is not None and not getattr(res.activation, "homogeneous", False):
        return res
    from .stages.precision import resolve_precision
    from .units import undetermined_message, undetermined_units

    k, d = res.V.shape
    tol = options.get("tol", 1e-10)
    tol = tol if isinstance(tol, (int, float)) and not isinstance(tol, bool) and tol > 0 else 1e-10
    try:
        prec = resolve_precision(samples.Y if res.precision == "float64" else res.precision, options.get("precision"))
    except (TypeError, ValueError):
        prec = resolve_precision(None)
    check = undetermined_units(
        samples,
        res.U,
        res.V,
        res.b,
        res.c,
        y_norm=outputs.norm,
        threshold=max(prec.tol(tol, d, k), float(res.residual) if np.isfinite(res.residual) else 0.0),
        intercept=name in OFFSET_MODELS,
        input_rank=res.diagnostics.get("input_rank"),
        rank_tol=prec.tol(1e-10, d, k),
    )
    if not check.units:
        return res
    diag = dict(res.diagnostics, undetermined_reasons=check.reasons)
    message = f"{res.message}. {undetermined_message(check)}"
    out = _replace(
        res,
        status=Status.NON_IDENTIFIABLE,
        exact=False,
        message=message,
        diagnostics=diag,
        undetermined_units=tuple(sorted(set(res.undetermined_units) | set(check.units))),
    )
    warn(message)
    return out


def settle(name, res, samples, outputs, options, *, span_checked):
    """What every method's result must satisfy against all samples, wherever they live
    (NumPy, memmap, dask, MPI ranks): the input null space (:func:`relufast.subspace.identify`,
    unless the method ran on the row space of X already), units the samples cannot determine
    (never ``exact``), and an approximate fit that explains more than the mean of Y."""
    from .subspace import identify

    if samples is None:
        return res
    tol = None
    if res.precision != "float64" and res.V is not None:  # what float32 outputs cannot see
        from .stages.diagnostics import INPUT_RANK_TOL
        from .stages.precision import resolve_precision

        tol = resolve_precision(None, res.precision).tol(INPUT_RANK_TOL, *reversed(res.V.shape))
    if not span_checked or tol is not None:
        res = identify(res, samples, tol)
    res = _undetermined(name, res, samples, outputs, options)
    return _useful(res, outputs)


def recovery_method(name, *, whiten=False):
    """Decorator for a public method function: units-free, run on the row space of X,
    settled against every sample (:func:`settle`), and never a raw ``LinAlgError``.

    X and Y are rescaled by exact powers of two (:mod:`relufast._units`) before the method
    runs and its parameters are mapped back. When X spans a proper subspace of R^d (an input
    null space), the method runs on X in coordinates of its row space and V is mapped back as
    the minimum-norm representative (:mod:`relufast.subspace`; an exact fit then is
    ``non_identifiable``). ``whiten`` (methods whose model is x ~ N(0, I), ATV21): in-memory
    inputs of any mean and covariance are whitened first and the parameters mapped back
    (:func:`relufast._units.whiten_inputs`). A numerical breakdown inside the method (numpy
    or scipy ``LinAlgError``) returns a ``failed`` result naming the cause instead of raising.
    """
    import functools

    def wrap(function):
        @functools.wraps(function)
        def method(X, Y, n_hidden, **options):
            from ._units import map_back, rescale, restrict_to_row_space, unwhiten, whiten_inputs

            samples = _samples_of(X, Y, options)
            outputs = None if samples is None else _Outputs(samples)
            Xs, Ys, opts, scale = rescale(X, Y, options)
            restricted = restrict_to_row_space(Xs, n_hidden, opts)
            Xr = Xs if restricted is None else restricted[0]
            affine = whiten_inputs(Xr, opts) if whiten else None
            res = call_method(name, function, Xr if affine is None else affine[0], Ys, n_hidden, opts)
            res = unwhiten(res, None if affine is None else affine[1])
            if restricted is not None:
                from .subspace import extend

                res = extend(res, restricted[1])
            res = map_back(res, scale)
            if outputs is not None and outputs.constant:  # after the method checked its options
                return _constant_outputs(name, samples, outputs, n_hidden)
            return settle(name, res, samples, outputs, options, span_checked=restricted is not None)

        method.rescales_units = True  # type: ignore[attr-defined]
        return method

    return wrap
