"""The library gets every refusal the CLI gets, word for word: each bad command line of the suite's cases (``gaplan
train``'s declared misuses and cases here; the bad-input lists of tests/cli for probe, estimate, plan and bench),
parsed by click into the library's objects (``TrainCommand``, ``ProbeCommand``, ``EstimateCommand``, ``PlanCommand``,
``BenchCommand``) and run by the library's functions, raises the line the CLI prints (its fields named as the
CLI's flags)."""

import json
import re

import click
import pytest
from click.testing import CliRunner

from gaplan.cli.main import main
from gaplan.cli.options import given_on_command_line
from gaplan.core.errors import GaplanError
from gaplan.core.options import OptionError, flag
from gaplan.workflows.bench_options import BenchCommand
from gaplan.workflows.estimate_options import EstimateCommand
from gaplan.workflows.parse_options import command_from_options
from gaplan.workflows.plan_options import PlanCommand
from gaplan.workflows.probe_options import ProbeCommand
from gaplan.workflows.run_commands import run_bench_command, run_estimate_command, run_plan_command, run_probe_command
from gaplan.workflows.train import run_train
from gaplan.workflows.train_command import TrainCommand, prepare_train
from tests.cli import (
    test_estimate_cli,
    test_goodput_cli,
    test_plan_cli,
    test_probe_cli,
    test_probe_fsdp,
    test_probe_tokens,
)
from tests.workflows.test_applies import MISUSES


def _train(params, given):
    setup = prepare_train(command_from_options(TrainCommand, params, given))
    run_train(setup.spec, setup.run_dir, setup.options, device=setup.device, memory_limit=setup.memory_limit)


LIBRARY = {
    "train": _train,
    "probe": lambda params, given: run_probe_command(command_from_options(ProbeCommand, params, given)),
    "bench": lambda params, given: run_bench_command(command_from_options(BenchCommand, params, given)),
    "estimate": lambda params, given: run_estimate_command(command_from_options(EstimateCommand, params, given)),
    "plan": lambda params, given: run_plan_command(command_from_options(PlanCommand, params, given)),
}


def assert_same_line(argv: list[str]) -> None:
    """``gaplan ARGV`` exits 2 with one line, and the library, given what click parsed of ARGV, raises it."""
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2, result.output
    cli_line = result.stderr.strip()
    name, args = argv[0], argv[1:]
    command = main.get_command(None, name)
    flags = {p.name: p.opts[0] for p in command.params if isinstance(p, click.Option)}
    # The parsing alone runs in click's context (which options were given is the parser's to know).
    with pytest.raises(GaplanError) as raised, command.make_context(name, list(args)) as context:
        LIBRARY[name](context.params, given_on_command_line(context))
    error = raised.value
    line = error.for_cli(lambda field: flags.get(field) or flag(field)) if isinstance(error, OptionError) \
        else str(error)
    # The machine's free memory, which a --memory-limit above it quotes, moves between the two calls.
    free = re.compile(r"available memory \([0-9.]+ [KMGT]iB\)")
    assert free.sub("available memory (N)", cli_line) == free.sub("available memory (N)", f"gaplan: {line}")


TRAIN_CASES = list(MISUSES["train"].values()) + [
    ("--effective-batch", "0"),
    ("--max-grad-norm", "-1"),
    ("--seed", "99999999999999999999999"),  # past torch.manual_seed's range: a ValueError traceback
    ("--batch-schedule", "sometimes"),
    ("--batch-schedule", "adaptive", "--effective-batch", "16", "--effective-batch-min", "32"),
    ("--batch-schedule", "adaptive", "--no-noise-scale"),
    ("--batch-schedule", "adaptive", "--micro-batch", "1", "--effective-batch", "1"),
    ("--parallel", "fsdp", "--batch-schedule", "warmup:10"),
    ("--batch-by", "tokens", "--token-budget", "64", "--batch-schedule", "adaptive"),
    ("--batch-by", "tokens", "--token-budget", "64", "--token-plan", "tokens.json"),
    ("--save-weights", "{dir}"),
    ("--merge",),
    ("--lora-r", "16"),  # given at its default: still refused without --lora
    ("--data", "{data}", "--target-field", "target"),  # issue 46's example: at its default, on a causal LM
]


@pytest.mark.parametrize("misuse", TRAIN_CASES, ids=lambda case: " ".join(case))
def test_run_train_raises_the_line_the_cli_prints(misuse, tmp_path):
    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps({"text": f"sample {i}", "y": "x"}) + "\n" for i in range(8)))
    args = [str(data) if a == "{data}" else str(tmp_path) if a == "{dir}" else a for a in misuse]
    base = ["--quiet", "--steps", "1", "--threads", "1", "--device", "cpu", "--out", str(tmp_path / "run")]
    if "--micro-batch" not in args and "--batch-by" not in args:
        base += ["--micro-batch", "4"]
    assert_same_line(["train", *base, *args])


def _suite_cases() -> list[tuple[str, list[str]]]:
    """Every bad probe/estimate/plan/bench (and train) command line of tests/cli's bad-input lists, as those tests
    give it (``{out}``: a run folder never written)."""
    out = ["--out", "{out}"]
    cases = [["probe", "--quiet", *args, *out] for args, _ in test_probe_cli.BAD_INPUT if "--out" not in args]
    cases += [["probe", "--quiet", *args] for args, _ in test_probe_cli.BAD_INPUT if "--out" in args]
    cases += [["estimate", "--quiet", *args] for args, _ in test_estimate_cli.BAD_INPUT]
    cases += [["estimate", "--quiet", *args] for args, _ in test_plan_cli.BAD_ESTIMATE_SHARDING]
    cases += [["plan", "--quiet", *out, *args] for args, _ in test_plan_cli.BAD_PLAN_INPUT]
    cases += [[*args, "--quiet", *out] for args, _ in test_goodput_cli.BAD_INPUT]
    cases += [[*args, "--quiet", *out] for args, _ in test_probe_tokens.BAD_INPUT]
    cases += [[command, *test_probe_fsdp.SMALL, "--quiet", *args, *out]
              for command, args, _ in test_probe_fsdp.BAD_INPUT]
    cases += [["probe", "--model", "tiny-gpt2", "--target-len", "8"],  # tests/cli/test_seq2seq_cli.py
              ["probe", "--device", "cpu", "--memory-limit", "100TB", "--quiet", *out]]  # test_probe_claims.py
    return [pytest.param(case, id=" ".join(case),
                         marks=[pytest.mark.heavy] if any(word in REACH_THE_MODEL for word in case) else [])
            for case in cases]


# Cases refused only once the model is built or looked up (10-30 s each here, twice: the CLI and the library).
REACH_THE_MODEL = {"50MiB", "no-such-model", "nosuchmodule:make", "json:no_such_function", "4096"}


@pytest.mark.parametrize("argv", _suite_cases())
def test_the_library_objects_raise_the_line_the_cli_prints(argv, tmp_path):
    if "cuda" in argv and test_probe_cli._has_cuda():
        pytest.skip("this machine has CUDA")
    assert_same_line([str(tmp_path / "out") if word == "{out}" else word for word in argv])
    assert not (tmp_path / "out").exists()
