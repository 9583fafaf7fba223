"""Diagnostics stage: what the data allow, measured once for every method.

Gaussianity of the inputs, numerical rank of the outputs, whitening of N(0, Sigma) inputs
(BJW19 Remark 3), the refinement subset, and the refusals shared by several methods.
"""

from __future__ import annotations

import numpy as np

from .._blas import add_in_order, blas_threads, crossprod, matmul, thread_map
from .._result import warn
from .._validation import check_positive_int

__all__ = [
    "RANK_TOL",
    "RANK_FLOOR",
    "output_singular_values",
    "rank_shortfall",
    "GAUSS_ROWS",
    "gaussianity",
    "numerical_rank",
    "whitener",
    "refinement_subset",
    "outputs_below_hidden_message",
    "input_whitening",
    "warn_if_not_gaussian",
    "BIAS_Z",
    "bias_evidence",
    "INPUT_RANK_TOL",
    "input_null_space",
]


#: Rank test for the outputs: sigma_k / sigma_1 below this means rank(Y) < k.
RANK_TOL = 1e-8


#: Rows used for the Gaussianity diagnostic.
GAUSS_ROWS = 20000


def gaussianity(X, W=None):
    """Cheap test of x ~ N(0, I) (of ``W x`` when a whitener W is given): second-moment
    matrix and per-coordinate kurtosis on at most GAUSS_ROWS samples."""
    Xs = X[: min(X.shape[0], GAUSS_ROWS)]
    if W is not None:
        Xs = matmul(Xs, W)
    N, d = Xs.shape
    C = crossprod(Xs, Xs) / N
    # The 2-norm of the symmetric C - I: its largest eigenvalue in absolute value (an SVD of
    # a d x d matrix costs about three times more, on one core).
    with blas_threads(4 * d**3):
        ev = np.linalg.eigvalsh(C - np.eye(d))
    cov_dev = float(max(abs(ev[0]), abs(ev[-1])))
    cov_tol = 3.0 * (2.0 * np.sqrt(d / N) + d / N) + 0.05
    # Standardised excess kurtosis per coordinate (sd sqrt(96/N) under N(0,1) with unit variance).
    m2, m4 = _power_means(Xs)
    kurt = m4 - 3.0 * m2**2
    z = kurt / np.sqrt(96.0 / N)
    kurt_stat = float(np.mean(z**2))
    kurt_tol = 1.0 + 8.0 * np.sqrt(2.0 / d) + 2.0
    ok = cov_dev <= cov_tol and kurt_stat <= kurt_tol
    return {
        "gaussian_ok": bool(ok),
        "second_moment_deviation": cov_dev,
        "second_moment_tolerance": float(cov_tol),
        "kurtosis_statistic": kurt_stat,
        "kurtosis_tolerance": float(kurt_tol),
    }


#: Rows a block of :func:`_power_means` at least (blocks from the shape only).
POWER_BLOCK_ROWS = 2048


def _power_means(Xs):
    """Column means of ``Xs**2`` and ``Xs**4``, summed over blocks of rows on the method's
    threads (in block order: the same bits on any number of threads). Not ``Xs**4``:
    ``np.power`` with exponent 4 calls pow() per element."""
    N = Xs.shape[0]

    def sums(a):
        X2 = Xs[a : a + POWER_BLOCK_ROWS] ** 2
        return X2.sum(axis=0), (X2 * X2).sum(axis=0)

    s2, s4 = add_in_order(thread_map(sums, range(0, N, POWER_BLOCK_ROWS)) if N else [(0.0, 0.0)])
    return s2 / max(N, 1), s4 / max(N, 1)


def refinement_subset(X, Y, k, n_refine, rng, minimum=1):
    """The l samples used by the exact refinement (default ``min(n, max(1000, 25 d, 100 k))``),
    drawn at random without replacement. Returns (X_l, Y_l)."""
    n, d = X.shape
    if n_refine is None:
        ell = min(n, max(1000, 25 * d, 100 * k))
    else:
        ell = min(n, check_positive_int(n_refine, "n_refine", minimum=minimum))
    idx = np.sort(rng.choice(n, size=ell, replace=False)) if ell < n else np.arange(n)
    return np.ascontiguousarray(X[idx]), np.ascontiguousarray(Y[idx])


