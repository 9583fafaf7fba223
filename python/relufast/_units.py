"""Units-free recovery: exact power-of-two rescaling of X and Y around a method.

X and Y are divided by powers of two chosen so that their root-mean-square entries are near
1; the method runs on the rescaled data and its parameters are mapped back. Powers of two make
the scaling exact, so data in any units give the same certified network.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = [
    "rescale",
    "map_back",
    "restrict_to_row_space",
    "rms_exponent",
    "plain_array",
    "file_backed",
    "whiten_inputs",
    "unwhiten",
    "UNIT_SLACK",
]

#: Arrays whose root-mean-square entry is within 2^+-UNIT_SLACK of 1 are used as given (no
#: rescaled copy: at n = 1e6, m = 20 the copy of Y alone cost 0.1-0.2 s, as much as the
#: whole certificate pass). Every threshold of the methods is relative, so a factor of at
#: most 256 changes no decision; the rescaling is for data near overflow or underflow.
UNIT_SLACK = 8
#: Rows whose root-mean-square entry sets the power of two (a factor of 2^UNIT_SLACK of slack
#: makes a closer estimate pointless).
RMS_ROWS = 16384


def rms_exponent(A):
    """e with 2^e closest (in log scale) to the root-mean-square entry of the first rows of A."""
    from .stages.fit import max_abs, power_of_two_scale

    head = np.asarray(A[:RMS_ROWS], dtype=np.float64)
    a = max_abs(head)
    if not (np.isfinite(a) and a > 0):
        return 0
    s = power_of_two_scale(a)
    rms = float(np.sqrt(np.mean((head * s) ** 2))) / s
    return int(np.round(np.log2(rms)))


def plain_array(A):
    """A as a float64 ndarray when it is an in-memory numeric array; else None (dask arrays,
    lists of strings, ...: the method's own validation deals with them)."""
    if hasattr(A, "compute") and hasattr(A, "chunks") and not isinstance(A, np.ndarray):
        return None
    try:
        arr = np.asarray(A)
    except Exception:  # noqa: BLE001 - ragged input: the method's validation reports it
        return None
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        return None
    if np.issubdtype(arr.dtype, np.complexfloating) or arr.ndim not in (1, 2) or arr.size == 0:
        return None
    return arr


def _degree(options):
    """Homogeneity degree p of the method's activation (relu: 1), or None if not homogeneous."""
    from .activations import get_activation

    act = get_activation(options.get("activation", "relu"))
    return float(act.degree) if act.homogeneous else None


def _ldexp_keep_precision(A, e):
    """A 2^e, exact, in A's own floating type (a float32 array stays float32, so the methods
    still certify it at its precision); integer arrays become float64."""
    A = np.asarray(A)
    if not np.issubdtype(A.dtype, np.floating):
        A = A.astype(np.float64)
    return np.ldexp(A, e).astype(A.dtype, copy=False)


def file_backed(A):
    """True when A is a NumPy memmap or a view of one (data the caller keeps on disk)."""
    import mmap

    while A is not None:
        if isinstance(A, (np.memmap, mmap.mmap)):
            return True
        A = getattr(A, "base", None)
    return False


def rescale(X, Y, options):
    """Exact power-of-two rescaling of X and Y: returns (X', Y', options', (ex, ey, p)) with
    X' = X 2^-ex, Y' = Y 2^-ey; (0, 0, 1) when nothing is rescaled. An array whose
    root-mean-square entry is within 2^+-UNIT_SLACK of 1 is not rescaled (no copy).

    Out-of-core inputs are used in their own units: MPI runs (each rank holds other samples,
    so there is no common scale without a reduction), dask arrays and memmaps (a rescaled copy
    would put the whole data set in memory, which is what the caller avoided).
    """
    if "comm" in options:
        return X, Y, options, (0, 0, 1.0)
    if file_backed(X) or file_backed(Y):
        return X, Y, options, (0, 0, 1.0)
    Xa, Ya = plain_array(X), plain_array(Y)
    if Xa is None or Ya is None or Xa.ndim != 2:
        return X, Y, options, (0, 0, 1.0)
    if not (np.all(np.isfinite(Xa[:RMS_ROWS])) and np.all(np.isfinite(Ya[:RMS_ROWS]))):
        return X, Y, options, (0, 0, 1.0)
    try:
        p = _degree(options)
    except (TypeError, ValueError):
        return X, Y, options, (0, 0, 1.0)
    ex = rms_exponent(Xa) if p is not None else 0
    ey = rms_exponent(Ya)
    ex, ey = (e if abs(e) > UNIT_SLACK else 0 for e in (ex, ey))
    if ex == 0 and ey == 0:
        return X, Y, options, (0, 0, 1.0)
    Xs = Xa if ex == 0 else _ldexp_keep_precision(Xa, -ex)
    Ys = Ya if ey == 0 else _ldexp_keep_precision(Ya, -ey)
    options = dict(options)
    if options.get("given_M") is not None:  # an approximate left inverse of U: U' = U 2^(p ex - ey)
        options["given_M"] = np.ldexp(np.asarray(options["given_M"], dtype=np.float64), ey - int(p * ex))
    return Xs, Ys, options, (ex, ey, p if p is not None else 1.0)


def map_back(res, scale):
    """Parameters of a result on rescaled data mapped to the caller's units."""
    ex, ey, p = scale
    diag = dict(res.diagnostics)
    diag["units"] = {
        "x_scale": float(np.ldexp(1.0, ex)),
        "y_scale": float(np.ldexp(1.0, ey)),
        "note": "X and Y were divided by these powers of two inside the method; the "
        "parameters are in the caller's units, other diagnostics are not",
    }
    if (ex, ey) == (0, 0):
        return res
    if res.U is None or res.V is None:
        return dataclasses.replace(res, diagnostics=diag)
    U = res.U * (2.0 ** (ey - p * ex))
    b = None if res.b is None else np.ldexp(res.b, ex)
    c = None if res.c is None else np.ldexp(res.c, ey)
    return dataclasses.replace(res, U=U, b=b, c=c, diagnostics=diag)


def restrict_to_row_space(X, n_hidden, options):
    """``(X_r, RowSpace)`` when the in-memory inputs X span a proper subspace of R^d, else
    None (:func:`relufast.subspace.restrict`). Inputs the rescaling leaves in their own units
    (MPI ``comm``, dask arrays, memmaps) are left alone too: rotating them would need a
    reduction or a copy of the whole data set."""
    if "comm" in options or file_backed(X):
        return None
    Xa = plain_array(X)
    if Xa is None or Xa.ndim != 2 or not (np.issubdtype(Xa.dtype, np.floating) or np.issubdtype(Xa.dtype, np.integer)):
        return None
    if Xa.shape[0] < 2 or not np.all(np.isfinite(Xa[:65536])):
        return None  # the method's own validation reports non-finite inputs
    from ._blas import single_threaded_blas
    from .subspace import restrict

    try:
        with single_threaded_blas():  # small SVDs: BLAS threads only contend (relufast._blas)
            out = restrict(Xa, n_hidden)
    except (np.linalg.LinAlgError, ValueError):
        return None
    if out is not None and out[0] is not Xa and not np.all(np.isfinite(out[0])):
        return None  # a rotated copy that overflowed (X itself is the method's to check)
    return out


#: Sample mean and covariance within this many standard errors of (0, I) leave X as given.
WHITEN_Z = 6.0
#: Random rows that screen the whitening decision first for large n and d (see whiten_inputs).
WHITEN_SCREEN_ROWS = 20000
WHITEN_SCREEN_MIN_D = 100


def whiten_inputs(X, options):
    """``(X_w, (mu, W))`` with X_w = (X - mu) W, W = Sigma^-1/2, for the methods whose model
    is x ~ N(0, I) (ATV21): a Gaussian of any mean and covariance becomes standard, as in
    bjw19-gaussian (BJW19 Remark 3). None when X already looks standard (mean and
    covariance within WHITEN_Z standard errors of 0 and I: no copy), when its covariance is
    singular (the row-space restriction runs first), or when X is not a finite numeric
    matrix (the method's own validation speaks).

    Inputs left in place keep their layout (:func:`_whiten_in_place`): the moments are one
    pass over the blocks (summed over the MPI ranks of ``comm``), dask arrays and memmaps
    are whitened lazily block by block (a dask graph), a rank's in-memory rows in memory."""
    if "comm" in options or file_backed(X) or _is_dask(X):
        return _whiten_in_place(X, options.get("comm"))
    Xa = plain_array(X)
    if Xa is None or Xa.ndim != 2 or Xa.shape[0] < 2 * (Xa.shape[1] + 1):
        return None
    if Xa.shape[0] > 4 * WHITEN_SCREEN_ROWS and Xa.shape[1] >= WHITEN_SCREEN_MIN_D:
        # The pass below costs n d^2 (4 s at n = 2e5, d = 784 on one thread). Random rows
        # that already look standard (within WHITEN_Z standard errors of their own count)
        # settle it; the certificate does not depend on the whitening either way.
        rows = np.sort(np.random.default_rng(0).choice(Xa.shape[0], WHITEN_SCREEN_ROWS, replace=False))
        from ._blas import take_rows

        head = _local_moments(take_rows(Xa, rows))  # a gather on the method's threads
        if head is not None:
            n_h, s1_h, s2_h, shift_h = head
            C_h = s2_h / n_h - np.outer(s1_h / n_h, s1_h / n_h)
            if _whitener_from_moments(n_h, shift_h + s1_h / n_h, (C_h + C_h.T) / 2) is None:
                return None
    local = _local_moments(Xa)  # one blocked pass: finiteness, mean, shifted second moments
    if local is None:
        return None
    n, s1, s2, shift = local
    C = s2 / n - np.outer(s1 / n, s1 / n)
    affine = _whitener_from_moments(n, shift + s1 / n, (C + C.T) / 2)
    return (
        None
        if affine is None
        else (np.ascontiguousarray((np.asarray(Xa, dtype=np.float64) - affine[0]) @ affine[1]), affine)
    )


def _is_dask(A):
    from .stages.reduce import is_dask

    return is_dask(A)


def _whitener_from_moments(n, mu, C):
    """(mu, W) from the sample mean and covariance of n inputs, or None when they already
    look standard (within WHITEN_Z standard errors) or C is singular."""
    d = len(mu)
    se = 1.0 / np.sqrt(n)
    if np.max(np.abs(mu)) <= WHITEN_Z * se and np.max(np.abs(C - np.eye(d))) <= WHITEN_Z * np.sqrt(2.0) * se:
        return None
    w, E = np.linalg.eigh(C)
    if not (w[0] > 1e-10 * w[-1] and w[-1] > 0):
        return None
    return mu, (E / np.sqrt(w)) @ E.T


def _local_moments(X):
    """(count, sum, shifted second moments, shift) of this process's rows of X, one block
    at a time (float64 sums; the shift, the first row, keeps a large mean from cancelling),
    or None when X is not a finite numeric matrix."""
    from .stages.reduce import BLOCK_ROWS, row_blocks

    if getattr(X, "ndim", None) != 2 or getattr(X, "dtype", None) is None:
        return None
    if not np.issubdtype(X.dtype, np.number) or np.issubdtype(X.dtype, np.complexfloating):
        return None
    n, d = int(X.shape[0]), int(X.shape[1])
    if n == 0 or d == 0:
        return (0, np.zeros(d), np.zeros((d, d)), None)
    if _is_dask(X):
        blocks = (Xb for Xb, _ in row_blocks(X, np.zeros((n, 1))))
    else:
        blocks = (X[s : s + BLOCK_ROWS] for s in range(0, n, BLOCK_ROWS))
    shift, s1, s2 = None, np.zeros(d), np.zeros((d, d))
    for Xb in blocks:
        Xb = np.asarray(Xb, dtype=np.float64)
        if shift is None:
            shift = Xb[0].copy()
        part = _shifted_sums(Xb, shift)
        if part is None:
            return None
        s1 += part[0]
        s2 += part[1]
    return (n, s1, s2, shift)


def _shifted_sums(Xb, shift):
    """``(sum of z, sum of z z^T)`` over the rows z = x - shift of Xb, or None when Xb holds a
    non-finite entry; by sub-blocks of rows on the method's threads, summed in block order
    (the sub-blocks depend on the shape only). One thread took 0.3-0.5 s for the finiteness
    test, the shifted copy and the products of 20,000 x 784 inputs."""
    from ._blas import MATMUL_ROWS, add_in_order, thread_map

    d = Xb.shape[1]
    rows = max(MATMUL_ROWS, -(-(1 << 24) // max(d * d, 1)))

    def sums(a):
        Z = Xb[a : a + rows] - shift
        if not np.all(np.isfinite(Z)):  # (x - shift is finite exactly when x is, for finite shift)
            return None
        return Z.sum(axis=0), Z.T @ Z

    if not np.all(np.isfinite(shift)):
        return None
    parts = thread_map(sums, range(0, len(Xb), rows))
    return None if any(p is None for p in parts) else add_in_order(parts)


def _whiten_in_place(X, comm):
    """:func:`whiten_inputs` for inputs left where they live: MPI ranks (moments summed over
    the ranks in rank order, so every rank gets the same whitener and takes the same
    decision), dask arrays and memmaps (whitened lazily through dask; None without dask)."""
    from .stages.reduce import check_comm

    try:
        comm = check_comm(comm)
    except (TypeError, ValueError):
        return None  # the method names what comm should be
    try:
        local = _local_moments(X)
    except Exception:  # noqa: BLE001 - exotic input: the method's validation reports it
        local = None
    if local is not None and local[3] is not None and comm is not None:
        local = (local[0], local[1] + local[0] * local[3], local[2], local[3])  # raw sums for the merge
    parts = [local] if comm is None else list(comm.allgather(local))
    if any(p is None for p in parts):
        return None
    n = sum(p[0] for p in parts)
    d = len(parts[0][1])
    if n < 2 * (d + 1):
        return None
    if comm is None:
        count, s1, s2, shift = parts[0]
        mu = shift + s1 / n
        C = s2 / n - np.outer(s1 / n, s1 / n)
    else:
        mu = sum(p[1] for p in parts) / n  # sums of raw rows, in rank order
        C = np.zeros((d, d))
        for c, s1, s2, shift in parts:  # each rank's shifted moments, moved to mu
            if c:
                dm = shift - mu
                C += s2 + np.outer(dm, s1 - c * shift) + np.outer(s1 - c * shift, dm) + c * np.outer(dm, dm)
        C /= n
    affine = _whitener_from_moments(n, mu, (C + C.T) / 2)
    if affine is None:
        return None
    mu, W = affine
    if _is_dask(X) or file_backed(X):
        try:
            import dask.array as da
        except ImportError:
            from ._result import warn

            warn(
                "X is not standard Gaussian (mean and covariance off (0, I)) and should be whitened, but "
                f"{'a memmap' if file_backed(X) else 'this array'} is whitened in place through dask, which is "
                "not installed: the method runs on X as given (pip install 'relufast[dask]', or pass X "
                "as an in-memory array)"
            )
            return None
        from .stages.reduce import BLOCK_ROWS

        Xd = X if _is_dask(X) else da.from_array(X, chunks=(BLOCK_ROWS, -1))
        return (Xd.astype(np.float64) - mu) @ W, affine
    return np.ascontiguousarray((np.asarray(X, dtype=np.float64) - mu) @ W), affine


def unwhiten(res, affine):
    """Parameters found on whitened inputs z = W (x - mu) as parameters on x:
    ``V z + b = (V W) x + (b - V W mu)``, rows renormalised (U takes their norms)."""
    if affine is None or res.V is None or res.U is None:
        return res
    mu, W = affine
    V = res.V @ W
    b = (np.zeros(V.shape[0]) if res.b is None else res.b) - V @ mu
    s = np.linalg.norm(V, axis=1)
    s = np.where(s > 0, s, 1.0)
    diag = dict(res.diagnostics)
    diag["whitened"] = {"mean": mu, "whitener": W, "note": "the method ran on (X - mean) @ whitener"}
    return dataclasses.replace(res, U=res.U * s[None, :], V=V / s[:, None], b=b / s, diagnostics=diag)
