"""Every ```python block of README.md and docs/*.md runs, and its annotated values hold.

The convention (docs/contributing.md):

- The blocks of one file run in order in one namespace; each block is one test
  (``test_doc_block[README.md:55]``, the line of its fence); running one block alone runs
  the blocks before it first.
- A line ending in ``# -> X`` is checked. The line is an expression, or an assignment whose
  assigned value is checked. ``X`` is a Python literal compared for equality (``'exact'``,
  ``True``, ``(8, 5)``; a string matches only a ``str`` that is not an enum, so a value that
  displays as ``<Status.EXACT: 'exact'>`` does not match ``'exact'``), ``<= 1e-12`` or
  ``>= 0.5`` a bound, ``0.058 +- 0.01`` a value within a tolerance, or a tuple of these
  compared elementwise: ``res.status.value, res.residual  # -> ('exact', <= 1e-12)``.
- HTML comments directly above the fence (blank lines allowed): ``<!-- requires: torch -->``
  skips the block when the module cannot be imported; ``<!-- skip: reason -->`` skips it;
  ``<!-- warns: text -->`` expects a warning whose message contains ``text`` (warnings are
  errors otherwise, as in the rest of the suite).
- ```bash blocks are not run; the README's install and test commands must be those of
  ``.ci/run``.
"""

from __future__ import annotations

import ast
import enum
import importlib
import io
import linecache
import math
import re
import tokenize
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)\s*$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*(requires|skip|warns)\s*:\s*(.*?)\s*-->\s*$")
_ARROW = "# ->"


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    directives: list = field(default_factory=list)  # (kind, value)

    @property
    def id(self):
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks_of(path: Path, language: str = "python") -> list:
    """The fenced blocks of one language in a Markdown file, with the directives above them."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, ticks, lang, indent = i, m.group(2), m.group(3).lower(), len(m.group(1))
        j = i + 1
        while j < len(lines):  # closed by as many backticks or more, without a language
            c = _FENCE.match(lines[j])
            if c and not c.group(3) and len(c.group(2)) >= len(ticks):
                break
            j += 1
        if lang == language or (language == "python" and lang in ("py", "python3")):
            directives, k = [], start - 1
            while k >= 0 and (not lines[k].strip() or _DIRECTIVE.match(lines[k])):
                if lines[k].strip():
                    d = _DIRECTIVE.match(lines[k])
                    directives.insert(0, (d.group(1), d.group(2)))
                k -= 1
            code = "\n".join(line[indent:] for line in lines[start + 1 : j])
            found.append(Block(path, start + 1, code, directives))
        i = j + 1
    return found


# --------------------------------------------------------------------------- annotations
def _split_top(text: str) -> list:
    """Split on commas outside brackets and quotes."""
    parts, depth, quote, cur = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def parse_spec(text: str):
    """An annotation as a predicate spec: ("eq", literal), ("le", x), ("ge", x), ("near", x, tol)
    or ("tuple", [specs])."""
    text = text.strip()
    if text.startswith("<="):
        return ("le", float(ast.literal_eval(text[2:].strip())))
    if text.startswith(">="):
        return ("ge", float(ast.literal_eval(text[2:].strip())))
    if "+-" in text and not text.startswith(("(", "[", "'", '"')):
        value, tol = text.split("+-")
        return ("near", float(ast.literal_eval(value.strip())), float(ast.literal_eval(tol.strip())))
    try:
        return ("eq", ast.literal_eval(text))
    except (ValueError, SyntaxError):
        pass
    if text.startswith("(") and text.endswith(")"):
        parts = _split_top(text[1:-1])
        if len(parts) > 1 or text[1:-1].rstrip().endswith(","):
            return ("tuple", [parse_spec(p) for p in parts])
    raise ValueError(f"cannot read the annotation {text!r}")


def _equal(value, literal) -> bool:
    if isinstance(literal, (tuple, list)):
        try:
            items = list(value)
        except TypeError:
            return False
        return len(items) == len(literal) and all(_equal(v, lit) for v, lit in zip(items, literal))
    if isinstance(literal, str):
        return isinstance(value, str) and not isinstance(value, enum.Enum) and str(value) == literal
    if isinstance(literal, bool):
        return isinstance(value, (bool, np.bool_)) and bool(value) is literal
    if literal is None:
        return value is None
    try:
        return bool(value == literal)
    except (TypeError, ValueError):
        return False


def check(value, spec) -> bool:
    """Whether a value satisfies an annotation spec."""
    kind = spec[0]
    if kind == "tuple":
        try:
            items = list(value)
        except TypeError:
            return False
        return len(items) == len(spec[1]) and all(check(v, s) for v, s in zip(items, spec[1]))
    if kind == "eq":
        return _equal(value, spec[1])
    try:
        x = float(value)
    except (TypeError, ValueError):
        return False
    if math.isnan(x):
        return False
    if kind == "le":
        return x <= spec[1]
    if kind == "ge":
        return x >= spec[1]
    return abs(x - spec[1]) <= spec[2]


def _annotations(code: str) -> dict:
    """{line (1-based, in the block): annotation text} of every ``# -> X`` comment."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(code + "\n").readline):
        if tok.type == tokenize.COMMENT and _ARROW in tok.string:
            found[tok.start[0]] = tok.string[tok.string.rindex(_ARROW) + len(_ARROW) :].strip()
    return found


