"""The protocol every method runs under (relufast's own): units-free rescaling, the row
space of X, whitening for Gaussian-model methods, breakdowns as ``failed`` results, the
constant-output case, and the settling of every result against all samples
(:func:`settle`). :func:`recovery_method` puts it around a method's public function, so a
direct call and a call through :func:`relufast.recover` behave the same."""

from __future__ import annotations

import contextlib
import warnings
from typing import NamedTuple

import numpy as np

from ._result import RelufastWarning, Run, Status, warn

__all__ = [
    "recovery_method",
    "settle",
    "call_method",
    "accepted_options",
    "check_options",
    "COMMON_OPTIONS",
    "OFFSET_MODELS",
]


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
    """What the protocol needs of every sample's outputs: whether Y is constant (or zero),
    ||Y||_F, and the residual of predicting the mean of Y (:class:`_OutputFigures`, one pass
    over Y). For in-memory samples the figures are computed when first asked for, and
    cheaper where they can be: Y is not constant when its first rows are not, and ||Y||_F
    is one dot product a block (at n = 1e6, m = 20 the full pass cost 0.14 s, as much as
    the method). Samples on MPI ranks or in dask arrays take the full pass at once."""

    HEAD_ROWS = 4096

    def __init__(self, samples):
        self._samples, self.n = samples, samples.n
        # Ranks (the same collectives on each) and dask arrays (checked lazily, so this pass
        # is where NaN in Y is found) take the full pass at once.
        self._full = _OutputFigures(samples) if samples.distributed or samples.lazy else None
        self._norm = None if self._full is None else self._full.norm
        self._head_rows = None

    def _head(self):
        """The first HEAD_ROWS outputs (read once, for both the constant test and the scale)."""
        if self._head_rows is None:
            _, head = self._samples.take(np.arange(min(self.n, self.HEAD_ROWS)))
            self._head_rows = np.asarray(head)
        return self._head_rows

    def _figures(self):
        if self._full is None:
            self._full = _OutputFigures(self._samples)
        return self._full

    def _varies_in_head(self):
        head = self._head()
        return bool(len(head) > 1 and np.any(head != head[:1]))

    @property
    def constant(self):
        return False if self._full is None and self._varies_in_head() else self._figures().constant

    @property
    def zero(self):
        return self._figures().zero

    @property
    def mean_residual(self):
        return self._figures().mean_residual

    @property
    def norm(self):
        if self._norm is None:
            self._norm = self._fast_norm()
        return self._norm

    def _fast_norm(self):
        """||Y||_F as the square root of one dot product per block (scaled by a power of two
        from the first rows); the full pass when that is not finite (NaN in Y: its error)."""
        from .stages.fit import max_abs, power_of_two_scale

        samples = self._samples
        top = max_abs(self._head())
        scale = power_of_two_scale(top) if np.isfinite(top) and top > 0 else 1.0
        total = 0.0
        with np.errstate(over="ignore", invalid="ignore"):
            for _, Yb in samples.blocks(bounded=True):
                Yb = np.ascontiguousarray(Yb, dtype=np.float64).ravel()
                if scale != 1.0:
                    Yb = Yb * scale
                total += float(np.dot(Yb, Yb))
        if not np.isfinite(total):
            return self._figures().norm
        return float(np.sqrt(total)) / scale


class _OutputFigures:
    """Figures of every sample's outputs from one pass over Y (no temporaries of the size
    of Y; reduced over MPI ranks): whether Y is constant (or zero), ||Y||_F, and how much
    predicting the mean of Y explains. Raises the ``ValueError`` of non-finite outputs."""

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
        y_norm=lambda: outputs.norm,
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


#: Options every registered method takes (:func:`recovery_method` adds ``time_limit`` where the
#: method has no stage loop of its own that needs it: the protocol's deadline stops it).
COMMON_OPTIONS = ("random_state", "n_jobs", "tol", "time_limit")


def accepted_options(function):
    """Names of the keyword options of a method function (None when it takes ``**kwargs``)."""
    import inspect

    params = list(inspect.signature(function).parameters.values())[3:]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    # Names starting with "_" are the package's own switches, not options for users.
    return [
        p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and not p.name.startswith("_")
    ]


