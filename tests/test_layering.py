"""The package order: each stage imports only the stages below it, imports inside functions included.

The order is the stack in the README's layout table. A module may import its own package and any package
below it; an import upward (or sideways to a later stage) fails here, naming the file, the line and the import.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "gaplan"

# Bottom first. The top-level gaplan/__init__.py and __main__.py sit above all of them.
STACK = ("core", "plan", "data", "workload", "runs", "devices", "parallel", "training", "worker", "estimate",
         "probing", "benchmark", "report", "integrations", "workflows", "cli")
TORCH_FREE = ("core", "plan", "runs")  # pure decisions and files: no module in them may import torch

MAX_LINES = 400


def _modules() -> list[pathlib.Path]:
    return sorted(ROOT.rglob("*.py"))


def _package_of(path: pathlib.Path) -> str | None:
    parts = path.relative_to(ROOT).parts
    return parts[0] if len(parts) > 1 else None


def _gaplan_imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """Every ``gaplan...`` module named by an import in the file, at any depth, with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "gaplan":
                found += [(node.lineno, f"gaplan.{alias.name}") for alias in node.names]
            elif node.module.startswith("gaplan."):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found.append((node.lineno, "<relative>"))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("gaplan.")]
    return found


def test_every_module_lives_in_a_stage_package_except_the_entry_points():
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert top == ["__init__.py", "__main__.py"], top
    packages = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert packages == sorted(STACK), packages


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_only_down_the_stack(path):
    package = _package_of(path)
    if package is None:
        return  # gaplan/__init__.py (the lazy public API) and __main__.py stand above the stack
    level = STACK.index(package)
    upward = []
    for line, name in _gaplan_imports(path):
        assert name != "<relative>", f"{path}:{line}: relative import (gaplan imports absolutely)"
        parts = name.split(".")
        target = parts[1] if len(parts) > 1 else None
        if target is None or target not in STACK:
            upward.append(f"{path.relative_to(ROOT)}:{line}: imports {name}, which is not a stage package")
        elif STACK.index(target) > level:
            upward.append(f"{path.relative_to(ROOT)}:{line}: {package} imports {name} ({target} is above it)")
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_longer_than_the_limit(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES, path


@pytest.mark.parametrize("package", TORCH_FREE)
def test_the_pure_stages_never_import_torch(package):
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "torch" or n.startswith("torch.") for n in names), f"{path}:{node.lineno}"


def test_every_package_init_loads_lazily():
    """Importing any stage package (or a torch-free module inside one) imports no torch."""
    modules = [f"gaplan.{p}" for p in STACK] + ["gaplan.data.readers", "gaplan.plan.split", "gaplan.plan.search"]
    code = f"import sys; import {', '.join(modules)}; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _module_graph() -> dict[str, set[str]]:
    """gaplan's modules and the gaplan modules each imports, at the top or inside a function (a package's lazy
    ``__init__`` is left out: it imports nothing at its own import)."""
    names = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(("gaplan", *path.relative_to(ROOT).with_suffix("").parts))
        names[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {name: set() for name in names}
    for name, path in names.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                       if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            graph[name] |= {t for t in targets if t in names and t != name and not name.startswith(t + ".")
                            and not names[t].name == "__init__.py"}
    return graph


def test_the_import_graph_has_no_circle():
    graph, seen, done, circles = _module_graph(), set(), set(), []

    def visit(name: str, path: list[str]) -> None:
        seen.add(name)
        for target in sorted(graph[name]):
            if target in path:
                circles.append(" -> ".join([*path[path.index(target):], target]))
            elif target not in done and target not in seen:
                visit(target, [*path, target])
        done.add(name)

    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    assert not circles, "\n".join(circles)
