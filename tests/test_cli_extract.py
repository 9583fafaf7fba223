"""``relufast extract`` (a torch file, a pickled scikit-learn model or module:function) and a
command line that starts without importing NumPy or the algorithms."""

import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import relufast as rf
from relufast.__main__ import main


def _run_python(code, *args):
    """Run ``code`` in a fresh interpreter (nothing imported yet); the last line it prints."""
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    return r.stdout.strip().splitlines()[-1]


_IMPORTED_AFTER = """
import sys
from relufast.__main__ import main
try:
    code = main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
heavy = [name for name in ("numpy", "scipy", "relufast._api", "relufast.algorithms") if name in sys.modules]
print(code, heavy)
"""


def test_help_and_argument_errors_import_neither_numpy_nor_the_algorithms():
    assert _run_python(_IMPORTED_AFTER, "--help") == "0 []"
    assert _run_python(_IMPORTED_AFTER, "--version") == "0 []"
    assert _run_python(_IMPORTED_AFTER, "extract", "no-such-model.pt") == "2 []"
    assert _run_python(_IMPORTED_AFTER, "extract", "m.pkl", "--n-hidden", "0") == "2 []"
    # recover's mistakes too: --method is checked against the registry only once they are.
    assert _run_python(_IMPORTED_AFTER, "recover", "--n-hidden", "2") == "2 []"
    assert _run_python(_IMPORTED_AFTER, "recover", "no-such-data.npz", "--n-hidden", "2", "--method", "x") == "2 []"


def test_an_unknown_method_is_a_one_line_error(tmp_path, capsys):
    for args in (["demo", "--n", "300"], ["recover", "--x", __file__, "--y", __file__, "--n-hidden", "2"]):
        assert main(args + ["--method", "nope"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--method 'nope' is not a method; expected one of auto, atv21" in err, err


def test_help_and_info_name_both_uses(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "extract a network from a model you can query" in text and "deep ones included" in text
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "recover: passive recovery of a two-layer network from samples" in out
    assert "several by chosen queries" in out and "bjw19-gaussian" in out
    with pytest.raises(SystemExit):
        main(["extract", "--help"])
    text = capsys.readouterr().out
    for option in ("--n-features", "--n-hidden", "--queries", "--random-state", "--out", "weights_only=False"):
        assert option in text, option


# ---- models


@pytest.fixture
def mlp():
    sklearn = pytest.importorskip("sklearn.neural_network")
    X = np.random.default_rng(0).standard_normal((500, 8))
    return sklearn.MLPRegressor(hidden_layer_sizes=(4,), max_iter=2000, random_state=0).fit(
        X, np.tanh(X[:, :5] + X[:, 3:])
    )


def test_pickled_sklearn_model_is_extracted_and_saved(mlp, tmp_path, capsys):
    path, out = tmp_path / "mlp.pkl", tmp_path / "net.npz"
    path.write_bytes(pickle.dumps(mlp))
    # n_features read from the model; random queries asked for (the default for a fitted MLP is chosen)
    assert main(["extract", str(path), "--out", str(out), "--quiet", "--queries", "random"]) == 0
    text = capsys.readouterr().out
    assert "status:   exact" in text and "queries:  20000" in text and f"wrote {out}" in text
    got = np.load(out)
    assert str(got["status"]) == "exact" and int(got["queries"]) == 20000 and str(got["precision"]) == "float64"
    err = rf.metrics.parameter_error(rf.Network(got["U"], got["V"], got["b"], got["c"]), rf.from_sklearn(mlp))
    assert err.U < 1e-10 and err.V < 1e-10 and err.b < 1e-10


def test_pickled_mlp_defaults_to_chosen_queries_and_a_time_limit_stops_it(mlp, tmp_path, capsys):
    path = tmp_path / "mlp.pkl"
    path.write_bytes(pickle.dumps(mlp))
    assert main(["extract", str(path), "--quiet"]) == 0  # the mode relufast.extract picks for a fitted MLP
    text = capsys.readouterr().out
    assert "status:   exact" in text and "chosen queries" in text
    assert main(["extract", str(path), "--quiet", "--time-limit", "1e-9"]) == 1
    text = capsys.readouterr().out
    assert "status:   failed" in text and "time_limit" in text


def test_torch_file_is_extracted_at_float32(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 5))
    path, out = tmp_path / "net.pt", tmp_path / "net.npz"
    torch.save(model, path)
    assert main(["extract", str(path), "--n-hidden", "4", "--out", str(out), "--quiet"]) == 0
    assert "status:   exact" in capsys.readouterr().out
    got = np.load(out)
    assert str(got["precision"]) == "float32" and got["U"].shape == (5, 4)
    err = rf.metrics.parameter_error(rf.Network(got["U"], got["V"], got["b"], got["c"]), rf.from_torch(model))
    assert err.V < 1e-5


def test_module_function_with_chosen_queries_extracts_every_layer(tmp_path, monkeypatch, capsys):
    name = "relufast_cli_test_model"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            import relufast as rf

            hidden, out = rf.planted.deep_relu(10, (6, 4), 3, random_state=8)
            f = rf.planted.relu_function(hidden, out)
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        args = ["extract", f"{name}:f", "--n-features", "10", "--n-hidden", "6,4", "--queries", "chosen"]
        assert main(args + ["--out", "deep.npz", "--quiet"]) == 0
        model = sys.modules[name].f
    finally:
        sys.modules.pop(name, None)
    assert "DeepResult" in capsys.readouterr().out
    got = np.load(tmp_path / "deep.npz")
    layers = [(got[f"W{i}"], got[f"b{i}"]) for i in (1, 2, 3)]
    assert [W.shape for W, _ in layers] == [(6, 10), (4, 6), (3, 4)] and "W4" not in got
    X = 3 * np.random.default_rng(1).standard_normal((200, 10))
    H = X
    for W, b in layers[:-1]:
        H = np.maximum(H @ W.T + b, 0)
    assert np.abs(H @ layers[-1][0].T + layers[-1][1] - model(X)).max() < 1e-10


# ---- mistakes: one line on stderr, exit code 2


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("relufast: extracting")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], err


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "m.pkl").write_bytes(pickle.dumps({"not": "a model"}))
    (tmp_path / "bad.pkl").write_bytes(b"not a pickle")
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07")
    (tmp_path / "relufast_cli_test_plain.py").write_text("value = 3\nrows = [1, 2]\n")
    yield tmp_path
    sys.modules.pop("relufast_cli_test_plain", None)


