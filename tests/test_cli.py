import os
import subprocess
import sys

import numpy as np
import pytest

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


def _planted_files(tmp_path, n=20000):
    import relufast as rf

    net = rf.planted.two_layer(d=8, k=3, m=5, random_state=0, max_cos=0.7)
    X, Y = net.sample(n, random_state=1)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "Y.npy", Y)
    return net, X, Y


def test_recover_memmapped_npy_pair_writes_network_and_json(tmp_path, capsys):
    import json

    import relufast as rf

    net, X, Y = _planted_files(tmp_path)
    out, diag = tmp_path / "net.npz", tmp_path / "diag.json"
    code = main(
        [
            "recover",
            "--x",
            str(tmp_path / "X.npy"),
            "--y",
            str(tmp_path / "Y.npy"),
            "--n-hidden",
            "3",
            "--method",
            "bjw19-gaussian",
            "--out",
            str(out),
            "--diagnostics",
            str(diag),
        ]
    )
    assert code == 0
    assert "memory-mapped" in capsys.readouterr().err
    got = np.load(out)
    assert str(got["status"]) == "exact"
    err = rf.metrics.parameter_error(rf.network.Network(got["U"], got["V"]), net)
    assert err.U < 1e-10 and err.V < 1e-10
    report = json.loads(diag.read_text())
    assert report["status"] == "exact" and report["counts"]["n_certify"] == 20000
    assert "fit" in report["seconds"]


def test_recover_auto_on_memmaps(tmp_path, capsys):
    import relufast as rf

    net, _, _ = _planted_files(tmp_path, n=20000)
    out = tmp_path / "net.npz"
    code = main(
        ["recover", "--x", str(tmp_path / "X.npy"), "--y", str(tmp_path / "Y.npy"), "--n-hidden", "3"]
        + ["--out", str(out), "--quiet"]
    )
    assert code == 0
    assert "status='exact'" in capsys.readouterr().out
    got = np.load(out)
    err = rf.metrics.parameter_error(rf.network.Network(got["U"], got["V"]), net)
    assert err.U < 1e-10 and err.V < 1e-10


def test_recover_from_zarr_store(tmp_path, capsys):
    da = pytest.importorskip("dask.array")
    pytest.importorskip("zarr")
    _, X, Y = _planted_files(tmp_path)
    store = str(tmp_path / "data.zarr")
    da.to_zarr(da.from_array(X, chunks=(5000, 8)), store, component="X")
    da.to_zarr(da.from_array(Y, chunks=(5000, 5)), store, component="Y")
    code = main(["recover", store, "--n-hidden", "3", "--method", "bjw19-gaussian", "--quiet"])
    assert code == 0
    assert "status='exact'" in capsys.readouterr().out


def test_recover_mpi_flag_without_mpiexec_is_one_rank(tmp_path, capsys):
    pytest.importorskip("mpi4py")
    _planted_files(tmp_path, n=5000)
    code = main(
        [
            "recover",
            "--x",
            str(tmp_path / "X.npy"),
            "--y",
            str(tmp_path / "Y.npy"),
            "--n-hidden",
            "3",
            "--method",
            "bjw19-gaussian",
            "--mpi",
            "--n-estimate",
            "all",
        ]
    )
    assert code == 0
    assert "status='exact'" in capsys.readouterr().out


