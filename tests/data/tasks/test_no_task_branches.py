"""Nothing outside the task components branches on a task's name: no comparison with a task constant or name, no
table keyed by one, no ``case`` on one, no name spelled out. What a task does is its component's (gaplan.data.tasks);
the rest asks it."""

from __future__ import annotations

import ast
import pathlib

from gaplan.core import tasks as names

ROOT = pathlib.Path(__file__).resolve().parents[3] / "gaplan"
ALLOWED = (ROOT / "data" / "tasks", ROOT / "core" / "tasks.py")  # the components, and the names themselves
CONSTANTS = {"CAUSAL_LM", "MASKED_LM", "CLASSIFICATION", "SEQ2SEQ_LM", "CUSTOM"}
LITERALS = {getattr(names, c) for c in CONSTANTS}


def _is_task(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in CONSTANTS
    if isinstance(node, ast.Attribute):
        return node.attr in CONSTANTS
    if isinstance(node, ast.Constant):
        return node.value in LITERALS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_task(e) for e in node.elts)
    return False


def task_branches(source: str, where: str = "<source>") -> list[str]:
    """Each comparison with a task, table keyed by a task, ``case`` on a task and task name spelled as a literal
    (a pair list such as ``(("label_field", "classification"), ...)`` hides a comparison) in ``source``: one line
    each, by line number."""
    found: dict[int, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_is_task(n) for n in (node.left, *node.comparators)):
            found.setdefault(node.lineno, f"compares with a task: {ast.unparse(node)}")
        elif isinstance(node, ast.Dict) and any(k is not None and _is_task(k) for k in node.keys):
            found.setdefault(node.lineno, "a table keyed by task")
        elif isinstance(node, ast.MatchValue) and _is_task(node.value):
            found.setdefault(node.lineno, "case on a task")
        elif isinstance(node, ast.Constant) and node.value in LITERALS:
            found.setdefault(node.lineno, f"spells the task {node.value!r} out (its constant, or its component)")
    return [f"{where}:{line}: {what}" for line, what in sorted(found.items())]


def test_the_scan_finds_each_kind_of_branch_and_passes_a_dispatch():
    branches = task_branches("""
if task == CAUSAL_LM: pass
if task in (SEQ2SEQ_LM, MASKED_LM): pass
if "causal-lm" != task: pass
if spec.task is tasks.CLASSIFICATION: pass
TYPES = {CAUSAL_LM: "CAUSAL_LM"}
match task:
    case "seq2seq-lm": pass
for name, wanted in (("label_field", "classification"),): pass
""")
    assert [b.split(":")[1] for b in branches] == ["2", "3", "4", "5", "6", "8", "9"], branches
    assert task_branches("""
def load(path, task=CAUSAL_LM):
    if task_component(task).has_target and spec.task not in task_names(): pass
    return PRESETS[CAUSAL_LM], "a causal-lm model"
""") == []


def test_no_module_outside_the_components_branches_on_a_task():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if any(path == a or a in path.parents for a in ALLOWED):
            continue
        found += task_branches(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, "\n".join(found)
