"""Nothing given is ignored: each conditional option of ``gaplan train``, ``probe``, ``bench``, ``estimate`` and
``plan``, given where it does not apply, is one line that names it (exit 2, nothing written); the docs' tables are
the declarations'; every flag is declared conditional or listed here as applying everywhere."""

import json
import re

import click
import pytest
from click.testing import CliRunner

from gaplan.cli.main import main
from gaplan.workflows.applies import SCOPES, scope_table
from tests.conftest import REPO_ROOT

WORKLOAD = {"--attention", "--compile", "--device", "--dtype", "--effective-batch", "--grad-checkpointing", "--init",
            "--json",
            "--lora", "--lora-alpha", "--lora-config", "--lora-dropout", "--lora-targets", "--lr", "--memory-limit",
            "--model", "--optimizer", "--parallel", "--quiet", "--seq-len", "--source-len", "--task", "--threads",
            "--trust-remote-code", "--weights-dtype"}
# The flags that apply to every run of each command (a new flag is either declared in gaplan/workflows/applies.py or
# added here).
EVERYWHERE_OF_ALL = {"--config", "--print-config"}  # every command's (gaplan/cli/config_file.py)
EVERYWHERE = {
    "train": WORKLOAD | {"--batch-by", "--batch-schedule", "--checkpoint-every", "--compare", "--data",
                         "--enforce-memory-limit", "--max-grad-norm", "--micro-batch", "--noise-scale", "--out",
                         "--plan", "--resume", "--save-model", "--save-weights", "--seed", "--steps", "--warmup-steps"},
    "probe": WORKLOAD | {"--batch-by", "--out", "--overwrite", "--world-size"},
    "bench": WORKLOAD | {"--batch-by", "--out", "--overwrite", "--repeats", "--rounds", "--warmup"},
    "estimate": WORKLOAD | {"--gpus-per-node", "--list-targets", "--nodes", "--search-cap", "--sizes", "--world-size"},
    "plan": {"--attention", "--device", "--dtype", "--effective-batch", "--gpus-per-node", "--json", "--layouts",
             "--levers", "--lora", "--lora-alpha", "--lora-config", "--lora-dropout", "--lora-targets", "--loss", "--lr",
             "--margin",
             "--measure", "--memory-limit", "--model", "--nodes", "--optimizer", "--out", "--quiet", "--seq-len",
             "--source-len", "--task", "--trust-remote-code", "--world-size"},
}
# What every misuse is given with (a run that went ahead would be small, and on the CPU).
BASE = {
    "train": ["--quiet", "--micro-batch", "4", "--steps", "1", "--threads", "1", "--device", "cpu", "--out", "{out}"],
    "probe": ["--quiet", "--seq-len", "16", "--threads", "1", "--device", "cpu", "--out", "{out}"],
    "bench": ["--quiet", "--seq-len", "16", "--threads", "1", "--device", "cpu", "--out", "{out}"],
    "estimate": ["--quiet"],
    "plan": ["--quiet", "--out", "{out}"],
}
CASES = [pytest.param(command, scope, id=f"{command} {scope.flag}") for command, scopes in SCOPES.items()
         for scope in scopes]


@pytest.mark.parametrize("command", SCOPES)
def test_every_flag_is_declared_conditional_or_applies_everywhere(command):
    flags = {p.opts[0] for p in main.get_command(None, command).params if isinstance(p, click.Option)}
    declared = {scope.flag for scope in SCOPES[command]}
    everywhere = EVERYWHERE[command] | EVERYWHERE_OF_ALL
    assert not declared & everywhere
    assert flags == declared | everywhere, sorted(flags ^ (declared | everywhere))


@pytest.mark.parametrize("command, scope", CASES)
def test_an_option_given_where_it_does_not_apply_is_one_line_naming_it(command, scope, tmp_path):
    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps({"text": f"sample {i}", "y": "x"}) + "\n" for i in range(8)))
    out = tmp_path / "never-written"
    words = {"{data}": str(data), "{out}": str(out)}
    args = [words.get(arg, arg) for arg in (*BASE[command], *scope.misuse)]
    result = CliRunner().invoke(main, [command, *args])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, (result.exit_code, result.output)
    assert scope.flag in lines[0], lines[0]
    assert not out.exists()


@pytest.mark.parametrize("command, page", [("train", "train.md"), ("probe", "probe.md"),
                                           ("bench", "bench-and-reports.md"), ("estimate", "estimate.md"),
                                           ("plan", "sharded.md")])
def test_the_docs_table_is_the_declarations(command, page):
    with open(f"{REPO_ROOT}/docs/{page}", encoding="utf-8") as handle:
        text = handle.read()
    marker = "gaplan\\.workflows\\.applies\\.scope_table" + ("" if command == "train" else f"\\({command}\\)")
    match = re.search(rf"<!-- generated: {marker} -->\n(.*?)\n<!-- end generated -->", text, re.S)
    assert match and match.group(1) == scope_table(command)
