"""GP19's other methods: halfspaces (Thm 6), correlation-graph supports, even activations (Thm 10)."""

from __future__ import annotations

import math

import numpy as np

from ..._blas import single_threaded_blas
from ..._protocol import recovery_method
from ..._result import Run, Status, warn
from ..._validation import as_float_matrix, check_positive_int, check_random_state
from ...stages.moments import SecondMomentAccumulator
from ...stages.reduce import is_dask
from .coefficients import _DEGENERATE_RATIO, _EVEN, _Unit, hermite_coeffs
from .data import _Data, _mean
from .pipeline import _jobs, _samples, lowest_layer
from .step1 import _ascent_operator, _streamed_power


@recovery_method("gp19-halfspaces", units_free=False)
def halfspaces(
    X,
    Y,
    n_hidden,
    *,
    threshold=None,
    union=False,
    landscape="tpm",
    refine="paper",
    eps=0.02,
    max_refine_iter=200,
    f=None,
    n_features=None,
    n_queries=1_000_000,
    band_queries=20000,
    band_width=None,
    restarts=5,
    max_iter=100,
    tol=None,
    shift=0.0,
    kappa_lambda=4.0,
    gamma=0.01,
    label_tol=0.0,
    random_state=None,
    n_jobs=None,
    comm=None,
):
    """Intersections (or unions) of halfspaces far from the origin (GP19 Sec. 2.3, Thm 6).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features) or None
        Gaussian inputs (None with ``f=`` queries, as in :func:`lowest_layer`).
    Y : array-like of shape (n_samples,) or None
        0/1 labels: ``g(x) = prod_i 1[w_i . x + t >= 0]`` (intersection) or, with
        ``union=True``, ``g(x) = OR_i 1[w_i . x >= t]``.
    n_hidden : int
        Number of halfspaces.
    threshold : float
        The common distance t of the halfspaces from the origin (t > sqrt(3) so that the
        step's u_4 > 0).
    union : bool, default=False
    landscape, refine, eps, max_refine_iter, f, n_features, n_queries, band_queries, \
band_width, restarts, max_iter, tol, shift, kappa_lambda, gamma, label_tol, random_state, \
n_jobs, comm
        As in :func:`lowest_layer` (the activation is the step).

    Returns
    -------
    RecoveryResult
        ``V`` holds the unit normals w_i (pointing into each halfspace).

    Notes
    -----
    The reduction of Sec. 2.3: ``1 - g = OR_i 1[(-w_i) . x > t]`` is GP19's model with the
    step activation and ``P = 1 - prod(1 - X_i)`` (monotone, ``c_i = 1``), so Step 1 and
    Step 2 recover ``v_i = -w_i``. A union is the model itself.
    """
    given = dict(locals())  # first statement: exactly the parameters
    # Every parameter but these is one of lowest_layer's options, passed on as given.
    options = {o: v for o, v in given.items() if o not in ("X", "Y", "n_hidden", "threshold", "union", "f")}
    layer = lowest_layer.__wrapped__  # the protocol is this function's
    if union:
        return _rename(layer(X, Y, n_hidden, threshold=threshold, activation="step", f=f, **options), "gp19-halfspaces")
    if f is not None:
        g = f

        def f(Xq):
            return 1.0 - np.asarray(g(Xq), dtype=np.float64)

    if Y is not None:
        Y = 1.0 - (Y if is_dask(Y) else as_float_matrix(Y, "Y", allow_1d=True))
    return layer(X, Y, n_hidden, threshold=threshold, activation="step", f=f, _negate=True, **options)


def _rename(res, method):
    import dataclasses

    return dataclasses.replace(res, method=method)


