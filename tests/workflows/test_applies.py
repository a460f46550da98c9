"""Nothing given is ignored: each conditional option of ``gaplan train``, given where it does not apply, is one line
that names it (exit 2, nothing written); the docs' table is the declarations'; every flag is declared conditional or
listed here as applying everywhere."""

import json
import re

import click
import pytest
from click.testing import CliRunner

from gaplan.cli.main import main
from gaplan.workflows.applies import TRAIN_SCOPES, scope_table
from tests.conftest import REPO_ROOT

# The flags that apply to every run (a new flag is either declared in gaplan/workflows/applies.py or added here).
EVERYWHERE = {"--attention", "--batch-by", "--batch-schedule", "--checkpoint-every", "--compare", "--compile", "--data",
              "--device", "--dtype", "--effective-batch", "--enforce-memory-limit", "--grad-checkpointing", "--init", "--json",
              "--lora", "--lora-alpha", "--lora-config", "--lora-dropout", "--lora-targets", "--lr", "--max-grad-norm",
              "--memory-limit", "--micro-batch", "--model", "--noise-scale", "--optimizer", "--out", "--parallel",
              "--plan", "--quiet", "--resume", "--save-model", "--save-weights", "--seed", "--seq-len",
              "--source-len", "--steps", "--task", "--threads", "--trust-remote-code", "--warmup-steps",
              "--weights-dtype"}


def test_every_flag_of_train_is_declared_conditional_or_applies_everywhere():
    flags = {p.opts[0] for p in main.commands["train"].params if isinstance(p, click.Option)}
    declared = {scope.flag for scope in TRAIN_SCOPES}
    assert not declared & EVERYWHERE
    assert flags == declared | EVERYWHERE, sorted(flags ^ (declared | EVERYWHERE))


@pytest.mark.parametrize("scope", TRAIN_SCOPES, ids=lambda scope: scope.flag)
def test_an_option_given_where_it_does_not_apply_is_one_line_naming_it(scope, tmp_path):
    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps({"text": f"sample {i}", "y": "x"}) + "\n" for i in range(8)))
    misuse = [str(data) if arg == "{data}" else arg for arg in scope.misuse]
    out = tmp_path / "never-written"
    result = CliRunner().invoke(main, ["train", "--quiet", "--micro-batch", "4", "--steps", "1", "--threads", "1",
                                       "--device", "cpu", "--out", str(out), *misuse])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, (result.exit_code, result.output)
    assert scope.flag in lines[0], lines[0]
    assert not out.exists()


def test_the_docs_table_is_the_declarations():
    with open(f"{REPO_ROOT}/docs/train.md", encoding="utf-8") as handle:
        text = handle.read()
    match = re.search(r"<!-- generated: gaplan\.workflows\.applies\.scope_table -->\n(.*?)\n<!-- end generated -->",
                      text, re.S)
    assert match and match.group(1) == scope_table()
