"""Nothing given is ignored: each conditional option of ``gaplan train``, ``probe``, ``bench``, ``estimate`` and
``plan`` (its field's or click option's ``applies``), given where it does not apply, is one line that names it (exit 2,
nothing written); the docs' tables are the commands'; every flag is conditional or listed here as applying everywhere,
and every conditional one has a misuse below."""

import json
import re

import click
import pytest
from click.testing import CliRunner

from gaplan.cli.main import main
from gaplan.cli.reference import conditional_options, scope_table
from tests.conftest import REPO_ROOT

WORKLOAD = {"--attention", "--compile", "--device", "--dtype", "--effective-batch", "--grad-checkpointing", "--init",
            "--json",
            "--lora", "--lora-alpha", "--lora-config", "--lora-dropout", "--lora-targets", "--lr", "--memory-limit",
            "--model", "--optimizer", "--parallel", "--quiet", "--seq-len", "--source-len", "--task", "--threads",
            "--trust-remote-code", "--weights-dtype"}
# The flags that apply to every run of each command (a new flag either says where it applies, ``applies=`` in its
# field's metadata or its click option, or is added here).
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
             "--measure", "--memory-limit", "--model", "--nodes", "--optimizer", "--out", "--overwrite", "--quiet", "--seq-len",
             "--source-len", "--task", "--trust-remote-code", "--world-size"},
}
# Each conditional option given where it does not apply: a command line (after the command's name and BASE's words;
# ``{data}`` is a JSONL file of text records).
WORKLOAD_MISUSES = {
    "--cpu-offload": ("--cpu-offload",),
    "--grad-sync": ("--grad-sync", "every"),
    "--lora-r": ("--lora-r", "8"),
    "--quantize": ("--quantize", "4bit"),
    "--target-len": ("--target-len", "8"),
    "--loss": ("--model", "tiny-bert-cls", "--loss", "chunked"),
    "--offload-activations": ("--device", "cpu", "--offload-activations"),
}
DATA_MISUSES = {flag: (flag, value) for flag, value in (
    ("--text-field", "body"), ("--label-field", "y"), ("--target-field", "y"), ("--long-samples", "truncate"),
    ("--tokenizer", "bytes"))}
BY_TOKENS = ("--batch-by", "tokens", "--data", "{data}")
MISUSES = {
    "train": {**WORKLOAD_MISUSES, **DATA_MISUSES,
              "--label-field": ("--data", "{data}", "--label-field", "y"),
              "--target-field": ("--data", "{data}", "--target-field", "y"),
              "--merge": ("--merge",),
              "--effective-batch-min": ("--effective-batch-min", "4"),
              "--lr-scaling": ("--lr-scaling", "sqrt"),
              "--token-budget": ("--token-budget", "64"),
              "--effective-tokens": ("--effective-tokens", "256"),
              "--granule": ("--granule", "32"),
              "--token-plan": ("--token-plan", "tokens.json"),
              "--overwrite": ("--resume", "reports/run", "--overwrite")},
    "probe": {**WORKLOAD_MISUSES, **DATA_MISUSES,
              "--batch-range": ("--batch-range", "4:64"),
              "--measure-steps": ("--measure-steps", "10"),
              "--data": ("--data", "{data}"),
              "--granule": ("--granule", "32"),
              "--target": ("--target", "h100-80gb"),
              **{flag: (*BY_TOKENS, flag, *value) for flag, value in (
                  ("--report", ()), ("--objective", ("throughput",)), ("--seed-from-estimate", ()),
                  ("--search-cap", ("4",)), ("--margin", ("0.1",)), ("--emit", ("hf",)))},
              **{flag: (flag, *value) for flag, value in (
                  ("--repeats", ("3",)), ("--warmup", ("2",)), ("--rounds", ("4",)), ("--max-rounds", ("5",)),
                  ("--ci-target", ("0.1",)), ("--time-budget", ("60",)), ("--all-splits", ()))}},
    "bench": {**WORKLOAD_MISUSES, **DATA_MISUSES,
              "--data": ("--data", "{data}"),
              "--granule": ("--granule", "32"),
              "--world-size": ("--world-size", "2"),
              "--plan": (*BY_TOKENS, "--plan", "plan.json"),
              **{flag: (*BY_TOKENS, flag, *value) for flag, value in (
                  ("--max-rounds", ("5",)), ("--ci-target", ("0.1",)), ("--time-budget", ("60",)),
                  ("--all-splits", ()), ("--no-large-batch", ()))}},
    "estimate": {**WORKLOAD_MISUSES, "--target": ("--device", "cpu", "--target", "h100-80gb")},
    "plan": {"--lora-r": ("--lora-r", "8"), "--quantize": ("--quantize", "4bit"), "--target-len": ("--target-len", "8"),
             "--target": ("--device", "cpu", "--target", "h100-80gb"),
             "--grad-sync": ("--layouts", "ddp", "--grad-sync", "every"),
             "--repeats": ("--repeats", "2"), "--threads": ("--threads", "2")},
}

# What every misuse is given with (a run that went ahead would be small, and on the CPU).
BASE = {
    "train": ["--quiet", "--micro-batch", "4", "--steps", "1", "--threads", "1", "--device", "cpu", "--out", "{out}"],
    "probe": ["--quiet", "--seq-len", "16", "--threads", "1", "--device", "cpu", "--out", "{out}"],
    "bench": ["--quiet", "--seq-len", "16", "--threads", "1", "--device", "cpu", "--out", "{out}"],
    "estimate": ["--quiet"],
    "plan": ["--quiet", "--out", "{out}"],
}
CASES = [pytest.param(command, flag, misuse, id=f"{command} {flag}") for command, misuses in MISUSES.items()
         for flag, misuse in misuses.items()]


@pytest.mark.parametrize("command", MISUSES)
def test_every_flag_is_conditional_with_a_misuse_or_applies_everywhere(command):
    flags = {p.opts[0] for p in main.get_command(None, command).params if isinstance(p, click.Option)}
    conditional = set(conditional_options(command))
    everywhere = EVERYWHERE[command] | EVERYWHERE_OF_ALL
    assert conditional == set(MISUSES[command]), sorted(conditional ^ set(MISUSES[command]))
    assert not conditional & everywhere
    assert flags == conditional | everywhere, sorted(flags ^ (conditional | everywhere))


@pytest.mark.parametrize("command, flag, misuse", CASES)
def test_an_option_given_where_it_does_not_apply_is_one_line_naming_it(command, flag, misuse, tmp_path):
    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps({"text": f"sample {i}", "y": "x"}) + "\n" for i in range(8)))
    out = tmp_path / "never-written"
    words = {"{data}": str(data), "{out}": str(out)}
    args = [words.get(arg, arg) for arg in (*BASE[command], *misuse)]
    result = CliRunner().invoke(main, [command, *args])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, (result.exit_code, result.output)
    assert flag in lines[0], lines[0]
    assert not out.exists()


@pytest.mark.parametrize("command, page", [("train", "train.md"), ("probe", "probe.md"),
                                           ("bench", "bench-and-reports.md"), ("estimate", "estimate.md"),
                                           ("plan", "sharded.md")])
def test_the_docs_table_is_the_commands(command, page):
    with open(f"{REPO_ROOT}/docs/{page}", encoding="utf-8") as handle:
        text = handle.read()
    match = re.search(rf"<!-- generated: gaplan\.cli\.reference\.scope_table\({command}\) -->\n(.*?)<!-- end generated -->",
                      text, re.S)
    assert match and match.group(1) == scope_table(command)
