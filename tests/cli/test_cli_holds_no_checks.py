"""The CLI only parses text into the library's objects, calls the library and prints: no module under gaplan/cli/
raises a user error of its own or compares an option's value (every refusal comes from gaplan/workflows or below,
so a Python caller gets it too). Read statically: an AST scan of gaplan/cli/*.py."""

import ast
import pathlib

import pytest

from tests.conftest import REPO_ROOT

CLI = pathlib.Path(REPO_ROOT) / "gaplan" / "cli"

# Names that hold the parsed options or what is built from them in the command modules: a comparison reading one is
# a check of an option's value (or plan logic), which belongs below the CLI.
OPTION_NAMES = {"options", "params", "command", "setup", "spec", "train_options", "probe_options", "settings"}

# Modules left out of the comparison rule, with why (they take no options).
ALLOWED = {
    "output.py": "prints results: the comparisons read a result (its own record of the spec, its ranks and sizes), "
                 "never the parsed options",
}


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def findings(source: str, filename: str = "<source>") -> list[str]:
    """Each ``raise`` of an error (a bare re-raise aside) and each comparison that reads an option, as ``file:line``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Raise) and node.exc is not None:
            found.append(f"{filename}:{node.lineno}: raise {ast.unparse(node.exc)}")
        elif isinstance(node, ast.Compare) and _names(node) & OPTION_NAMES:
            found.append(f"{filename}:{node.lineno}: compares {ast.unparse(node)}")
    return found


def test_no_cli_module_raises_an_error_or_compares_an_option():
    found = []
    for path in sorted(CLI.glob("*.py")):
        source = path.read_text(encoding="utf-8")
        if path.name in ALLOWED:
            found += [line for line in findings(source, path.name) if " raise " in line]
        else:
            found += findings(source, path.name)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("check", [
    'raise GaplanError("--threads applies to --device cpu")',
    'raise click.BadParameter("no")',
    'raise click.UsageError("no")',
    'if options["world_size"] != 1:\n    pass',
    'if options.get("batch_by") == "tokens":\n    pass',
    'x = "--report" if options["objective"] in ("throughput", "goodput") else ""',
    'if command.probe.world_size > 1:\n    pass',
    'if spec.parallel == "fsdp":\n    pass',
])
def test_the_scan_finds_a_reintroduced_check(check):
    clean = 'def f(**options):\n    if options["as_json"]:\n        print(1)\n'
    assert findings(clean) == []
    assert len(findings(clean + "\n" + check + "\n")) == 1
