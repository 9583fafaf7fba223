"""A 0/1 combination of real vectors that hits a target: ``A delta = t``, delta in {0, 1}^k.

The signs of a ReLU layer wider than the equations that fix them come to this problem: the
next layer's linear term after flipping the units in a set S is ``sum_{i in S} a_i``, with
one known vector a_i per unit and fewer equations than units (one hidden layer with k > d m:
d m equations, k signs). Real-valued, it has a (k - r)-dimensional family of solutions; the
0/1 one is unique for generic a_i but a least-squares solve does not find it, and branch and
bound (HiGHS) gives up past about 30 units (measured: 40 units, 5 equations, no answer in
60 s).

It is a multi-dimensional subset-sum problem of low density (k unknowns against r equations
that each carry about 40 bits), which lattice reduction solves (Lagarias and Odlyzko 1985;
the +-1 embedding of Coster, Joux, LaMacchia, Odlyzko, Schnorr and Stern 1992): the lattice
spanned by the rows ``(2 e_i, 0, N a_i)`` and ``(1, ..., 1, 1, N t)`` holds
``(2 delta - 1, -1, N (A delta - t))``, of norm about sqrt(k + 1), far shorter than its other
vectors when N |A| is large; LLL (the C++ core's :func:`lll_reduce`) finds it. N grows in
steps of ``STEP_BITS`` from a basis already reduced at the previous N, which keeps the
reduction inside double precision (a single reduction at 2^38 loses the Gram-Schmidt norms
of these lattices), and a candidate is checked after every step. Measured on random Gaussian
A seen with 1e-13 relative error (``bench/test_bench_knapsack.py``, 2-core AVX-512 VM, one
thread): 100 units against 10 equations found in 4 of 4 draws, 0.68-0.94 s each; 100
against 30 in 4 of 4, 0.6-1.4 s; 150 against 10 (density 0.33 at 46 bits) in none, 4.6 s
each: beyond plain LLL (BKZ would reach further).
"""

from __future__ import annotations

import numpy as np

from ._native import core

__all__ = ["binary_combination", "sign_flips"]

#: Bits added to N at each reduction step, and the largest (entries stay below 2^52).
STEP_BITS, MAX_BITS = 8, 46
#: Columns below this fraction of the largest are taken as 0 (their delta is free: 0).
ZERO_COLUMN = 1e-13


def _embed(A, t, N):
    """Integer basis of the embedding lattice at scale N (int64)."""
    r, k = A.shape
    B = np.zeros((k + 1, k + 1 + r), dtype=np.int64)
    B[:k, :k] = 2 * np.eye(k, dtype=np.int64)
    B[:k, k + 1 :] = np.round(N * A.T).astype(np.int64)
    B[k, : k + 1] = 1
    B[k, k + 1 :] = np.round(N * t).astype(np.int64)
    return B


def _coordinates(Bred, k):
    """The integer combination of the embedding's rows that gives each row of ``Bred``
    (read off its first k + 1 columns, where the embedding is [[2 I, 0], [1, 1]])."""
    x, y = Bred[:, :k], Bred[:, k : k + 1]
    T = np.empty((len(Bred), k + 1), dtype=np.int64)
    T[:, :k] = (x - y) // 2
    T[:, k] = y[:, 0]
    return T


def _candidate(Bred, k, A, t, tol):
    """delta from a reduced row of the form (+-1, ..., +-1, -+1, small), or None."""
    best = None
    for v in Bred:
        if abs(v[k]) != 1 or not np.all(np.abs(v[:k]) == 1):
            continue
        delta = (1 - v[k] * v[:k]) // 2 == 1
        err = float(np.linalg.norm(A @ delta - t))
        if err <= tol and (best is None or err < best[1]):
            best = (delta, err)
    return best


