import subprocess
import sys

import numpy as np

import relufast as rf
from relufast.__main__ import main


def test_demo_prints_errors_and_timings(capsys):
    assert main(["demo", "--n", "5000", "--d", "8", "--k", "3", "--m", "4"]) == 0
    out = capsys.readouterr().out
    assert "status:   exact" in out
    assert "error:    U" in out and "seconds:" in out


def test_recover_from_npz(tmp_path, capsys):
    net = rf.planted.two_layer(d=6, k=2, m=3, random_state=0)
    X, Y = net.sample(4000, random_state=1)
    data = tmp_path / "data.npz"
    out = tmp_path / "out.npz"
    np.savez(data, X=X, Y=Y)
    assert main(["recover", str(data), "--n-hidden", "2", "--out", str(out)]) == 0
    got = np.load(out)
    assert rf.metrics.parameter_error((got["U"], got["V"]), net).V < 1e-10
    assert str(got["status"]) == "exact"


def test_recover_reports_bad_input(tmp_path, capsys):
    data = tmp_path / "data.npz"
    np.savez(data, X=np.zeros((50, 3)), Y=np.zeros((50, 2)))
    assert main(["recover", str(data), "--n-hidden", "5"]) == 2
    assert "n_hidden must be at most" in capsys.readouterr().err


def test_python_dash_m():
    r = subprocess.run([sys.executable, "-m", "relufast", "info"], capture_output=True, text=True, check=True)
    assert "bjw19-gaussian" in r.stdout
