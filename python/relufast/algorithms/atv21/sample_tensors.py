"""Hermite tensors of ATV21 (Sec. 2.5) estimated from samples, in the span of V: batched
raw sums (C++), reduced over MPI ranks, with the batch spread as the noise estimate."""

import numpy as np

from ...stages.moments import HermiteAccumulator
from ...stages.reduce import Samples
from .tensors import NOISE_BATCHES


def _rows(data, start, stop):
    """This rank's part of the global rows ``start .. stop - 1`` as a one-process
    :class:`relufast.stages.reduce.Samples` (a view: memmaps and dask arrays stay lazy)."""
    lo, hi = (int(np.clip(t - data.offset, 0, data.n_local)) for t in (start, stop))
    return Samples(data.X[lo:hi], data.Y[lo:hi], n_jobs=data.n_jobs)


def _batch_tensors(data, stop, outputs, n_batches, make):
    """Hermite tensors of derived outputs ``outputs(X_b, Y_b)`` (n_b, p) over the global rows
    ``0 .. stop - 1``, cut into ``n_batches`` batches of consecutive rows (their spread
    estimates the noise). Each rank adds its part of every batch to an accumulator from
    ``make()``, block by block; the batch sums are reduced over the ranks in one exchange.
    Returns (T of all rows, per-batch T, cuts), each T a list of (p,) + (k,) * r arrays."""
    cuts = np.linspace(0, stop, n_batches + 1).astype(int)
    accs, state = [], {}
    for j, (a, e) in enumerate(zip(cuts[:-1], cuts[1:])):
        acc, part = make(), _rows(data, a, e)
        if part.n_local:
            for Xb, Yb in part.blocks(bounded=True):
                acc.add(Xb, np.ascontiguousarray(outputs(Xb, Yb)))
        accs.append(acc)
        state.update({f"{j}/{key}": v for key, v in acc.state().items()})
    state = data.reduce(state)
    for j, acc in enumerate(accs):
        acc.set_state({key[len(f"{j}/") :]: v for key, v in state.items() if key.startswith(f"{j}/")})
    parts = [acc.tensors() for acc in accs]
    total = accs[0]
    for acc in accs[1:]:
        total.merge(acc)
    return total.tensors(), parts, cuts


def _batch_noise(T, parts, cuts, out, orders):
    """Standard error (Frobenius) of ``T[r][out]`` from the batch spread, weighted by size."""
    wts = np.diff(cuts) / cuts[-1]
    return [
        float(
            np.sqrt(
                np.sum(np.tensordot(wts, np.stack([p[r][out] - T[r][out] for p in parts]) ** 2, axes=1))
                / max(len(parts) - 1, 1)
            )
        )
        for r in orders
    ]


def _hermite_tensors(run, data, s, W, g, outputs=None):
    """Step 3: T_0..T_4 of ``y = Y g`` in the span, ``z = W^T x`` (C++ raw sums, ATV21
    Sec. 2.5 estimator), in NOISE_BATCHES batches whose spread estimates the noise of each
    tensor. Returns (T list, noise list). ``outputs(X_b, Y_b)``, when given, replaces
    ``y = Y g`` (the residual outputs of :mod:`relufast.algorithms.atv21.deflate`).

    Two passes, the second with control variates (relufast's own; same expectations,
    several times less noise): He_r(z) is orthogonal to every polynomial of degree < r
    under N(0, I), so ``E[(y - q(z)) He_r(z)] = T_r`` for any q of degree < r. Pass 1
    gives T_0, T_1, T_2 of y; pass 2 gives T_2 of ``y - q_1`` and T_3, T_4 of ``y - q_2``,
    where ``q_1 = T_0 + T_1 . z`` and ``q_2 = q_1 + <T_2, He_2(z)> / 2`` are y's projections
    on the Hermite polynomials of degree <= 1 and <= 2 (a ReLU network's constant and
    linear parts carry most of its variance).
    """
    n, nb = data.n, min(NOISE_BATCHES, data.n)
    y = (lambda Xb, Yb: Yb @ g) if outputs is None else outputs
    T, parts, cuts = _batch_tensors(
        data,
        n,
        lambda Xb, Yb: y(Xb, Yb)[:, None],
        nb,
        lambda: HermiteAccumulator(1, order=2, basis=W, n_jobs=s.n_jobs, block_size=s.block_size),
    )
    T0, T1, T2 = T[0][0], T[1][0], T[2][0]
    noise = _batch_noise(T, parts, cuts, 0, range(3))

    def residual_outputs(Xb, Yb):
        Z = np.asarray(Xb, dtype=np.float64) @ W
        y1 = y(Xb, Yb) - T0 - Z @ T1
        y2 = y1 - 0.5 * (np.sum((Z @ T2) * Z, axis=1) - np.trace(T2))
        return np.column_stack([y1, y2])

    Tc, parts, cuts = _batch_tensors(
        data,
        n,
        residual_outputs,
        nb,
        lambda: HermiteAccumulator(2, order=4, basis=W, n_jobs=s.n_jobs, block_size=s.block_size),
    )
    run.diag["tensor_noise_plain"] = np.array(noise)
    noise = noise[:2] + _batch_noise(Tc, parts, cuts, 0, [2]) + _batch_noise(Tc, parts, cuts, 1, [3, 4])
    run.diag["tensor_noise"] = np.array(noise)
    return [T0, T1, Tc[2][0], Tc[3][1], Tc[4][1]], noise