def numerical_rank(singular_values, tol=RANK_TOL):
    """Number of singular values above ``tol`` times the largest (0 for a zero matrix)."""
    sv = np.asarray(singular_values)
    if sv.size == 0 or not sv[0] > 0:
        return 0
    return int(np.sum(sv > tol * sv[0]))


def whitener(X):
    """``E[x x^T]^{-1/2}`` estimated on all rows of X (BJW19 Remark 3). X may be a
    :class:`relufast.stages.reduce.Samples` (summed over its blocks and ranks).

    Returns (W, condition): W symmetric (d, d), condition = sqrt(lambda_max / lambda_min);
    ``(None, inf)`` when the second-moment matrix is singular (the inputs lie in a subspace).
    """
    from .reduce import Samples

    if isinstance(X, Samples):
        st = X.map_reduce(lambda Xb, Yb: {"count": float(Xb.shape[0]), "xx": Xb.T @ Xb})
        C = st["xx"] / st["count"]
    else:
        C = X.T @ X / X.shape[0]
    ev, E = np.linalg.eigh(C)
    if not ev.min() > 1e-12 * ev.max():
        return None, float("inf")
    return (E / np.sqrt(ev)) @ E.T, float(np.sqrt(ev.max() / ev.min()))


def input_whitening(X, whiten, diag, probe=None):
    """The whitening decision of the Gaussian pipelines (BJW19 Remark 3).

    Records the Gaussianity diagnostics in ``diag`` and returns the whitener (d, d), None
    (inputs already look like N(0, I), or ``whiten=False``), or False when whitening is
    needed but the second-moment matrix of X is singular. The whitener is estimated on X
    (an array or a :class:`relufast.stages.reduce.Samples`), the Gaussianity checks on
    ``probe`` (default X), an in-memory sample.
    """
    if whiten not in ("auto", True, False):
        raise ValueError(f"whiten must be 'auto', True or False; got {whiten!r}")
    probe = X if probe is None else probe
    diag.update(gaussianity(probe))
    W = None
    if whiten is True or (whiten == "auto" and diag["second_moment_deviation"] > diag["second_moment_tolerance"]):
        W, diag["input_condition"] = whitener(X)
        if W is None:
            diag["whitened"] = False
            return False
        diag.update(gaussianity(probe, W))
    diag["whitened"] = W is not None
    return W


def warn_if_not_gaussian(diag, method, law="N(0, I)"):
    """Warn (RelufastWarning) when the Gaussianity check recorded in ``diag`` failed."""
    if diag["gaussian_ok"]:
        return
    name = "standard Gaussian" if law == "N(0, I)" else f"Gaussian {law}"
    warn(
        f"X does not look like {name} input (second-moment deviation "
        f"{diag['second_moment_deviation']:.3g} vs tolerance {diag['second_moment_tolerance']:.3g}, "
        f"kurtosis statistic {diag['kurtosis_statistic']:.3g} vs {diag['kurtosis_tolerance']:.3g}); "
        f"{method} assumes x ~ {law}. Rows are still certified exactly, so an 'exact' status "
        "remains trustworthy, but the moment step may fail."
    )


#: Rank floor of the outputs: sigma_k / sigma_1 over every sample at or below this (times the
#: precision's floor for float32 outputs) is rounding, and only then does rank(Y) < k hold.
#: Float64 outputs of a network whose U has rank < k give 1e-17..1e-15; a unit with an output
#: column scaled by 1e-9 gives 5e-10, and a certificate at tol = 1e-10 sees it.
RANK_FLOOR = 1e-12