def binary_combination(A, t, *, tol, rng=None, tries=4):
    """delta in {0, 1}^k with ``||A delta - t|| <= tol``, by lattice reduction.

    Parameters
    ----------
    A : ndarray of shape (r, k)
    t : ndarray of shape (r,)
    tol : float
        Largest accepted ``||A delta - t||`` (absolute); set it from the accuracy of A and t.
    rng : numpy Generator, optional
        Orders of the rows for the retries (the first try keeps the given order).
    tries : int
        Reductions from differently ordered bases, each through every scale.

    Returns
    -------
    (delta, residual) or None
        The 0/1 vector (bool) with the smallest residual found, or None when no reduction
        produced one within ``tol`` (the problem may still have one: LLL is not exhaustive).
    """
    A = np.asarray(A, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64).ravel()
    r, k = A.shape
    norms = np.linalg.norm(A, axis=0)
    keep = norms > ZERO_COLUMN * max(float(norms.max(initial=0.0)), 1e-300)
    delta = np.zeros(k, dtype=bool)
    if not keep.any():
        return (delta, float(np.linalg.norm(t))) if np.linalg.norm(t) <= tol else None
    Ak = A[:, keep]
    kk = Ak.shape[1]
    amax = float(np.abs(np.concatenate([Ak.ravel(), t])).max())
    rng = np.random.default_rng(0) if rng is None else rng
    bits = list(range(STEP_BITS, MAX_BITS, STEP_BITS)) + [MAX_BITS]
    for attempt in range(tries):
        order = np.arange(kk + 1) if attempt == 0 else rng.permutation(kk + 1)
        T = np.eye(kk + 1, dtype=np.int64)[order]
        for b in bits:
            basis = T @ _embed(Ak, t, 2.0**b / amax)
            if np.abs(basis).max() >= 2**52:
                break
            Bred = core.lll_reduce(basis.astype(np.float64))["basis"].astype(np.int64)
            found = _candidate(Bred, kk, Ak, t, tol)
            if found is not None:
                delta[keep] = found[0]
                return delta, found[1]
            T = _coordinates(Bred, kk)
    return None


#: delta of a unit must lie within this distance of 0 or 1 for its sign to count as resolved.
DELTA_TOL = 0.2
#: Largest ||B delta - beta|| of a 0/1 delta found by lattice reduction, relative to
#: ||B||_F + ||beta|| (fitted terms carry about 1e-12 of error; the callers' certificates judge).
KNAPSACK_TOL = 1e-8


def sign_flips(W, coef, beta):
    """The units of a layer taken with the wrong sign, from the linear term of the next fit.

    A unit fitted as ``relu(z~)`` whose true form is ``relu(-z~) = relu(z~) - z~`` leaves
    ``-v_j w~_j`` in the next layer's linear term: ``beta = -sum_j delta_j v_j w~_j``.

    Parameters
    ----------
    W : ndarray of shape (k, k_prev)
        The layer's rows as found (signs open).
    coef : ndarray of shape (q, k)
        The next layer's coefficients on ``relu(z~)``.
    beta : ndarray of shape (q, k_prev)
        Its coefficients on the layer's inputs (the linear term).

    Returns
    -------
    (flip, ok)
        Bool per unit, and whether a 0/1 solution explains the linear term: least squares
        when its solution lies near 0/1 and leaves little, else (more units than
        equations, or a least-squares point off the 0/1 ones) :func:`binary_combination`.
    """
    q, k = coef.shape
    B = -(coef[:, None, :] * W.T[None, :, :]).reshape(q * W.shape[1], k)
    beta = beta.reshape(-1)
    delta, *_ = np.linalg.lstsq(B, beta, rcond=None)
    flip = delta > 0.5
    ok = bool(np.all(np.minimum(np.abs(delta), np.abs(delta - 1)) <= DELTA_TOL))
    rest = float(np.linalg.norm(beta - B @ flip.astype(float)))
    ok = ok and rest <= DELTA_TOL * float(np.linalg.norm(B, 2)) * 1e-2 + DELTA_TOL * float(np.linalg.norm(beta))
    tol = KNAPSACK_TOL * (float(np.linalg.norm(B)) + float(np.linalg.norm(beta)))
    if rest > tol and np.linalg.matrix_rank(B) < k:
        # More signs than equations: least squares lands on a 0/1 point only by chance (and
        # one near 0/1 may leave a residual the loose test above passes); a subset sum.
        found = binary_combination(B, beta, tol=tol)
        if found is not None:
            return found[0], True
        seen = np.linalg.norm(B, axis=0) > 0  # units the next layer reads
        ok = ok and np.linalg.matrix_rank(B[:, seen]) == int(seen.sum())
    return flip, ok