@recovery_method("gp19-support", units_free=False)
def correlation_graph_supports(
    X, Y, n_hidden=None, *, threshold=None, tol=None, random_state=None, n_jobs=None, comm=None
):
    """Algorithm 3 (ConstructCorrelationGraph) of GP19, Thm 8: disjoint binary supports.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Standard Gaussian inputs.
    Y : array-like of shape (n_samples,)
        ``f = P(u(W x - t))`` with ``u(a) = e^{rho a}`` and rows of W in {0, 1}^n with
        disjoint supports.
    n_hidden : int, optional
        Expected number of supports (checked when given).
    threshold : float, optional
        Edge threshold tau on ``alpha_ij = E[f x_i x_j]`` (i != j); default the midpoint of
        the largest gap of the sorted off-diagonal alpha (the paper's "constant factor gap").
    tol, random_state
        Taken for the common interface and without effect here: Algorithm 3 is one moment
        and a threshold, with no iteration to stop and no random draw.
    n_jobs : int or None
        Threads of the moment kernel (None or -1: all cores).
    comm : mpi4py communicator, optional
        Each rank passes its own samples; the moment is reduced over the ranks (X and Y may
        also be memmaps or dask arrays).

    Returns
    -------
    RecoveryResult
        ``V`` rows ``1_T / sqrt(|T|)`` for each support T of size >= 2 (``U`` zeros: P is not
        estimated); status
        ``approximate``, or ``failed`` when a component is not a clique (GapViolation) or
        the count differs from ``n_hidden``. ``diagnostics``: ``supports``, ``tau``,
        ``gap_ratio``, ``alpha`` and ``singletons`` (a support of size 1 is invisible to
        pair correlations).

    Notes
    -----
    In population (Thm 8, with the corrected exponent of erratum 10):
    ``alpha_ij = rho^2 C({r}, mu)`` inside support T_r, ``rho^2 C({r1, r2}, mu)`` across,
    ``mu = exp(-rho t + rho^2 s / 2)``. One streamed second moment, O(N n^2).
    """
    from scipy.sparse.csgraph import connected_components

    run = Run("gp19-support")
    samples = _samples(X, Y, comm, n_jobs)
    n = samples.d
    if n < 2:
        raise ValueError(f"need at least 2 features for pair correlations; got {n}")
    with run.stage("moment"):
        A = samples.accumulate(SecondMomentAccumulator(n, 1, n_jobs=n_jobs)).tensor()[0]
    iu = np.triu_indices(n, 1)
    vals = A[iu]
    if threshold is None:
        s = np.sort(vals)[::-1]
        gaps = s[:-1] - s[1:]
        i = int(np.argmax(gaps)) if len(gaps) else 0
        tau = 0.5 * (s[i] + s[i + 1]) if len(gaps) else s[0] / 2
        below = s[i + 1] if len(gaps) else 0.0
        gap_ratio = float(s[i] / below) if below > 0 else np.inf
    else:
        tau = float(threshold)
        gap_ratio = np.nan
    adj = np.zeros((n, n), dtype=bool)
    adj[iu] = vals >= tau
    adj |= adj.T
    ncomp, labels = connected_components(adj, directed=False)
    supports, singletons, clique_ok = [], [], True
    for c in range(ncomp):
        T = np.flatnonzero(labels == c)
        if len(T) == 1:
            singletons.append(int(T[0]))
            continue
        sub = adj[np.ix_(T, T)] | np.eye(len(T), dtype=bool)
        clique_ok &= bool(sub.all())
        supports.append(T.tolist())
    run.diag.update(supports=supports, tau=float(tau), gap_ratio=gap_ratio, alpha=A, singletons=singletons)
    run.counts["n_samples"] = samples.n
    V = np.zeros((len(supports), n))
    for r, T in enumerate(supports):
        V[r, T] = 1.0 / math.sqrt(len(T))
    if not clique_ok:
        return run.result(
            Status.FAILED,
            "GapViolation: a component of the correlation graph is not a clique; "
            "the gap between within- and cross-support correlations is too small",
            V=V,
            U=np.zeros((1, len(V))),
        )
    if n_hidden is not None and len(supports) != check_positive_int(n_hidden, "n_hidden"):
        return run.result(
            Status.FAILED,
            f"found {len(supports)} supports of size >= 2, expected n_hidden = "
            f"{n_hidden} (singletons: {singletons}; gap ratio {gap_ratio:.3g})",
            V=V,
            U=np.zeros((1, len(V))),
        )
    if np.isfinite(gap_ratio) and gap_ratio < 2.0:
        warn(f"GapViolation: largest-gap ratio {gap_ratio:.2f} < 2")
    return run.result(
        Status.APPROXIMATE,
        f"Algorithm 3: {len(supports)} supports, tau = {tau:.3g}, gap ratio {gap_ratio:.3g}",
        V=V,
        U=np.zeros((1, len(V))),
    )