def output_singular_values(Y):
    """Singular values of the outputs over every sample: ``Y`` an array (n, m) or a
    :class:`relufast.stages.reduce.Samples` (the R factors of its blocks, stacked over the
    blocks and the MPI ranks; O(n m^2), no n x n matrix)."""
    from .reduce import Samples

    if not isinstance(Y, Samples):
        return np.linalg.svd(np.asarray(Y, dtype=np.float64), compute_uv=False)
    m = Y.m
    R = np.zeros((0, m))
    for _, Yb in Y.blocks(bounded=True):
        Yb = np.asarray(Yb.compute() if hasattr(Yb, "compute") else Yb, dtype=np.float64)
        if len(Yb):
            R = np.linalg.qr(np.vstack([R, Yb]), mode="r")
    R = np.vstack([r for r in Y.allgather(R)])
    return np.linalg.svd(R, compute_uv=False) if R.size else np.zeros(0)


def rank_shortfall(method, data, k, prec, *, rows, sample_ratio):
    """Why a method saw rank < k on ``rows`` samples of its outputs: a (status, message).

    The rank is checked again over every sample (``data``, an array or
    :class:`relufast.stages.reduce.Samples`) at :data:`RANK_FLOOR`. Below it rank(Y) < k
    holds: ``rank_deficient``. Above it the outputs show k units, one of them too weak or
    too rarely active for the method's sample (``sample_ratio``: its sigma_k / sigma_1, None
    when unknown):
    ``failed``, naming that cause.
    """
    from .._result import Status

    sv = output_singular_values(data)
    n = len(data) if not hasattr(data, "n") else data.n
    d = data.shape[1] if not hasattr(data, "d") else data.d
    rank = numerical_rank(sv, prec.tol(RANK_FLOOR, d, k))
    ratio = float(sv[k - 1] / sv[0]) if len(sv) >= k and sv[0] > 0 else 0.0
    if rank < k:
        return Status.RANK_DEFICIENT, (
            f"the outputs have numerical rank {rank} < n_hidden = {k} over all {n} samples (sigma_k / sigma_1 = "
            f"{ratio:.2e}); {method} needs U of rank k. Check n_hidden, or use bjw19-fpt for rank-deficient U"
        )
    visible = sample_ratio is None or sample_ratio >= RANK_TOL**0.5
    if visible and ratio >= RANK_TOL**0.5:  # every unit shows clearly in Y and in the method's sample
        return Status.FAILED, (
            f"{method}: a rank test on its {rows} estimation samples failed, though rank(Y) = {k} = n_hidden "
            f"over all {n} samples (sigma_k / sigma_1 = {ratio:.2e}): the outputs are too imprecise or the "
            "units too nearly parallel for this method"
        )
    if sample_ratio is None:
        why = f"a unit is too weak or too rarely active on the {rows} samples {method} estimates from"
    elif sample_ratio <= prec.tol(RANK_FLOOR, d, k):
        why = f"a unit is active on too few samples: none of the {rows} samples {method} draws for its moments"
    else:
        why = (
            f"a unit is too weak for {method}: its part of the outputs on its {rows} samples is "
            f"sigma_k / sigma_1 = {sample_ratio:.1e}, below the {RANK_TOL:.0e} its moments resolve"
        )
    return Status.FAILED, (
        f"rank(Y) = {k} = n_hidden over all {n} samples (sigma_k / sigma_1 = {ratio:.2e}), but {why} "
        "(too small an output column, or too rarely active). atv21 recovers such units from Gaussian inputs"
    )


def outputs_below_hidden_message(method, m, k, reason):
    """The message of every method that needs at least as many outputs as hidden units."""
    return (
        f"{method} needs at least as many outputs as hidden units (m >= k): {reason}; "
        f"got m = {m} < k = {k}. For fewer outputs than hidden units use bjw19-fpt "
        "(Alg. 7) or, with Gaussian inputs, atv21."
    )


