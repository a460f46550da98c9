"""The library gets every refusal the CLI gets, word for word: each bad ``gaplan train`` command line of the suite's
cases, parsed by click into the library's objects (the workload spec and ``TrainOptions``, as the CLI builds them)
and given to ``run_train`` directly, raises the line the CLI prints (its fields named as the CLI's flags)."""

import json

import click
import pytest
from click.testing import CliRunner

from gaplan.cli.main import main
from gaplan.cli.options import memory_limit_from_options, spec_from_options
from gaplan.core.errors import GaplanError
from gaplan.core.options import OptionError
from gaplan.workflows.applies import TRAIN_SCOPES
from gaplan.workflows.train import run_train
from gaplan.workflows.train_options import TrainOptions

CASES = [scope.misuse for scope in TRAIN_SCOPES if "--token-plan" not in scope.misuse] + [
    ("--effective-batch", "0"),
    ("--max-grad-norm", "-1"),
    ("--batch-schedule", "sometimes"),
    ("--batch-schedule", "adaptive", "--effective-batch", "16", "--effective-batch-min", "32"),
    ("--batch-schedule", "adaptive", "--no-noise-scale"),
    ("--batch-schedule", "adaptive", "--micro-batch", "1", "--effective-batch", "1"),
    ("--parallel", "fsdp", "--batch-schedule", "warmup:10"),
    ("--batch-by", "tokens", "--token-budget", "64", "--batch-schedule", "adaptive"),
    ("--save-weights", "{dir}"),
    ("--merge",),
]


@pytest.mark.parametrize("misuse", CASES, ids=lambda case: " ".join(case))
def test_run_train_raises_the_line_the_cli_prints(misuse, tmp_path):
    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps({"text": f"sample {i}", "y": "x"}) + "\n" for i in range(8)))
    args = [str(data) if a == "{data}" else str(tmp_path) if a == "{dir}" else a for a in misuse]
    base = ["--quiet", "--steps", "1", "--threads", "1", "--device", "cpu", "--out", str(tmp_path / "run")]
    if "--micro-batch" not in args and "--batch-by" not in args:
        base += ["--micro-batch", "4"]
    result = CliRunner().invoke(main, ["train", *base, *args])
    assert result.exit_code == 2, result.output
    cli_line = result.stderr.strip()

    command = main.commands["train"]
    flags = {p.name: p.opts[0] for p in command.params if isinstance(p, click.Option)}
    # The parsing step alone runs in click's context (which options were given is the parser's to know).
    with pytest.raises(GaplanError) as raised, command.make_context("train", [*base, *args]) as context:
        params = context.params
        spec = spec_from_options(params)
        options = TrainOptions.from_flat(params, resume=False)
        run_train(spec, str(tmp_path / "run"), options, device=params["device"],
                  memory_limit=memory_limit_from_options(params))
    error = raised.value
    line = error.for_cli(lambda name: flags.get(name, "--" + name.replace("_", "-"))) \
        if isinstance(error, OptionError) else str(error)
    assert cli_line == f"gaplan: {line}"