def check_options(name, valid, options, *, listing="its options are"):
    """``TypeError`` naming the unknown options (with the closest valid name) of method ``name``."""
    import difflib

    if valid is None:
        return
    unknown = [o for o in options if o not in valid]
    if unknown:
        hints = []
        for o in unknown:
            close = difflib.get_close_matches(o, valid, n=1)
            hints.append(f"{o!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise TypeError(f"method {name!r} got unknown option(s) {', '.join(hints)}; {listing} " + ", ".join(valid))


class Protocol(NamedTuple):
    """How :func:`recovery_method` treats a method (read by :class:`relufast.methods.MethodSpec`)."""

    name: str
    #: X and Y rescaled by powers of two, X restricted to its row space, results settled
    #: against every sample. False where the model fixes the units of X (GP19's threshold t).
    units_free: bool
    #: In-memory inputs whitened first (methods whose model is x ~ N(0, I)).
    whiten: bool
    #: The user-facing options, the common ones included.
    options: tuple


def _stopped(name, exc, time_limit):
    """The ``failed`` result of a method the deadline stopped."""
    run = Run(name)
    run.diag.update(stopped_by="time_limit", time_limit=float(time_limit))
    where = getattr(exc, "where", "in a C++ kernel")
    return run.result(
        Status.FAILED,
        f"{name}: stopped by time_limit = {time_limit:g} s (it passed {where}); no network was certified in "
        "that time: raise time_limit, or give fewer samples",
    )


def recovery_method(name, *, whiten=False, units_free=True, own_time_limit=False):
    """Decorator for a public method function: the one protocol every registered method runs
    under, so a direct call and a call through :func:`relufast.recover` give the same result.

    - The options are checked (an unknown one is a ``TypeError`` naming the closest valid
      one). ``time_limit`` (seconds) is taken by every method: the protocol sets a deadline
      (:mod:`relufast._deadline`) that every stage checks and every C++ kernel honours, and a
      method it stops returns ``failed`` with ``diagnostics["stopped_by"] = "time_limit"``
      (``own_time_limit``: the method handles ``time_limit`` itself, returning what it found).
    - ``units_free``: X and Y are rescaled by exact powers of two (:mod:`relufast._units`)
      before the method runs and its parameters are mapped back. When X spans a proper
      subspace of R^d (an input null space), the method runs on X in coordinates of its row
      space and V is mapped back as the minimum-norm representative
      (:mod:`relufast.subspace`; an exact fit then is ``non_identifiable``); the result is
      settled against every sample (:func:`settle`).
    - ``whiten`` (methods whose model is x ~ N(0, I), ATV21): in-memory inputs of any mean and
      covariance are whitened first and the parameters mapped back
      (:func:`relufast._units.whiten_inputs`).
    - A numerical breakdown inside the method (numpy or scipy ``LinAlgError``) returns a
      ``failed`` result naming the cause instead of raising.
    - A result that is not exact carries notes on what may have caused it
      (:func:`relufast._causes.causes`: float32 data, a nonzero input mean, the rank of Y).
    - The method's :class:`RelufastWarning` s are issued once each, the final one with those
      notes, and listed in ``diagnostics["warnings"]``.
    """
    import functools

    def wrap(function):
        own = accepted_options(function)
        valid = None if own is None else own + [o for o in ("time_limit",) if o not in own]
        passes_time_limit = own is not None and "time_limit" in own

        @functools.wraps(function)
        def method(X, Y, n_hidden, **options):
            from ._blas import single_threaded_blas, thread_budget
            from ._deadline import check_time_limit, limit

            check_options(name, valid, options)
            time_limit = check_time_limit(options.get("time_limit"))
            call = options if passes_time_limit else {o: v for o, v in options.items() if o != "time_limit"}
            with (
                warnings.catch_warnings(record=True) as caught,
                single_threaded_blas(),
                thread_budget(options.get("n_jobs")),
            ):
                # NumPy single-threaded throughout (relufast._blas): woken BLAS workers would
                # keep spinning beside the C++ kernels that follow. The few products large
                # enough to use every core lift it (relufast._blas.blas_threads).
                warnings.simplefilter("always", RelufastWarning)
                try:
                    with contextlib.nullcontext() if own_time_limit else limit(time_limit, _comm(options)):
                        if units_free:
                            res = _units_free_call(name, function, whiten, X, Y, n_hidden, call, options)
                        else:
                            res = call_method(name, function, X, Y, n_hidden, call)
                except TimeoutError as exc:  # the deadline stopped a stage or a kernel
                    if time_limit is None or own_time_limit:
                        raise
                    res = _stopped(name, exc, time_limit)
            return _finish(res, caught, X, Y, n_hidden, options)

        method.protocol = Protocol(name, units_free, whiten, tuple(valid or ()))  # type: ignore[attr-defined]
        return method

    return wrap


def _comm(options):
    """The caller's MPI communicator, when it is one (the method names a wrong one)."""
    comm = options.get("comm")
    return comm if comm is not None and hasattr(comm, "allgather") else None


def _units_free_call(name, function, whiten, X, Y, n_hidden, call, options):
    from ._units import map_back, rescale, restrict_to_row_space, unwhiten, whiten_inputs

    samples = _samples_of(X, Y, options)
    outputs = None if samples is None else _Outputs(samples)
    Xs, Ys, opts, scale = rescale(X, Y, call)
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


def _finish(res, caught, X, Y, n_hidden, options):
    """The cause notes on a result that is not exact, and the method's warnings issued once
    each (the method's final message replaced by the full one) and listed in diagnostics."""
    import dataclasses

    from ._causes import causes

    method_message, method_status = res.message, res.status
    notes = causes(res, X, Y, n_hidden, options) if options.get("comm") is None else []
    if notes:
        res = dataclasses.replace(res, message=res.message.rstrip(". ") + ". " + ". ".join(notes))
    texts = tuple(dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, RelufastWarning)))
    for w in caught:
        if not issubclass(w.category, RelufastWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if texts:
        res = dataclasses.replace(res, diagnostics=dict(res.diagnostics, warnings=texts))
    for t in texts:
        if t != method_message:
            warn(t)
    if method_message in texts or res.status != method_status:
        warn(res.message)
    return res
