"""Every gaplan import that the README and docs/ show runs: each ``from gaplan... import ...`` / ``import gaplan...``
line of their code blocks, and each ``module (`Name`)`` pair of the README's layout table, executed in one fresh
interpreter (so a renamed module or a name that moved fails here, not in a reader's script)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
IMPORT = re.compile(r"^\s*(?:>>> )?((?:from gaplan[\w.]* import|import gaplan)[^;#\\\n]*)", re.M)
# The layout table: | `integrations/` | transformers (...), hf_trainer (`GaplanTrainer`), ... |
TABLE_ROW = re.compile(r"^\| `(\w+)/` \| (.*) \|$", re.M)
MODULE_NAMES = re.compile(r"(\w+) \((`[^)]*)\)")  # a module, then the names it holds in backticks


def shown_imports() -> dict[str, list[str]]:
    """Each import statement the pages show, with the pages that show it."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        text = page.read_text()
        for block in FENCE.findall(text):
            for statement in IMPORT.findall(block):
                statement = statement.strip().rstrip(",")
                if statement.endswith("("):  # a parenthesized name list: the module itself must import
                    statement = statement.split(" import ")[0].replace("from ", "import ", 1)
                found.setdefault(statement, []).append(page.name)
    readme = (ROOT / "README.md").read_text()
    for package, cell in TABLE_ROW.findall(readme):
        for module, names in MODULE_NAMES.findall(cell):
            if (ROOT / "gaplan" / package / f"{module}.py").exists():
                for name in re.findall(r"`(\w+)`", names):
                    found.setdefault(f"from gaplan.{package}.{module} import {name}", []).append("README.md table")
    return found


def test_the_pages_show_imports_to_check():
    statements = shown_imports()
    assert len(statements) >= 8, statements
    assert "from gaplan.integrations.hf_trainer import GaplanTrainer" in statements  # the layout table's pair


def test_every_import_the_readme_and_docs_show_runs():
    statements = shown_imports()
    script = "\n".join(f"try:\n    {s}\nexcept Exception as exc:\n    print({s!r}, '->', type(exc).__name__, exc)"
                       for s in statements)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    failed = [line for line in done.stdout.splitlines() if " -> " in line]
    assert not failed, "\n".join(f"{line}   (shown in {statements[line.split(' -> ')[0].strip(chr(39))]})"
                                 for line in failed)