# --------------------------------------------------------------------------- running
_VALUE = "__doc_value__"


def _register_source(path: Path) -> None:
    """Tracebacks show the statement: the file's python blocks at their lines, blank elsewhere
    (pytest would otherwise try to read the whole Markdown file as Python)."""
    text = path.read_text(encoding="utf-8")
    lines = ["\n"] * len(text.splitlines())
    for b in blocks_of(path):
        for i, line in enumerate(b.code.splitlines()):
            lines[b.line + i] = line + "\n"
    linecache.cache[str(path)] = (len(text), None, lines, str(path))


def _steps(block: Block):
    """The block as a list of (code object, line in the file, annotation or None)."""
    _register_source(block.path)
    tree = ast.parse(block.code, filename=str(block.path))
    ast.increment_lineno(tree, block.line)  # line numbers of the Markdown file
    notes = {line + block.line: text for line, text in _annotations(block.code).items()}
    lines = block.path.read_text(encoding="utf-8").splitlines()
    steps, pending = [], []

    def flush():
        if pending:
            mod = ast.Module(body=list(pending), type_ignores=[])
            steps.append((compile(mod, str(block.path), "exec"), pending[0].lineno, None))
            pending.clear()

    for stmt in tree.body:
        note = notes.pop(stmt.end_lineno, None)
        if note is None:
            pending.append(stmt)
            continue
        flush()
        if isinstance(stmt, ast.Expr):
            body = [ast.Assign(targets=[ast.Name(_VALUE, ast.Store())], value=stmt.value)]
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            body = [
                ast.Assign(targets=[ast.Name(_VALUE, ast.Store())], value=stmt.value),
                ast.Assign(targets=targets, value=ast.Name(_VALUE, ast.Load())),
            ]
        else:
            raise ValueError(
                f"{block.path.name}:{stmt.end_lineno}: a '# ->' annotation must end an expression or an assignment"
            )
        for node in body:
            ast.copy_location(node, stmt)
        mod = ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
        source = lines[stmt.end_lineno - 1].split("#")[0].strip()
        steps.append((compile(mod, str(block.path), "exec"), stmt.end_lineno, (note, parse_spec(note), source)))
    flush()
    if notes:
        line = min(notes)
        raise ValueError(f"{block.path.name}:{line}: a '# ->' annotation inside a statement; put it on its last line")
    return steps


def run_block(block: Block, namespace: dict) -> None:
    """Execute one block in a namespace and check its annotations (a test failure on a miss)."""
    for code, line, note in _steps(block):
        trace = None
        try:
            exec(code, namespace)
        except Exception as exc:
            # The traceback from the block's own line on (the Markdown file is not Python).
            trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next))
        if trace is not None:
            pytest.fail(f"{block.id}: the block raised\n{trace}", pytrace=False)
        if note is not None:
            text, spec, source = note
            value = namespace.pop(_VALUE)
            if not check(value, spec):
                pytest.fail(f"{block.path.name}:{line}: `{source}` gives {value!r}; the docs say {text}", pytrace=False)


