"""Each typed option is parsed once, at the edge: by its click type (gaplan/cli/option_types.py), from the command line
or a config file; past it the library holds the typed value. Three checks: every command's option of a typed field
has its type; the parsers are called only where this file says why (a test fails on a second parser); and a
command line built into each command's object calls each parser once per option given.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from gaplan.cli.main import main
from gaplan.cli.option_types import (
    BATCH_RANGE,
    BYTES,
    CHECKPOINTING,
    LOCAL_PATH,
    LORA_TARGETS,
    LOSS,
    MODEL,
    SCHEDULE,
    SIZES,
    TOKENIZER,
    Parsed,
)
from gaplan.core.checkpointing import AUTO, Checkpointing

ROOT = pathlib.Path(__file__).resolve().parents[2] / "gaplan"

# The option (click's parameter name) -> its type, on every command that has it.
TYPED = {"grad_checkpointing": CHECKPOINTING, "memory_limit": BYTES, "batch_range": BATCH_RANGE, "sizes": SIZES,
         "batch_schedule": SCHEDULE, "loss": LOSS, "lora_targets": LORA_TARGETS, "data": LOCAL_PATH,
         "tokenizer": TOKENIZER, "model": MODEL}

# Every call of a parser in the package, by file, and why it is not a second parse of an option. (train.json's saved
# forms are read back by the field's own parse mark, in gaplan.core.options.from_saved: the field names its parser.)
PARSER_CALLS = {
    "parse_checkpointing_choice": {
        "gaplan/cli/option_types.py": "the click type: the command line's and a config file's text",
    },
    "parse_checkpointing": {
        "gaplan/core/checkpointing.py": "parse_checkpointing_choice: the forms other than auto",
        "gaplan/workload/spec.py": "WorkloadSpec.from_dict: a plan file's, cache's or worker message's saved form",
        "gaplan/report/sections.py": "the report reads plan.json's saved workload and tuner",
        "gaplan/plan/layouts.py": "a launch command from a saved workload dict",
    },
    "parse_bytes": {
        "gaplan/cli/option_types.py": "the click type",
        "gaplan/probing/edge.py": "probe(): the Python API's edge (text such as '2GiB'; an int passes)",
        "gaplan/probing/loop.py": "probe_loop(): the Python API's edge",
        "gaplan/estimate/estimator.py": "estimate(): the Python API's edge",
        "gaplan/integrations/lightning.py": "GaplanBatchSize(memory_limit=...): the Python API's edge",
        "gaplan/integrations/transformers.py": "the Trainer integration's memory_limit: the Python API's edge",
        "gaplan/devices/cpu.py": "bound_cpu_budget(): the Python API's edge",
        "gaplan/workflows/parse_options.py": "a command object a Python caller builds with memory_limit as text",
    },
    "parse_batch_range": {"gaplan/cli/option_types.py": "the click type"},
    "parse_schedule": {"gaplan/cli/option_types.py": "the click type"},
    "parse_sizes": {"gaplan/cli/option_types.py": "the click type"},
    "parse_loss": {
        "gaplan/cli/option_types.py": "the click type",
        "gaplan/workload/spec.py": "WorkloadSpec.__post_init__: the Python API's edge and a saved workload's text (a "
                                   "LossChoice passes through)",
    },
    "parse_lora_targets": {
        "gaplan/cli/option_types.py": "the click type",
        "gaplan/workload/spec.py": "WorkloadSpec.__post_init__: the Python API's edge and a saved workload's text",
        "gaplan/workload/lora.py": "read_adapter_config: an adapter_config.json's target_modules (--lora-config)",
    },
    "absolute_if_here": {
        "gaplan/cli/option_types.py": "the click type (--data)",
        "gaplan/data/source.py": "DataSource.__post_init__ and reads_as: the Python API's edge, a saved run's text; "
                                 "tokenizer_path: a tokenizer folder is a local path",
        "gaplan/workload/spec.py": "model_path: a model folder is a local path",
    },
    "tokenizer_path": {
        "gaplan/cli/option_types.py": "the click type",
        "gaplan/data/source.py": "DataSource.__post_init__ and reads_as: the Python API's edge, a saved run's text",
    },
    "model_path": {
        "gaplan/cli/option_types.py": "the click type",
        "gaplan/workload/spec.py": "WorkloadSpec.__post_init__: the Python API's edge and a saved workload's text",
    },
}


def _calls(name: str) -> set[str]:
    found = set()
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == name:
                found.add(str(path.relative_to(ROOT.parent)))
            elif isinstance(node, ast.Call) and any(isinstance(arg, ast.Name) and arg.id == name for arg in node.args):
                found.add(str(path.relative_to(ROOT.parent)))  # Parsed("...", parse_x): the click type
    return found


@pytest.mark.parametrize("name", sorted(PARSER_CALLS))
def test_each_parser_is_called_only_where_it_reads_text_or_a_saved_form(name):
    assert _calls(name) == set(PARSER_CALLS[name]), "a new call: a second parse of an option? " \
        "Parse at the edge (gaplan/cli/option_types.py) and pass the typed value on"


@pytest.mark.parametrize("command", main.list_commands())
def test_every_commands_typed_options_have_their_type(command):
    params = {param.name: param for param in main.get_command(None, command).params}
    for name, kind in TYPED.items():
        if name in params:
            assert params[name].type is kind, (command, name)
    assert all(isinstance(param.type, Parsed) == (param.name in TYPED) for param in params.values()
               if param.name in TYPED or isinstance(param.type, Parsed)), command


def _count_parses(monkeypatch) -> dict[str, int]:
    """Count every call of the parsers from the modules that import them (and the click types)."""
    import sys

    import gaplan.cli.option_types as types

    counts = dict.fromkeys(PARSER_CALLS, 0)
    for module in [m for name, m in list(sys.modules.items()) if name.startswith("gaplan") and m is not None]:
        for name in PARSER_CALLS:
            original = getattr(module, name, None)
            if callable(original) and original.__module__ != module.__name__:  # its users (a parser's own inner
                # calls are part of that one parse)
                def counted(*args, _name=name, _original=original, **kwargs):
                    result = _original(*args, **kwargs)
                    counts[_name] += not (args and result is args[0])  # a typed value (a default) passes through
                    return result
                monkeypatch.setattr(module, name, counted)
    # the click types hold the parser they were made with
    for kind in (CHECKPOINTING, BYTES, BATCH_RANGE, SIZES, SCHEDULE, LOSS, LORA_TARGETS, LOCAL_PATH, TOKENIZER, MODEL):
        monkeypatch.setattr(kind, "_parse", getattr(types, kind._parse.__name__))
    return counts


COMMAND_LINES = {
    "train": (["--grad-checkpointing", "every:2", "--memory-limit", "512MiB", "--micro-batch", "2", "--batch-schedule",
               "warmup:3", "--loss", "chunked:64"],
              {"parse_checkpointing_choice": 1, "parse_bytes": 1, "parse_schedule": 1, "parse_loss": 1}),
    "probe": (["--grad-checkpointing", "on", "--memory-limit", "1GiB", "--objective", "goodput", "--batch-range",
               "2:16"], {"parse_checkpointing_choice": 1, "parse_bytes": 1, "parse_batch_range": 1}),
    "bench": (["--grad-checkpointing", "layers:2", "--memory-limit", "1GiB", "--lora", "--lora-targets", "q_proj"],
              {"parse_checkpointing_choice": 1, "parse_bytes": 1, "parse_lora_targets": 1}),
    "estimate": (["--grad-checkpointing", "on", "--memory-limit", "2GiB", "--sizes", "2,8"],
                 {"parse_checkpointing_choice": 1, "parse_bytes": 1, "parse_sizes": 1}),
    "plan": (["--memory-limit", "40GiB"], {"parse_bytes": 1}),
}


@pytest.mark.parametrize("command", sorted(COMMAND_LINES))
def test_a_command_line_into_its_object_parses_each_typed_option_once(command, monkeypatch, tmp_path):
    from gaplan.cli.options import given_on_command_line
    from gaplan.workflows.bench_options import BenchCommand
    from gaplan.workflows.estimate_options import EstimateCommand
    from gaplan.workflows.plan_options import PlanCommand
    from gaplan.workflows.probe_options import ProbeCommand
    from gaplan.workflows.train_command import TrainCommand, prepare_train

    words, expected = COMMAND_LINES[command]
    counts = _count_parses(monkeypatch)
    from gaplan.workflows.parse_options import command_from_options

    classes = {"train": TrainCommand, "probe": ProbeCommand, "bench": BenchCommand, "estimate": EstimateCommand,
               "plan": PlanCommand}
    out = ["--out", str(tmp_path / "run")] if command != "estimate" else []
    with main.get_command(None, command).make_context(command, [*words, *out]) as ctx:
        built = command_from_options(classes[command], ctx.params, given_on_command_line(ctx))
        if command == "train":
            prepare_train(built)
    assert {name: count for name, count in counts.items() if count} == expected
    checkpointing = ctx.params.get("grad_checkpointing")
    if checkpointing is not None:  # the typed value, held as it was parsed
        assert isinstance(checkpointing, Checkpointing) and built.spec.grad_checkpointing is checkpointing
    assert isinstance(ctx.params["memory_limit"], int)


@pytest.mark.parametrize("command", ["train", "bench"])
def test_auto_without_a_plan_is_one_line_naming_both_flags(command, tmp_path):
    from click.testing import CliRunner

    result = CliRunner().invoke(main, [command, "--grad-checkpointing", AUTO, "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--grad-checkpointing auto is decided by gaplan probe; give its --plan" in lines[0]
    assert not (tmp_path / "run").exists()
