import numpy as np
import pytest

import relufast as rf


def _data(n=200, d=4, m=3):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, d)), rng.standard_normal((n, m))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("which", ["X", "Y"])
def test_non_finite_values(bad, which):
    X, Y = _data()
    (X if which == "X" else Y)[3, 1] = bad
    with pytest.raises(ValueError, match=f"{which} must contain only finite values; found 1 NaN or infinite"):
        rf.recover(X, Y, n_hidden=2)


def test_wrong_dimensionality():
    X, Y = _data()
    with pytest.raises(
        ValueError, match=r"X must be a 2-D array of shape \(n_samples, n_features\); got an array with shape \(200,\)"
    ):
        rf.recover(X[:, 0], Y, n_hidden=1)
    with pytest.raises(ValueError, match=r"Y must be a 1-D or 2-D array; got an array with shape \(200, 3, 1\)"):
        rf.recover(X, Y[:, :, None], n_hidden=1)


def test_mismatched_samples():
    X, Y = _data()
    with pytest.raises(ValueError, match="same number of samples .* X with 200 rows and Y with 199"):
        rf.recover(X, Y[:-1], n_hidden=2)


def test_too_few_samples():
    # A named method refuses with a clear error; auto, when every applicable method needs
    # more samples, returns the status insufficient_samples with a warning.
    X, Y = _data(n=9, d=4)
    with pytest.raises(ValueError, match=r"at least 2 \(d \+ 1\) = 10 samples for d = 4; got n = 9"):
        rf.recover(X, Y, n_hidden=2, method="bjw19-gaussian")
    with pytest.warns(rf.RelufastWarning, match="too few samples"):
        res = rf.recover(X, Y, n_hidden=2)
    assert res.status.value == "insufficient_samples" and res.V is None
    assert "at least 2 (d + 1) = 10 samples" in res.message


def test_more_hidden_units_than_features():
    X, Y = _data(d=4)
    with pytest.raises(ValueError, match="n_hidden must be at most the input dimension d = 4.*got n_hidden = 5"):
        rf.recover(X, Y, n_hidden=5)


@pytest.mark.parametrize(
    "k,exc,msg", [(0, ValueError, "got 0"), (2.5, TypeError, "got 2.5"), (True, TypeError, "got True")]
)
def test_bad_n_hidden(k, exc, msg):
    X, Y = _data()
    with pytest.raises(exc, match=f"n_hidden must be an integer >= 1; {msg}"):
        rf.recover(X, Y, n_hidden=k)


def test_non_numeric_input():
    X, Y = _data()
    with pytest.raises(TypeError, match="X must be a numeric array; got dtype <U"):
        rf.recover(X.astype(str), Y, n_hidden=2)
    with pytest.raises(TypeError, match="Y must be a numeric array; got dtype object"):
        rf.recover(X, np.array([[None]] * 200), n_hidden=2)
    with pytest.raises(TypeError, match="must be real-valued"):
        rf.recover(X, Y + 0j, n_hidden=2)


def test_integer_input_is_converted():
    net = rf.planted.two_layer(d=4, k=2, m=3, random_state=0)
    rng = np.random.default_rng(1)
    X = rng.integers(-5, 6, size=(4000, 4))
    Y = net(X)
    with pytest.warns(rf.RelufastWarning, match="does not look like (standard )?Gaussian"):
        res = rf.recover(X, Y, n_hidden=2, method="bjw19-gaussian", random_state=0)
    assert res.V.shape == (2, 4) and res.V.dtype == np.float64


def test_bad_options():
    X, Y = _data()
    with pytest.raises(ValueError, match="n_jobs must be None, -1 or a positive integer; got 0"):
        rf.recover(X, Y, n_hidden=2, n_jobs=0)
    with pytest.raises(TypeError, match="random_state must be None, an int"):
        rf.recover(X, Y, n_hidden=2, random_state="seed")
    with pytest.raises(ValueError, match="tol must be a positive number"):
        rf.recover(X, Y, n_hidden=2, tol=-1.0)
    with pytest.raises(TypeError, match=r"unknown option\(s\) 'bogus'; the options of its methods are "):
        rf.recover(X, Y, n_hidden=2, bogus=1)


def test_planted_validation():
    with pytest.raises(ValueError, match="k must be at most d"):
        rf.planted.two_layer(d=3, k=4, m=2)
    with pytest.raises(ValueError, match="input must be one of"):
        rf.planted.two_layer(d=3, k=2, m=2, random_state=0).sample(10, input="cauchy")
    with pytest.raises(ValueError, match="noise must be a finite number >= 0"):
        rf.planted.two_layer(d=3, k=2, m=2, random_state=0).sample(10, noise=-1)
    with pytest.raises(ValueError, match="no network met the constraints"):
        rf.planted.two_layer(d=3, k=3, m=3, random_state=0, max_cos=0.0, max_tries=5)


def test_lazy_arrays_are_refused_by_pipelines_with_a_pointer():
    da = pytest.importorskip("dask.array")
    X, Y = _data()
    with pytest.raises(TypeError, match=r"lazy array .*call .compute\(\) first.*bjw19-gaussian"):
        rf.recover(da.from_array(X), Y, n_hidden=2, method="bjw19-sparse-noise")
