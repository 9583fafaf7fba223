"""bjw19-gaussian at size: the span of V from the first moment and the moment of the outputs
in that span (never the full (m, d, d) moment)."""

import numpy as np

import relufast as rf
from relufast.stages.moments import SecondMomentAccumulator, moment_span, use_mean_span
from relufast.stages.tensor import project


def test_projected_moment_equals_the_projection_of_the_full_moment():
    rng = np.random.default_rng(0)
    n, d, m, k = 4000, 12, 5, 3
    X, Y = rng.standard_normal((n, d)), rng.standard_normal((n, m))
    Q = np.linalg.qr(rng.standard_normal((m, k)))[0]
    Wh = np.linalg.inv(np.linalg.cholesky(np.cov(X.T) + np.eye(d))).T
    Wh = 0.5 * (Wh + Wh.T)
    for whitener in (None, Wh):
        W, P, _ = moment_span(X, Y, k, Q, 1, 256, whitener=whitener, mean_span=True)
        # The outputs enter with their mean and linear part (in the span) removed.
        Pm = W if whitener is None else Wh @ W
        Yq = Y @ Q
        Yc = Yq - Yq.mean(axis=0) - X @ Pm @ (Yq.T @ X / n @ Pm).T
        acc = SecondMomentAccumulator(d, k).update(X, Yc)
        T = acc.tensor()
        if whitener is not None:
            shift = Yc.mean(axis=0)[:, None, None] * np.eye(d)
            T = np.einsum("ab,ibc,cd->iad", Wh, T + shift, Wh) - shift
        assert np.allclose(P, project(T, W), rtol=0, atol=1e-12 * np.abs(P).max())
        # W spans the row space of the first moment
        M = (Y @ Q).T @ X / n
        if whitener is not None:
            M = M @ Wh
        assert np.allclose(M - M @ W @ W.T, 0, atol=1e-12 * np.abs(M).max())


def test_mean_span_only_at_size():
    assert not use_mean_span(20, 5, 5) and not use_mean_span(12, 6, 6)
    assert use_mean_span(100, 50, 50) and use_mean_span(200, 100, 100) and use_mean_span(784, 128, 128)


def test_gaussian_pipeline_exact_with_the_first_moment_span():
    net = rf.planted.two_layer(d=48, k=12, m=12, random_state=2)
    X, Y = net.sample(40_000, random_state=3)
    res = rf.recover(X, Y, n_hidden=12, method="bjw19-gaussian", random_state=0)
    assert res.status.value == "exact" and res.diagnostics["span_from_first_moment"]
    err = rf.metrics.parameter_error(res, net)
    assert max(err.U, err.V) < 1e-12


def test_control_variates_cut_the_sampling_error_of_the_projected_moment():
    # The moment is unchanged in expectation; its error against the exact moment of the
    # planted network falls by about 2x at the same n (measured 2.3x at d = 100, k = 50).
    from relufast.stages.moments import _mean_span, _projected_moment

    net = rf.planted.two_layer(d=48, k=12, m=12, random_state=2)
    X, Y = net.sample(20_000, random_state=3)
    W, _, control = _mean_span(X, Y, 12, None, None)
    Vw = net.V @ W
    exact = np.einsum("ij,jp,jq->ipq", net.U / (np.sqrt(2 * np.pi) * np.linalg.norm(net.V, axis=1)), Vw, Vw)
    errors = [
        np.linalg.norm(_projected_moment(X, Y, W, None, 1, 256, control=c) - exact) / np.linalg.norm(exact)
        for c in (None, control)
    ]
    assert errors[1] < 0.7 * errors[0], errors