def skip_reason(block: Block):
    """Why a block is skipped (None: it runs)."""
    for kind, value in block.directives:
        if kind == "skip":
            return value or "skipped in the docs"
        if kind == "requires":
            for name in value.replace(",", " ").split():
                try:
                    importlib.import_module(name)
                except ImportError:
                    return f"needs {name}"
    return None


ALL_BLOCKS = [b for path in DOC_FILES for b in blocks_of(path)]

#: Per file: the namespace and how many of its blocks have run.
_STATE: dict = {}


def _run_checked(block: Block, namespace: dict) -> None:
    """Run one block; its warnings must be those its ``warns`` directives announce."""
    expected = [value for kind, value in block.directives if kind == "warns"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_block(block, namespace)
    messages = [str(w.message) for w in caught]
    for text in expected:
        if not any(text in msg for msg in messages):
            pytest.fail(f"{block.id}: expected a warning containing {text!r}", pytrace=False)
    unexpected = [
        f"{w.category.__name__}: {w.message}" for w in caught if not any(t in str(w.message) for t in expected)
    ]
    if unexpected:
        pytest.fail(f"{block.id}: unexpected warning(s): {unexpected}", pytrace=False)


def _run_through(block: Block) -> None:
    """Run the blocks of the file before this one that have not run yet (as set-up, their
    failures left to their own tests), then this one."""
    blocks = [b for b in ALL_BLOCKS if b.path == block.path]
    state = _STATE.setdefault(block.path, {"ns": {"__name__": "__docs__"}, "done": 0})
    target = blocks.index(block)
    while state["done"] < target:
        earlier = blocks[state["done"]]
        state["done"] += 1
        if skip_reason(earlier) is None:
            try:
                _run_checked(earlier, state["ns"])
            except (Exception, pytest.fail.Exception):
                pass  # reported by its own test; this block fails on its own if it needs it
    state["done"] = max(state["done"], target + 1)
    _run_checked(block, state["ns"])


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[b.id for b in ALL_BLOCKS])
def test_doc_block(block):
    reason = skip_reason(block)
    if reason is not None:
        pytest.skip(reason)
    _run_through(block)


# --------------------------------------------------------------------------- the collector itself
def test_annotations_are_checked_as_documented(tmp_path):
    md = tmp_path / "x.md"
    md.write_text(
        "text\n\n<!-- requires: os -->\n\n```python\n"
        "a = 2 + 2  # -> 4\n"
        "b = (8, 5)\n"
        "b  # -> (8, 5)\n"
        "'exact', 1e-13  # -> ('exact', <= 1e-12)\n"
        "x, y = 0.06, True  # -> (0.058 +- 0.01, True)\n"
        "```\n\n<!-- skip: needs a cluster -->\n```python\nraise SystemExit\n```\n"
        "```bash\nnot python\n```\n"
        "````markdown\n```python\nan example, not run\n```\n````\n",
        encoding="utf-8",
    )
    found = blocks_of(md)
    assert [b.line for b in found] == [5, 14]
    assert skip_reason(found[0]) is None and skip_reason(found[1]) == "needs a cluster"
    ns = {}
    run_block(found[0], ns)
    assert ns["a"] == 4 and ns["y"] is True
    bad = Block(md, 1, "v = 0.124  # -> 0.058 +- 0.01")
    with pytest.raises(pytest.fail.Exception, match="0.124"):
        run_block(bad, {})
    from relufast import Status

    assert not check(Status.EXACT, parse_spec("'exact'")) and check("exact", parse_spec("'exact'"))
    assert not check(float("nan"), parse_spec("<= 1")) and check(np.float64(3e-16), parse_spec("<= 1e-12"))
    assert check(np.bool_(True), parse_spec("True")) and not check(1, parse_spec("True"))
    assert skip_reason(Block(md, 1, "", [("requires", "no_such_module_xyz")])) == "needs no_such_module_xyz"
    with pytest.raises(ValueError, match="expression or an assignment"):
        _steps(Block(md, 1, "for i in range(2):\n    pass  # -> None"))


def test_readme_install_and_test_commands_are_those_of_ci():
    ci = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "set ", "cd ", "rm "))
    ]
    readme = {line.strip() for b in blocks_of(ROOT / "README.md", "bash") for line in b.code.splitlines()}
    assert ci and all(line in readme for line in ci), [line for line in ci if line not in readme]
