"""Planted cases shared by the MPI worker and tests/test_mpi.py (one definition of the data)."""

import numpy as np

import relufast as rf

#: name -> (method, options); every case is deterministic given its seed.
CASES = {
    "gaussian": ("bjw19-gaussian", {"random_state": 0}),
    "gaussian_all": ("bjw19-gaussian", {"random_state": 0, "n_estimate": "all"}),
    "noisy": ("bjw19-noisy", {"random_state": 0}),
    "ica": ("bjw19-ica", {"random_state": 0}),
    "gklw19": ("gklw19", {"random_state": 0}),
    "fpt": ("bjw19-fpt", {"random_state": 0}),
    "enumeration": ("bjw19-enumeration", {"random_state": 0}),
    "auto_gaussian": ("auto", {"random_state": 0}),
    "auto_wide": ("auto", {"random_state": 0}),
    "atv21": ("atv21", {"random_state": 0, "n_refine": 20000}),
}


def case_data(name):
    """(X, Y, k) of a case: the same arrays in every process."""
    if name.startswith("gaussian"):
        net = rf.planted.two_layer(d=10, k=3, m=5, random_state=1, max_cos=0.7)
        X, Y = net.sample(40000, random_state=2)
        return X, Y, 3
    if name == "noisy":
        net = rf.planted.two_layer(d=8, k=3, m=6, random_state=3, max_cos=0.7)
        X, Y = net.sample(40000, random_state=4)
        Y = Y + 0.1 * np.random.default_rng(5).standard_normal(Y.shape)
        return X, Y, 3
    if name == "ica":
        net = rf.planted.two_layer(d=8, k=3, m=5, random_state=6, orthonormal_V=True)
        X, Y = net.sample(40000, random_state=7)
        return X, Y, 3
    if name == "gklw19":
        net = rf.planted.two_layer(d=6, k=3, m=4, random_state=8, max_cos=0.7, max_output_condition=10.0)
        X, Y = net.sample(20000, random_state=9, symmetrize=True)
        return X, Y, 3
    if name == "fpt":
        net = rf.planted.two_layer(d=6, k=3, m=2, random_state=3, max_cos=0.7)
        X, Y = net.sample(40000, random_state=4)
        return X, Y, 3
    if name == "auto_wide":  # k > d with rank(Y) = k: only Thm 1 applies (subsample, then certificate)
        rng = np.random.default_rng(3)
        net = rf.network.Network(rng.standard_normal((5, 5)), rng.standard_normal((5, 3)))
        X = rng.laplace(size=(300, 3))
        return X, net.predict(X), 5
    if name == "enumeration":
        net = rf.planted.two_layer(d=4, k=3, m=3, random_state=4, max_cos=0.9)
        X, Y = net.sample(400, random_state=5, input="laplace")
        return X, Y, 3
    if name == "auto_gaussian":
        net = rf.planted.two_layer(d=10, k=3, m=5, random_state=1, max_cos=0.7)
        X, Y = net.sample(40000, random_state=2)
        return X, Y, 3
    if name == "atv21":
        net = rf.planted.two_layer(d=8, k=3, m=2, random_state=10, bias="random", offset="random", max_cos=0.7)
        X, Y = net.sample(40000, random_state=11)
        return X, Y, 3
    raise KeyError(name)
