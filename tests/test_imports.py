"""The package's imports go downwards: no cycle between relufast modules (imports inside
functions included) and no import from a lower layer into a higher one."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "python" / "relufast"

#: Modules of the facade: what the algorithms and stages must never import.
FACADE = {
    "relufast",
    "relufast._api",
    "relufast._auto",
    "relufast.methods",
    "relufast.extraction",
    "relufast.estimator",
    "relufast.__main__",
    "relufast._cli_extract",
    "relufast.reproduce",
}
ALGORITHMS = ("bjw19", "gklw19", "atv21", "gp19", "mr19")


def _module_name(path):
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imports(name, path, known):
    """relufast modules imported anywhere in ``path`` (module, function and method level)."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "relufast")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "relufast":
                continue
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
    out.discard(name)
    return {m for m in out if m in known}


def _graph():
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _is_reexport(src, dst):
    """A package importing its own submodules (``__init__`` re-exports) is not a layer edge."""
    return dst.startswith(src + ".")


def _cycles(graph):
    """Strongly connected components of more than one module (Tarjan), ignoring the edges
    from a package to its own submodules."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if _is_reexport(v, w):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _algorithm_of(name):
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "algorithms" and parts[2] in ALGORITHMS else None


def test_the_parser_sees_function_level_imports():
    graph = _graph()
    # relufast._result imports relufast.bridges only inside RecoveryResult.to_torch.
    assert "relufast.bridges" in graph["relufast._result"]
    assert "relufast.stages.levmar" in graph["relufast.algorithms.atv21.lift"]


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_a_cycle_is_detected():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


@pytest.mark.parametrize("layer", ["stages", "algorithms"])
def test_no_upward_import(layer):
    bad = []
    for src, dsts in _graph().items():
        if not src.startswith(f"relufast.{layer}"):
            continue
        for dst in dsts:
            if dst in FACADE or dst.startswith("relufast.chosen"):
                bad.append((src, dst))
            if layer == "stages" and dst.startswith("relufast.algorithms"):
                bad.append((src, dst))
            if layer == "algorithms":
                a, b = _algorithm_of(src), _algorithm_of(dst)
                if (a and b and a != b) or dst == "relufast.planted":
                    bad.append((src, dst))
    assert bad == []


def test_no_module_over_800_lines():
    long = {p.name: n for p in ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > 800}
    assert long == {}