@pytest.mark.parametrize(
    "args, needles",
    [
        (["missing.pt"], ["no such model file: missing.pt"]),
        (["missing.pkl"], ["no such model file: missing.pkl"]),
        (["model.onnx"], ["has the suffix '.onnx'", "expected a torch file (.pt, .pth)", "module:function"]),
        (["model.h5"], ["'model.h5' is neither a file nor module:function"]),
        (["."], ["is a folder", "expected a torch file"]),
        (["no_such_module_xyz:f"], ["cannot import 'no_such_module_xyz'", "No module named"]),
        (["relufast_cli_test_plain:predict"], ["has no attribute 'predict'", "expected module:function"]),
        (["relufast_cli_test_plain:rows"], ["give --n-features", "does not state its input dimension"]),
        (["relufast_cli_test_plain:rows", "--n-features", "4"], ["model must be a torch.nn.Module", "got list"]),
        (["m.pkl", "--n-features", "4"], ["model must be a torch.nn.Module", "got dict"]),
        (["bad.pkl"], ["cannot unpickle bad.pkl"]),
        (["m.pkl", "--n-features", "4", "--out", "."], ["--out . is a folder"]),
    ],
)
def test_mistakes_are_one_line_errors(folder, capsys, args, needles):
    assert main(["extract", *args]) == 2
    _one_line_error(capsys, *needles)


@pytest.mark.parametrize("widths", ["4,x", "0", "4,,2", "-1", ""])
def test_bad_widths_are_refused_when_parsing(folder, capsys, widths):
    with pytest.raises(SystemExit) as stop:
        main(["extract", "m.pkl", "--n-hidden", widths])
    assert stop.value.code == 2
    _one_line_error(capsys, "--n-hidden", "expected a width >= 1 or widths separated by commas", repr(widths))


def test_several_widths_with_random_queries_are_extract_s_error(mlp, folder, capsys):
    (folder / "mlp.pkl").write_bytes(pickle.dumps(mlp))
    assert main(["extract", "mlp.pkl", "--n-hidden", "4,2", "--queries", "random"]) == 2
    _one_line_error(capsys, "queries='random' extracts one hidden layer", "Pass queries='chosen'")


def test_torch_state_dict_is_named(folder, capsys):
    torch = pytest.importorskip("torch")
    torch.save(torch.nn.Linear(3, 2).state_dict(), folder / "weights.pt")
    assert main(["extract", "weights.pt"]) == 2
    _one_line_error(capsys, "weights.pt holds", "state_dict", "torch.save(model, path)", "expected a torch.nn.Module")
    (folder / "junk.pt").write_bytes(b"junk")
    assert main(["extract", "junk.pt"]) == 2
    _one_line_error(capsys, "cannot read junk.pt with torch.load")
