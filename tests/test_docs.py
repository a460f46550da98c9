"""The README and docs/ stay true to the tree: every link resolves, every path they name exists, and the README
stays a short front door (the depth lives in docs/)."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A repository path in backticks: gaplan/..., tests/..., examples/..., docs/... (globs and placeholders left out).
PATH = re.compile(r"`((?:gaplan|tests|examples|docs)/[\w./-]+?)(?:::[\w\[\]-]+)?`")


def _anchors(page: pathlib.Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    anchors = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return anchors


def test_the_readme_is_a_short_front_door_with_the_depth_in_docs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert len([p for p in PAGES if p.parent.name == "docs" and p.name != "README.md"]) >= 4
    assert "## Tour of the code" in readme
    first_block = readme.split("```bash", 1)[1].split("```", 1)[0]
    assert "pip install torch==2.13.0" in first_block and "gaplan probe" in first_block
    assert "python -m pytest -q" in first_block


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(target)
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_the_page_names_exists(page):
    text = page.read_text()
    missing = [path for path in PATH.findall(text) if "<" not in path and "*" not in path
               and not (ROOT / path.rstrip(".")).exists()]
    assert not missing, missing
