"""The queried model: batched calls, the query count, the budget and the output precision.

Every stage talks to the model through :class:`Oracle`; one call of the oracle is one call
of the model on a batch of inputs. Step sizes and zero tests of the chosen-query stages
follow from :attr:`Oracle.eps`, the unit roundoff of the model's outputs (float32 models:
``2^-24``), through the helpers below, never from fixed float64 constants.
"""

from __future__ import annotations

import threading

import numpy as np

from .._deadline import check as check_deadline
from ..stages.precision import Precision, resolve_precision

__all__ = ["Oracle", "BudgetSpent"]


class BudgetSpent(Exception):
    """Raised by :class:`Oracle` when a call would exceed ``max_queries``."""


class Oracle:
    """Counting wrapper of a query function ``f: (n, d) -> (n, m)``.

    Every answer must have the number of outputs and the dtype of the first one: a model
    whose answers change shape or dtype between calls is not a function the extraction can
    read (the network and its certificate would describe only some of the calls), and the
    call raises ``ValueError`` naming both.

    Parameters
    ----------
    f : callable
        Takes float64 arrays of shape (n, d); returns (n, m) or (n,) arrays of any float dtype.
    n_features : int
    max_queries : int or None
        Budget: a call that would exceed it raises :class:`BudgetSpent` before querying.
    dtype_name : str or None
        Output dtype when known in advance (torch modules); else read from the first answer.
    precision : None, str or float
        Overrides the precision read from the outputs.
    batch_size : int or None
        Most rows a single call of the model gets: a larger request is answered by several
        calls (None: one call).
    on_answer : callable or None
        Called with the oracle after every answered request (progress reports).
    max_queries_low : int or None
        The budget that replaces ``max_queries`` once the first answer shows low-precision
        outputs (float32 searches cost several times the queries of float64 ones).

    A ``time_limit`` set around the extraction (:func:`relufast._deadline.limit`) is checked
    before every request: once it has passed, the request raises
    :class:`relufast._deadline.TimeLimitReached` without querying.
    """

    def __init__(
        self,
        f,
        n_features,
        max_queries=None,
        dtype_name=None,
        precision=None,
        batch_size=None,
        on_answer=None,
        max_queries_low=None,
    ):
        self.f = f
        self.max_queries_low = max_queries_low
        self.batch_size = batch_size
        self.on_answer = on_answer
        self.d = int(n_features)
        self.max_queries = max_queries
        self.n_queries = 0
        self.n_calls = 0
        self._dtype = dtype_name
        self._precision_arg = precision
        self.precision: Precision | None = None
        self.n_outputs: int | None = None
        self.answer_dtype: str | None = None
        #: Half-length (t, standard normal directions) of the deeper layers' search lines
        #: (:func:`.deep._refill` halves it where the model stops answering far out).
        self.line_reach = np.inf
        # One call of the model at a time, whichever thread asks (stages that run pieces
        # side by side share the oracle; the model need not be thread-safe).
        self._lock = threading.Lock()

    def __call__(self, X, *, finite=True):
        """The model's outputs on the rows of X, as float64 of shape (n, m).

        Parameters
        ----------
        X : array-like of shape (n, d)
        finite : bool, default=True
            Raise ``FloatingPointError`` on a non-finite output; with False they are
            returned (the certificate judges them, at scales where the model may overflow).
        """
        X = np.ascontiguousarray(X, dtype=np.float64).reshape(-1, self.d)
        if len(X) == 0 and self.n_outputs is not None:
            return np.empty((0, self.n_outputs))
        with self._lock:
            if self.max_queries is not None and self.n_queries + len(X) > self.max_queries:
                raise BudgetSpent(f"max_queries={self.max_queries} spent ({self.n_queries} used, {len(X)} more asked)")
            check_deadline(f"after {self.n_queries} queries")
            step = len(X) if not self.batch_size or len(X) <= self.batch_size else self.batch_size
            parts = [self._answer(X[s : s + step], finite) for s in range(0, max(len(X), 1), max(step, 1))]
            if self.on_answer is not None:
                self.on_answer(self)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _answer(self, X, finite):
        """One call of the model."""
        self.n_queries += len(X)
        self.n_calls += 1
        Y = np.asarray(self.f(X))
        if self.precision is None:
            name = self._dtype or Y.dtype.name
            probe = np.empty(0, dtype=name if name in ("float32", "float16") else np.float64)
            self.precision = resolve_precision(probe, self._precision_arg)
            if self.low_precision and self.max_queries_low is not None:
                self.max_queries = self.max_queries_low
        got = Y.dtype.name
        if Y.size % max(len(X), 1):
            raise ValueError(
                f"the model answered {len(X)} queries with an array of shape {Y.shape}; expected "
                f"{len(X)} rows of outputs"
            )
        Y = Y.astype(np.float64, copy=False).reshape(len(X), -1)
        if self.n_outputs is None:
            self.n_outputs, self.answer_dtype = Y.shape[1], got
        elif Y.shape[1] != self.n_outputs or got != self.answer_dtype:
            raise ValueError(
                f"the model's outputs changed between calls: expected {self.n_outputs} output(s) of "
                f"dtype {self.answer_dtype} (its first answer), got {Y.shape[1]} of dtype {got} at "
                f"call {self.n_calls}; chosen queries need a fixed function (n, d) -> (n, m)"
            )
        if finite and not np.all(np.isfinite(Y)):
            raise FloatingPointError("the model returned non-finite outputs")
        return Y

    @property
    def eps(self) -> float:
        """Unit roundoff of the outputs (float64 until the first answer)."""
        return 2.0**-53 if self.precision is None else self.precision.eps

    @property
    def low_precision(self) -> bool:
        """Whether the outputs round above LOW_PRECISION (float32 and coarser): the
        low-precision rules of the search (thresholds from the lines' own rounding, affine
        normals, anchored first-layer rows, ...) apply."""
        return self.eps > LOW_PRECISION

    # Derived step sizes and tolerances (all relative to the scale of the inputs, ~1).
    def zero_factor(self) -> float:
        """Rounding noise of an output value, relative to the largest output on a line."""
        return NOISE_FACTOR * self.eps

    def fd_fraction(self) -> float:
        """Finite-difference step as a fraction of the safe distance from a critical point:
        small enough to stay in the linear region (float64), large enough for the rounding
        of the outputs (float32: ``eps^(1/4)``)."""
        return float(np.clip(self.eps**0.25, 1e-3, 0.05))

    def normal_tol(self) -> float:
        """Error allowed on a measured normal: finite differences at :meth:`fd_fraction`
        reach ~1e-10 in float64; in float32 the affine least-squares pass of
        :mod:`.hyperplanes` brings them to ~1e-5 and the cap NORMAL_TOL_CAP applies."""
        return float(min(NORMAL_TOL_CAP, max(1e-6, 1e4 * self.eps / self.fd_fraction())))

    def window(self) -> float:
        """Half-width unit of the windows that test a kink at a predicted place: above the
        position error of hyperplanes from finite differences at this precision."""
        return float(max(1e-3, 2.0 * self.eps ** (1.0 / 3.0)))


#: Unit roundoff above which the outputs count as low precision (:attr:`Oracle.low_precision`).
LOW_PRECISION = 1e-10
#: Rounding noise of the outputs on a line: NOISE_FACTOR * eps * max |output| (deep float32
#: forward passes round to a few eps * sqrt(width); 256 leaves a margin for widths up to ~1000).
NOISE_FACTOR = 256.0
#: Largest error allowed on a normal (float32): the affine least-squares normals reach
#: ~1e-5 (1e-4 for units with a small jump); a looser tolerance links kinks of other units
#: (measured on 10-6-4-1 and 10-8-6-1 float32: 1e-3 and 2e-2 extract fewer than 5e-3).
NORMAL_TOL_CAP = 5e-3