def test_missing_input_file_and_output_folder_are_one_line_errors(tmp_path, capsys):
    assert main(["recover", str(tmp_path / "missing.npz"), "--n-hidden", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such input file" in err and "Traceback" not in err
    data = tmp_path / "data.npz"
    np.savez(data, X=np.zeros((5, 2)), Y=np.zeros((5, 1)))
    assert main(["recover", str(data), "--n-hidden", "1", "--out", str(tmp_path / "no" / "out.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "output folder" in err and "does not exist" in err


def test_recover_never_saves_none_arrays(tmp_path, capsys):
    # Zero outputs: rank(Y) = 0 < k, no network is returned.
    rng = np.random.default_rng(0)
    data, out = tmp_path / "data.npz", tmp_path / "out.npz"
    np.savez(data, X=rng.standard_normal((300, 3)), Y=np.zeros((300, 1)))
    main(["recover", str(data), "--n-hidden", "1", "--method", "bjw19-gaussian", "--out", str(out)])
    got = np.load(out)  # allow_pickle=False: an object array (a saved None) would raise here
    # rank_deficient, or non_identifiable once zero outputs are reported as determining nothing
    assert "U" not in got and str(got["status"]) in ("rank_deficient", "non_identifiable")
    assert "warning:" in capsys.readouterr().err


def test_demo_with_fewer_outputs_than_hidden_units(capsys):
    assert main(["demo", "--n", "5000", "--d", "8", "--k", "4", "--m", "2"]) == 0
    out = capsys.readouterr().out
    assert "method:   bjw19-fpt" in out and "status:   exact" in out


def test_options_are_validated_documented_and_versioned(capsys):
    with pytest.raises(SystemExit):
        main(["reproduce", "gklw19-fig2", "--trials", "0"])
    assert "expected an integer >= 1; got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"relufast {rf.__version__}"
    for command in ("demo", "recover", "reproduce"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        options = [line.split()[0] for line in text.splitlines() if line.strip().startswith("--")]
        assert options
        for line in text.split("options:")[1].split("\n  --")[1:]:
            assert len(line.split()) > 2, f"option without help: {line}"  # name, metavar, words
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert "bjw19-gaussian" in capsys.readouterr().out


def test_warnings_are_printed_once_and_readably(tmp_path, capsys):
    rng = np.random.default_rng(1)
    data = tmp_path / "data.npz"
    np.savez(data, X=rng.laplace(size=(400, 4)), Y=rng.standard_normal((400, 3)))
    main(["recover", str(data), "--n-hidden", "2", "--method", "bjw19-gaussian"])
    err = capsys.readouterr().err
    starts = [line for line in err.splitlines() if line.startswith("warning:")]
    assert starts and len(starts) == len(set(starts))
    assert "RelufastWarning" not in err and ".py:" not in err


def test_recover_gklw19_on_noiseless_samples_is_exact_and_written(tmp_path, capsys):
    import json

    net = rf.planted.gklw19_network(5, random_state=2)
    X, Y = net.sample(10000, random_state=3)  # not symmetrised: exact via region refinement
    data, out, diag = tmp_path / "data.npz", tmp_path / "net.npz", tmp_path / "diag.json"
    np.savez(data, X=X, Y=Y)
    args = ["recover", str(data), "--n-hidden", "5", "--method", "gklw19", "--quiet"]
    assert main(args + ["--out", str(out), "--diagnostics", str(diag)]) == 0
    got = np.load(out)
    assert str(got["status"]) == "exact" and rf.metrics.parameter_error((got["U"], got["V"]), net).V < 1e-10
    report = json.loads(diag.read_text())
    assert report["counts"]["region_rounds"] >= 1 and report["diagnostics"]["region_refine_residual"] < 1e-9
    assert "activation-region refinement" in capsys.readouterr().out


# ---- one-line errors with exit code 2


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A planted (d = 6, k = 2, m = 3) data set as .npy, .csv, .txt and .npz in tmp_path."""
    monkeypatch.chdir(tmp_path)
    net = rf.planted.two_layer(d=6, k=2, m=3, random_state=0)
    X, Y = net.sample(4000, random_state=1)
    np.save("X.npy", X)
    np.save("Y.npy", Y)
    np.savez("data.npz", X=X, Y=Y)
    return net, X, Y


def test_one_dimensional_x_is_a_one_line_error(files, capsys):
    _, X, _ = files
    np.save("x1.npy", X[:, 0])
    assert main(["recover", "--x", "x1.npy", "--y", "Y.npy", "--n-hidden", "2"]) == 2
    _one_line_error(capsys, "shape (4000,)", "2-D", "reshape(-1, 1)")


def test_csv_and_txt_are_read_and_other_files_named(files, capsys):
    net, X, Y = files
    np.savetxt("X.csv", X, delimiter=",", header="x0,x1,x2,x3,x4,x5")  # a header line is skipped
    np.savetxt("Y.txt", Y)
    args = ["recover", "--x", "X.csv", "--y", "Y.txt", "--n-hidden", "2", "--method", "bjw19-gaussian", "--quiet"]
    assert main(args + ["--out", "net.npz"]) == 0
    got = np.load("net.npz")
    assert str(got["status"]) == "exact" and rf.metrics.parameter_error((got["U"], got["V"]), net).V < 1e-10
    capsys.readouterr()
    one = rf.planted.two_layer(d=1, k=1, m=1, random_state=0)  # one feature: a single CSV column
    X1, Y1 = one.sample(500, random_state=1)
    np.savetxt("x1.csv", X1[:, 0])
    np.savetxt("y1.csv", Y1[:, 0])
    assert main(["recover", "--x", "x1.csv", "--y", "y1.csv", "--n-hidden", "1", "--quiet"]) == 0
    assert "status='exact'" in capsys.readouterr().out
    with open("X.dat", "w") as f:
        f.write("1,2\n3,4\n")
    assert main(["recover", "--x", "X.dat", "--y", "Y.npy", "--n-hidden", "2"]) == 2
    _one_line_error(capsys, "X.dat is not a .npy file", ".csv and .txt")
    assert main(["recover", "X.csv", "--n-hidden", "2"]) == 2  # DATA must be an .npz or a zarr store
    _one_line_error(capsys, "not an .npz archive", "--x and --y")
    with open("words.csv", "w") as f:
        f.write("a,b\nc,d\n")
    assert main(["recover", "--x", "words.csv", "--y", "Y.npy", "--n-hidden", "2"]) == 2
    _one_line_error(capsys, "not a table of numbers")


@pytest.mark.parametrize("value, shown", [("foo", "'foo'"), ("0", "got 0"), ("-3", "got -3")])
def test_n_estimate_is_checked_when_parsing(files, capsys, value, shown):
    with pytest.raises(SystemExit) as stop:
        main(["recover", "--x", "X.npy", "--y", "Y.npy", "--n-hidden", "2", "--n-estimate", value])
    assert stop.value.code == 2
    _one_line_error(capsys, "--n-estimate", "an integer >= 1 or 'all'", shown)


def test_out_must_be_a_writable_file_checked_before_any_work(files, capsys, tmp_path):
    for out in (".", str(tmp_path), "sub/"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        assert main(["recover", "data.npz", "--n-hidden", "2", "--out", out]) == 2
        _one_line_error(capsys, f"--out {out} is a folder", "give a file name")
    assert main(["recover", "data.npz", "--n-hidden", "2", "--diagnostics", "."]) == 2
    _one_line_error(capsys, "--diagnostics . is a folder")
    assert not list(tmp_path.glob("*.npz.npz")) and not (tmp_path / "..npz").exists()
    if os.path.isdir("/proc"):  # a file no one can create, root included
        assert main(["recover", "data.npz", "--n-hidden", "2", "--out", "/proc/relufast-net.npz"]) == 2
        err = _one_line_error(capsys, "cannot write --out /proc/relufast-net.npz")
        assert "recovering" not in err  # refused before reading or recovering anything
    assert main(["recover", "data.npz", "--n-hidden", "2", "--out", "net", "--quiet"]) == 0
    assert "wrote net.npz" in capsys.readouterr().out and os.path.exists("net.npz")  # np.savez's name


def test_data_together_with_x_and_y_is_an_error(files, capsys):
    assert main(["recover", "data.npz", "--x", "X.npy", "--y", "Y.npy", "--n-hidden", "2"]) == 2
    _one_line_error(capsys, "either DATA", "not both")
    assert main(["recover", "--x", "data.npz", "--y", "Y.npy", "--n-hidden", "2"]) == 2
    _one_line_error(capsys, "is an .npz archive (give it as DATA)")


def test_corrupt_npz_and_empty_npy_are_one_line_errors(files, capsys):
    with open("bad.npz", "wb") as f:
        f.write(b"PK\x03\x04 not a zip archive")
    assert main(["recover", "bad.npz", "--n-hidden", "2"]) == 2
    _one_line_error(capsys, "bad.npz is a corrupt .npz archive")
    open("empty.npy", "wb").close()
    assert main(["recover", "--x", "empty.npy", "--y", "Y.npy", "--n-hidden", "2"]) == 2
    _one_line_error(capsys, "empty.npy is an empty file")
    with open("X.npy", "r+b") as f:  # a header without its data
        f.truncate(200)
    assert main(["recover", "--x", "X.npy", "--y", "Y.npy", "--n-hidden", "2"]) == 2
    _one_line_error(capsys, "cannot read the inputs")


def test_parse_errors_are_one_line():
    r = subprocess.run(
        [sys.executable, "-m", "relufast", "recover", "--n-hidden", "2"], capture_output=True, text=True, check=False
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--x and --y" in r.stderr, r.stderr


def test_demo_on_few_samples_prints_no_solver_banner():
    """HiGHS prints a banner on fd 1 when the first solver of a process is created; the CLI
    sends it to /dev/null (checked in a fresh process: the banner is printed once per process)."""
    r = subprocess.run(
        [sys.executable, "-m", "relufast", "demo", "--n", "5"], capture_output=True, text=True, check=False
    )
    assert "status:" in r.stdout and r.returncode in (0, 1), r.stderr
    assert "HiGHS" not in r.stdout and "HiGHS" not in r.stderr and "Copyright" not in r.stdout


def test_demo_on_few_samples_does_not_call_a_unit_dead(capsys):
    main(["demo", "--n", "5"])
    assert "never active" not in capsys.readouterr().out
