"""The documentation site: ``mkdocs build --strict`` succeeds (no warning), its navigation and
index list every page of docs/, the API reference is generated from the docstrings, and the
README stays an overview."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(p.name for p in (ROOT / "docs").glob("*.md"))


def _nav_pages():
    """The .md files that mkdocs.yml's nav names (read as text: no YAML library needed)."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:") :]
    return re.findall(r"^\s+-\s+(?:[^:\n]+:\s+)?([\w./-]+\.md)\s*$", nav, flags=re.M)


def test_site_builds_without_warnings(tmp_path):
    pytest.importorskip("mkdocs")
    site = tmp_path / "site"
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site), "-f", str(ROOT / "mkdocs.yml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    log = r.stdout + r.stderr
    assert r.returncode == 0, log
    assert "WARNING" not in log, log
    for page in PAGES:
        name = page[: -len(".md")]
        assert (site / ("index.html" if name == "index" else f"{name}/index.html")).is_file(), page
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("recover", "extract", "RecoveryResult", "Status", "planted.deep_relu", "bridges.from_torch"):
        assert f'id="relufast.{name}"' in api, name
    # Docstrings rendered, not only names: their numpydoc sections become tables.
    assert api.count("Parameters") >= 10 and "n_hidden" in api and "random_state" in api


def test_nav_and_index_list_every_page():
    nav = _nav_pages()
    assert sorted(nav) == PAGES, (sorted(set(PAGES) - set(nav)), sorted(set(nav) - set(PAGES)))
    assert len(nav) == len(set(nav))
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([\w-]+\.md)(?:#[\w-]+)?\)", index))
    assert linked == set(PAGES) - {"index.md"}, sorted(set(PAGES) - {"index.md"} - linked)


def test_readme_is_an_overview():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 150
    opening = " ".join(readme.split("\n## ")[0].split())
    for words in ("Passive recovery from samples", "Extraction of a model you can query", "chosen queries"):
        assert words in opening, words
    for call in ("rf.recover(", 'queries="chosen"', "rf.planted.deep_relu("):
        assert call in readme, call
    links = set(re.findall(r"\]\(docs/([\w-]+\.md)", readme))
    assert {"index.md", "methods.md", "chosen.md", "install.md", "cli.md"} <= links
    assert all((ROOT / "docs" / name).is_file() for name in links)
