"""What a new user meets first: no solver banner on stdout, no private option in a
message, results that pickle."""

import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import relufast as rf


def test_library_use_prints_no_solver_banner():
    # HiGHS prints its banner on fd 1 when the first solver of a process is created; the LP
    # stage creates that one quietly (checked in a fresh process).
    code = """
    import relufast as rf
    net = rf.planted.two_layer(d=6, k=3, m=3, random_state=0)
    X, Y = net.sample(40, random_state=1)
    print(rf.recover(X, Y, n_hidden=3, method="bjw19-enumeration").status.value)
    """
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "exact" and "HiGHS" not in r.stdout and "Copyright" not in r.stdout


def test_misspelled_option_lists_no_private_option():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 5))
    y = np.maximum(X @ rng.standard_normal(5), 0.0)
    with pytest.raises(TypeError) as info:
        rf.recover(X, y, n_hidden=1, method="gp19", thresold=1.0)
    assert "threshold" in str(info.value) and "_negate" not in str(info.value)
    with pytest.raises(TypeError):
        rf.recover(X, y, n_hidden=1, method="gp19", _negate=True)


def test_recovery_result_pickles():
    net = rf.planted.two_layer(d=8, k=3, m=4, random_state=0)
    X, Y = net.sample(5000, random_state=1)
    res = rf.recover(X, Y, n_hidden=3, method="bjw19-gaussian")
    back = pickle.loads(pickle.dumps(res))
    assert back.status == res.status and back.residual == res.residual
    assert np.array_equal(back.V, res.V) and np.array_equal(back.U, res.U)
    assert dict(back.counts) == dict(res.counts)
    with pytest.raises(TypeError):
        back.counts["n_samples"] = 0  # still read-only after loading