@recovery_method("gp19-even", units_free=False)
def even_activation(
    X,
    Y,
    n_hidden,
    *,
    activation="abs",
    step=None,
    restarts=3,
    max_iter=500,
    tol=1e-12,
    random_state=None,
    n_jobs=None,
    comm=None,
):
    """GP19 Thm 10: even activation u(w.x), t = 0, orthonormal W, by deflated projected ascent.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    Y : array-like of shape (n_samples,)
    n_hidden : int
    activation : {"abs", "square"}, default="abs"
        u(a) = |a| (u_4 = -0.161843 < 0) or a^2 (u_4 = 0: refused, status ``unsupported``).
    step : float, optional
        Ascent step; default ``0.05 / |u_4|`` (plain power iteration oscillates on this
        mixed-sign quartic).
    comm : mpi4py communicator, optional
        Each rank passes its own samples; the mean of f and every ascent pass are reduced
        over the ranks (X and Y may also be memmaps or dask arrays).

    Returns
    -------
    RecoveryResult
        ``V`` unit rows up to sign (u is even, so the sign is not identifiable); ``U`` zeros
        (P is not estimated).

    Notes
    -----
    Maximises ``s_4 E[f h_4(z.x)]`` on the unit sphere, on the orthogonal complement of the
    rows found. On the sphere (erratum 12, quadrature-verified)
    ``E[f h_4] = sum_i alpha_i z_i^4 + sum_{i<j} gamma_ij z_i^2 z_j^2`` with
    ``gamma_ij = sqrt(6) u_2^2 C({i,j}, u_0) / u_0^2`` (the paper has 6 and extra terms);
    coordinate vectors are the maxima when ``s_4 (alpha_i + alpha_j) > s_4 gamma_ij``.
    """
    run = Run("gp19-even")
    if activation not in _EVEN:
        raise ValueError(f"activation must be one of {_EVEN}; got {activation!r}")
    k = check_positive_int(n_hidden, "n_hidden")
    restarts = check_positive_int(restarts, "restarts")
    samples = _samples(X, Y, comm, n_jobs)
    n = samples.d
    if k > n:
        raise ValueError(f"n_hidden must be <= n_features; got n_hidden={k}, n_features={n}")
    u = hermite_coeffs(activation, 0.0, 4)
    run.diag["u_hat"] = u
    if abs(u[4]) <= _DEGENERATE_RATIO * abs(u[2]):
        return run.result(
            Status.UNSUPPORTED,
            (
                f"the fourth Hermite coefficient of the even activation {activation} vanishes (u_4 = {u[4]:.3g}): "
                "Thm 10's objective has no signal (DegenerateHermite4)"
            ),
        )
    rng = check_random_state(random_state)
    s4 = float(np.sign(u[4]))
    eta = 0.05 / abs(u[4]) if step is None else float(step)
    data = _Data(samples, _mean(samples), n_jobs=_jobs(n_jobs))
    with single_threaded_blas(), run.stage("ascent"):
        # Projected ascent z <- normalize(z + eta s4 grad_tan) is the shifted power method
        # normalize(s4 grad_tan + z / eta): one routine with Step 1's TPM.
        _, found, passes = _streamed_power(
            lambda count: _ascent_operator(data, count), k, n, rng, restarts, max_iter, tol, s4, 1.0 / eta
        )
    run.counts.update(n_samples=samples.n, passes=passes)
    return run.result(
        Status.APPROXIMATE,
        f"GP19 Thm 10: {k} rows by deflated projected ascent "
        f"(step {eta:.3g}); signs are not identifiable for an even activation",
        V=found,
        U=np.zeros((1, k)),
        activation=_Unit(activation),
    )