#: Input directions z with ||X z|| <= INPUT_RANK_TOL * ||X||_2 are in the null space of X
#: (a few hundred ulps: duplicated or zero columns give exact zeros up to rounding).
INPUT_RANK_TOL = 1e-10


def input_null_space(X, *, block=1 << 16):
    """Orthonormal basis (r, d) of the input directions the samples do not see: the null
    space of X (r = 0 when X has rank d). Along them no row of V is determined by the data.

    Cost: an SVD of the first max(4 d, 2000) rows; only when those are rank-deficient, one
    blockwise pass over all rows restricted to the candidate directions (memory
    O(block d + d^2)).
    """
    n, d = X.shape
    head = np.asarray(X[: min(n, max(4 * d, 2000))], dtype=np.float64)
    if _surely_full_rank(head):
        return np.zeros((0, d))
    # All d right singular vectors, without the (rows x rows) left factor when rows >= d.
    with blas_threads(4 * head.shape[0] * d**2 + 8 * d**3):
        _, s, Vt = np.linalg.svd(head, full_matrices=head.shape[0] < d)
    smax = float(s[0]) if s.size else 0.0
    if smax == 0.0:
        if n <= head.shape[0]:
            return np.eye(d)
    elif s.size == d and s[-1] > INPUT_RANK_TOL * smax:
        return np.zeros((0, d))
    r_head = int(np.sum(s > INPUT_RANK_TOL * smax)) if smax > 0 else 0
    N = Vt[r_head:]  # candidates: null space of the first rows
    if n <= head.shape[0]:
        return np.ascontiguousarray(N)
    # M = (X N^T)^T (X N^T) from the products themselves (forming N G N^T instead would square
    # the rounding of G up to eps ||X||^2, far above the threshold); ||X||_2^2 is the largest
    # eigenvalue of G = X^T X (one GEMM per block; a per-block SVD costs several times more).
    M = np.zeros((N.shape[0], N.shape[0]))
    G = np.zeros((d, d))
    for a in range(0, n, block):
        Z = np.asarray(X[a : a + block], dtype=np.float64)
        P = Z @ N.T
        M += P.T @ P
        G += Z.T @ Z
    top = float(np.linalg.eigvalsh(G)[-1])
    ev, E = np.linalg.eigh(M)
    keep = ev <= (INPUT_RANK_TOL**2) * top
    return np.ascontiguousarray((E[:, keep].T) @ N)


#: From this many columns the null-space tests try the Gram matrix's condition estimate first.
GRAM_RANK_MIN_D = 64
#: Estimated 1/cond of the Gram matrix above which the rows surely have full column rank: a
#: singular-value ratio of 1e-4, six orders above INPUT_RANK_TOL.
GRAM_RANK_RCOND = 1e-8


def _surely_full_rank(head):
    """True when LAPACK's condition estimate of ``head^T head`` (its Cholesky factor, ``dpocon``)
    shows the rows span every column direction by a wide margin; False sends the caller to
    the SVD. The Gram matrix is one product on the method's threads and a d x d Cholesky,
    where the SVD of 4 d rows runs mostly on one core (0.39 s of the 2-thread time at
    d = 784 in a profile; 0.04 s this way, ad-hoc, on the 2-core VM)."""
    rows, d = head.shape
    if d < GRAM_RANK_MIN_D or rows < d or not np.all(np.isfinite(head)):
        return False
    return gram_full_rank(head, GRAM_RANK_RCOND)


def gram_full_rank(M, rcond):
    """True when LAPACK's estimate of 1/cond of ``M^T M`` (``dpocon`` on its Cholesky factor)
    is above ``rcond``: M surely has full column rank (1e-8 is a singular-value ratio of 1e-4).
    False (also when the Cholesky fails) says only "not surely": the caller decides by an SVD.
    NumPy's Cholesky lets go of the GIL, so the tests of many units run side by side on the
    method's threads (SciPy's ``dpotrf`` wrapper holds it: on 16 threads the 128 units of
    (784, 128, 128) were factorised one after another, 1.4 s of a 5.5 s recovery); only the
    O(d^2) estimate holds it."""
    import scipy.linalg.lapack

    G = crossprod(M, M)
    try:
        L = np.linalg.cholesky(G)
    except np.linalg.LinAlgError:
        return False
    est, info = scipy.linalg.lapack.dpocon(L.T, float(np.abs(G).sum(axis=0).max()))
    return bool(info == 0 and est > rcond)


