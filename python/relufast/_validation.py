"""Input validation shared by every public entry point (validate once, at the facade)."""

from __future__ import annotations

import numbers
import os

import numpy as np

__all__ = [
    "check_problem",
    "as_float_matrix",
    "check_xy",
    "check_n_hidden",
    "check_random_state",
    "resolve_n_jobs",
    "check_positive_int",
    "check_scalar",
    "NonFiniteOutputs",
]


class NonFiniteOutputs(ValueError):
    """A model answered some queries with NaN or inf (:func:`relufast.extraction.check_outputs`)."""


#: Rows per block of the finiteness check (bounded temporaries: no n x d mask).
FINITE_BLOCK_ROWS = 1 << 15


def count_nonfinite(arr):
    """NaN or infinite entries of a 2-D array, counted one row block at a time."""
    bad = 0
    for s in range(0, arr.shape[0], FINITE_BLOCK_ROWS):
        blk = arr[s : s + FINITE_BLOCK_ROWS]
        bad += int(blk.size - np.count_nonzero(np.isfinite(blk)))
    return bad


def as_float_matrix(a, name, *, allow_1d=False, check_finite=True):
    """Return ``a`` as a float64 C-contiguous 2-D array (1-D becomes one column if allowed).

    Integer and boolean arrays are converted; non-numeric input raises TypeError, NaN/inf
    and wrong dimensionality raise ValueError. A float64 C-contiguous array (or memmap) is
    returned without a copy. Finiteness is checked block by block (no mask of the size of
    the data, so a memmap is read in place); ``check_finite=False`` leaves it to the caller.
    """
    if hasattr(a, "compute") and hasattr(a, "chunks") and not isinstance(a, np.ndarray):
        raise TypeError(
            f"{name} is a lazy array ({type(a).__name__}); this entry point needs an in-memory "
            "array: call .compute() first, or use a method that reduces dask arrays block by "
            "block (bjw19-gaussian, bjw19-noisy, bjw19-ica, bjw19-fpt, gklw19)"
        )
    arr = np.asarray(a)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.bool_)):
        raise TypeError(f"{name} must be a numeric array; got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.complexfloating):
        raise TypeError(f"{name} must be real-valued; got dtype {arr.dtype}")
    if arr.ndim == 1 and allow_1d:
        arr = arr.reshape(-1, 1)
    if arr.ndim != 2:
        expected = "a 1-D or 2-D array" if allow_1d else "a 2-D array of shape (n_samples, n_features)"
        raise ValueError(f"{name} must be {expected}; got an array with shape {arr.shape}")
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    bad = count_nonfinite(arr) if check_finite else 0
    if bad:
        raise ValueError(f"{name} must contain only finite values; found {bad} NaN or infinite entries")
    return arr


def check_xy(X, Y):
    """Validate inputs X (n, d) and outputs Y (n, m) or (n,); returns float64 C-contiguous arrays."""
    X = as_float_matrix(X, "X")
    Y = as_float_matrix(Y, "Y", allow_1d=True)
    if X.shape[0] != Y.shape[0]:
        raise ValueError(
            f"X and Y must have the same number of samples (rows); got X with {X.shape[0]} rows and Y with {Y.shape[0]}"
        )
    if X.shape[1] == 0 or Y.shape[1] == 0:
        raise ValueError(f"X and Y must have at least one column; got shapes {X.shape} and {Y.shape}")
    return X, Y


class InsufficientSamples(ValueError):
    """A method needs more samples than it was given (a ValueError: direct callers see the
    method's message; ``method="auto"`` reports the status ``insufficient_samples`` when
    every applicable method says so)."""


def check_positive_int(value, name, *, minimum=1):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= {minimum}; got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value}")
    return int(value)


def check_scalar(value, name, *, kind=float, low=None, high=None, include_low=True, include_high=True):
    """A finite number of type ``kind`` (float accepts any real number, int only integers; never
    a bool) within ``[low, high]`` (bounds left out when ``include_low`` / ``include_high`` is
    False). Returns it as ``kind``; ``TypeError`` for a wrong type, ``ValueError`` for a value
    out of range, each naming what was expected and what was got."""
    lo = "" if low is None else ("[" if include_low else "(") + f"{low:g}"
    hi = "" if high is None else f"{high:g}" + ("]" if include_high else ")")
    interval = f" in {lo or '(-inf'}, {hi or 'inf)'}" if (low is not None or high is not None) else ""
    expected = f"{name} must be {'an integer' if kind is int else 'a number'}{interval}"
    base = numbers.Integral if kind is int else numbers.Real
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, base):
        raise TypeError(f"{expected}; got {type(value).__name__} {value!r}")
    if not np.isfinite(float(value)):
        raise ValueError(f"{expected}; got {value!r}")
    bad_low = low is not None and (value < low if include_low else value <= low)
    bad_high = high is not None and (value > high if include_high else value >= high)
    if bad_low or bad_high:
        raise ValueError(f"{expected}; got {value!r}")
    return kind(value)


def check_n_hidden(n_hidden, d):
    """The number of hidden units k: an integer with 1 <= k <= d (rank V = k needs k <= d)."""
    k = check_positive_int(n_hidden, "n_hidden")
    if k > d:
        raise ValueError(
            f"n_hidden must be at most the input dimension d = {d} (the rows of V must be "
            f"linearly independent); got n_hidden = {k}"
        )
    return k


def check_random_state(random_state):
    """None, an int seed, or a numpy Generator / SeedSequence -> numpy Generator."""
    if isinstance(random_state, np.random.Generator):
        return random_state
    if random_state is None or isinstance(random_state, (numbers.Integral, np.random.SeedSequence)):
        # numbers.Integral (np.int64, ...) is a valid seed; numpy's stubs name only int.
        return np.random.default_rng(random_state)  # type: ignore[arg-type]
    raise TypeError(
        "random_state must be None, an int, a numpy SeedSequence or a numpy Generator; "
        f"got {type(random_state).__name__}"
    )


def resolve_n_jobs(n_jobs):
    """Threads for the C++ kernels: None or -1 means all cores, a positive int that many.

    This is relufast's one meaning of ``n_jobs``, the same in every method and stage. It
    differs from scikit-learn, where None means one job: relufast's kernels are its own
    threads (NumPy's BLAS stays single-threaded inside the pipelines), so all cores is the
    default. Returns the value the C++ kernels take (0 means all hardware threads).
    """
    if n_jobs is None or n_jobs == -1:
        return 0
    if isinstance(n_jobs, (bool, np.bool_)) or not isinstance(n_jobs, numbers.Integral) or n_jobs < 1:
        raise ValueError(f"n_jobs must be None, -1 or a positive integer; got {n_jobs!r}")
    return min(int(n_jobs), 4 * (os.cpu_count() or 1))


def check_problem(X, Y, n_hidden, *, k_at_most_d=True):
    """The common preamble: X (n, d) and Y (n, m) as float64, and k = n_hidden checked.

    Returns (X, Y, n, d, m, k).
    """
    X, Y = check_xy(X, Y)
    n, d = X.shape
    if k_at_most_d:
        k = check_n_hidden(n_hidden, d)
    else:
        k = check_positive_int(n_hidden, "n_hidden")
    return X, Y, n, d, Y.shape[1], k