def sample_null_space(samples, tol=None):
    """:func:`input_null_space` for samples wherever they live (a
    :class:`relufast.stages.reduce.Samples`: NumPy, memmap, dask blocks, MPI ranks).

    The candidates come from the SVD of the first max(4 d, 2000) rows of the concatenated
    samples (gathered, identical on every rank); only when those are rank-deficient, one
    blockwise pass over every rank's samples sums ``(X N^T)^T (X N^T)`` and ``X^T X``
    (reduced in rank order, so every rank gets the same bits and the same answer).
    ``tol`` (default :data:`INPUT_RANK_TOL`): directions with ``||X z|| <= tol ||X||_2``
    count as unseen (outputs known to float32 see nothing below their rounding floor).
    """
    tol = INPUT_RANK_TOL if tol is None else float(tol)
    n, d = samples.n, samples.d
    if n == 0:
        return np.eye(d)
    head, _ = samples.take(np.arange(min(n, max(4 * d, 2000))))
    if _surely_full_rank(head):
        return np.zeros((0, d))
    with blas_threads(4 * head.shape[0] * d**2 + 8 * d**3):
        _, s, Vt = np.linalg.svd(head, full_matrices=head.shape[0] < d)
    smax = float(s[0]) if s.size else 0.0
    if smax > 0.0 and s.size == d and s[-1] > tol * smax:
        return np.zeros((0, d))
    if n <= head.shape[0] and tol == INPUT_RANK_TOL:
        return input_null_space(head)
    r_head = int(np.sum(s > tol * smax)) if smax > 0 else 0
    N = np.ascontiguousarray(Vt[r_head:] if smax > 0 else np.eye(d))

    def sums(Xb, _Yb):
        Z = np.asarray(Xb, dtype=np.float64)
        P = Z @ N.T
        return {"M": P.T @ P, "G": Z.T @ Z}

    st = samples.map_reduce(sums)
    top = float(np.linalg.eigvalsh(st["G"])[-1])
    ev, E = np.linalg.eigh(st["M"])
    keep = ev <= (tol**2) * top
    return np.ascontiguousarray((E[:, keep].T) @ N)


#: |z| of the bias statistic above which the outputs are taken to have an offset or biases.
BIAS_Z = 6.0


def bias_evidence(X, Y, W=None):
    """Do the outputs come from a network with hidden biases or an output offset?

    For a bias-free ReLU network and x ~ N(0, I), ``E[y] = tr E[y (x x^T - I)]``, because
    ``c_0(0) = c_2(0) = 1/sqrt(2 pi)`` (ATV21 Lemma 3.5); with biases and offset the
    difference is ``sum_j U_j b_j Phi(b_j) + c``. The statistic is the sample mean of
    ``y (1 + d - |x|^2)`` (of ``W x`` when a whitener is given), with its z-score.

    Returns a dict: ``statistic`` (m,), ``z`` (m,), ``biased`` (max |z| > BIAS_Z).
    """
    Xs = X if W is None else X @ W
    Y = np.asarray(Y, dtype=np.float64).reshape(len(Xs), -1)
    n, d = Xs.shape
    t = Y * (1.0 + d - np.einsum("ij,ij->i", Xs, Xs))[:, None]
    stat = t.mean(axis=0)
    se = t.std(axis=0) / np.sqrt(max(n, 1))
    z = np.where(se > 0, stat / np.where(se > 0, se, 1.0), np.where(stat != 0, np.inf, 0.0))
    return {"statistic": stat, "z": z, "biased": bool(np.max(np.abs(z)) > BIAS_Z)}
