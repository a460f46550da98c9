"""``--config FILE`` and ``--print-config`` on every command: the file's options are the flags' (parsed by the same
types, checked by the same rules), a flag given wins, the printed config reads back to itself, and a bad key, value
or file is one line, exit 2."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from gaplan.cli.main import main

# Each command with some of its flags (given where they apply), and what its positional arguments need.
FLAGS = {
    "train": ["--effective-batch", "64", "--seq-len", "32", "--grad-checkpointing", "every:2", "--lr", "0.0005",
              "--no-noise-scale", "--steps", "3"],
    "probe": ["--effective-batch", "32", "--memory-limit", "512MiB", "--dtype", "bf16", "--margin", "0.05"],
    "bench": ["--effective-batch", "16", "--rounds", "2", "--seq-len", "16"],
    "estimate": ["--model", "tiny-llama", "--seq-len", "128", "--target", "h100-80gb", "--world-size", "2"],
    "plan": ["--effective-batch", "128", "--memory-limit", "2GiB", "--world-size", "2"],
}
FILE = {
    "train": 'effective-batch = 64\nseq-len = 32\ngrad-checkpointing = "every:2"\nlr = 0.0005\nnoise-scale = false\n'
             'steps = 3\n',
    "probe": 'effective-batch = 32\nmemory-limit = "512MiB"\ndtype = "bf16"\nmargin = 0.05\n',
    "bench": 'effective-batch = 16\nrounds = 2\nseq-len = 16\n',
    "estimate": 'model = "tiny-llama"\nseq-len = 128\ntarget = "h100-80gb"\nworld-size = 2\n',
    "plan": 'effective-batch = 128\nmemory-limit = "2GiB"\nworld-size = 2\n',
}


def printed(*args: str) -> str:
    result = CliRunner().invoke(main, [*args, "--print-config"])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("command", FLAGS)
def test_a_config_file_gives_what_the_flags_give_and_its_print_reads_back(command, tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(f"[{command}]\n{FILE[command]}")
    from_flags = printed(command, *FLAGS[command])
    assert printed(command, "--config", str(path)) == from_flags
    assert from_flags != printed(command)  # the flags changed something
    again = tmp_path / "again.toml"
    again.write_text(from_flags)  # the printed config is a config
    assert printed(command, "--config", str(again)) == from_flags


def test_the_printed_config_is_nested_as_the_objects_are(tmp_path):
    """[train] holds the run's own options, [train.workload] the spec's fields, [train.data] the data's, [train.loop]
    the loop's; each key once, in the table of the object that holds it."""
    import dataclasses

    from gaplan.training.config import LoopOptions
    from gaplan.workflows.config_file import read_toml
    from gaplan.workload.spec import WorkloadSpec

    path = tmp_path / "printed.toml"
    path.write_text(printed("train", *FLAGS["train"]))
    data = read_toml(str(path))["train"]
    assert data["loop"] == {"steps": 3, "seed": 0, "warmup-steps": 0, "noise-scale": False, "checkpoint-every": 0}
    assert data["workload"]["seq-len"] == 32 and data["workload"]["grad-checkpointing"] == "every:2"
    assert data["effective-batch"] == 64 and "steps" not in data and "seq-len" not in data
    loop_fields = {f.name for f in dataclasses.fields(LoopOptions)}
    assert {key.replace("-", "_") for key in data["loop"]} == loop_fields - {"max_grad_norm"}  # None: left out
    assert set(data["workload"]) <= {f.name.replace("_", "-") for f in dataclasses.fields(WorkloadSpec)} | {
        "source-len", "lora-config"}  # the spec's fields, and the two options read into them


def test_a_flag_given_wins_over_the_file_and_the_file_counts_as_given(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('seq-len = 32\n')  # no table: the invoked command's own
    assert "seq-len = 16\n" in printed("train", "--config", str(path), "--seq-len", "16")
    path.write_text('seq-len = 32\nlora-r = 8\n')
    result = CliRunner().invoke(main, ["train", "--config", str(path), "--steps", "1", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and result.stderr.strip() == \
        "gaplan: --lora-r sets LoRA adapters, and --lora is off: add --lora, or leave it out"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("text, line", [
    ("[train]\nefective-batch = 3\n", "[train] has no option 'efective-batch' (did you mean effective-batch?)"),
    ('[train]\neffective-batch = "many"\n', "[train] effective-batch = 'many': 'many' is not a valid integer."),
    ('[train]\ngrad-sync = "sometimes"\n', "[train] grad-sync = 'sometimes': "),
    ("[probe]\nseq-len = 16\n", "no [train] table (it has [probe])"),
    ("[train.loop]\nmodel = 'tiny-llama'\n", "[train.loop] has no option 'model' (it is in [train.workload])"),
    ("[train.model]\nseq-len = 16\n", "[train.model] is not a table of train (its tables: data, loop, workload)"),
    ("[train.loop]\nsteps = 'x'\n", "[train.loop] steps = 'x': 'x' is not a valid integer."),
    ("[train.loop]\nsteps = 2.5\n", "[train.loop] steps = 2.5: 2.5 is not an integer"),  # not cut to 2
    ("[train.loop]\nsteps = [1, 2]\n", "[train.loop] steps = [1, 2]: [1, 2] is not an integer"),
    ("[train.loop]\nlr = true\n", "[train.loop] lr = True: True is not a number"),
    # A switch given a number said Python's "'int' object has no attribute 'strip'"; a list for a text option was
    # taken as its Python text ("['tiny-gpt2']"), printed back so by --print-config.
    ("[train]\nquiet = 1\n", "[train] quiet = 1: a switch is true or false"),
    ("[train.workload]\nlora = [true]\n", "[train.workload] lora = [True]: a switch is true or false"),
    ("[train.workload]\nmodel = ['tiny-gpt2']\n",
     "[train.workload] model = ['tiny-gpt2']: ['tiny-gpt2'] is not a string (\"text\" in quotes)"),
    ("[train.workload]\noptimizer = 5\n", "[train.workload] optimizer = 5: 5 is not a string"),
    ("[train\n", "not TOML"),
    (b"\xff\xfe\x00binary", "not TOML (not UTF-8 text: byte 0xff at offset 0)"),  # tomllib decodes before it parses
    (b"[train]\nsteps = 2\n\xff\n", "not TOML (not UTF-8 text: byte 0xff at offset 18)"),
])
def test_a_bad_file_is_one_line(text, line, tmp_path):
    path = tmp_path / "run.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    result = CliRunner().invoke(main, ["train", "--config", str(path), "--out", str(tmp_path / "o")])
    lines = [text for text in result.stderr.splitlines() if text.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"gaplan: --config {path}: {line}"), \
        result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", [*FLAGS, "report"])
def test_help_is_in_sections_and_lists_every_option_once(command):
    """--help groups the options (model and data, memory, plan, training, timing, output); a new option must name its
    section (its field's ``section``, or ``sectioned(SECTION, ...)``): none lands in "Other options"."""
    import click

    from gaplan.core.options import SECTIONS as HELP_SECTIONS

    text = CliRunner().invoke(main, [command, "--help"]).stdout
    headings = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert "Other options" not in headings and "Output" in headings, headings
    assert [h for h in HELP_SECTIONS if h in headings] == [h for h in headings if h in HELP_SECTIONS]  # in order
    for param in main.get_command(None, command).params:
        if isinstance(param, click.Option) and not param.hidden:
            long = next(opt for opt in param.opts if opt.startswith("--"))
            listed = re.findall(rf"^  (?:-\w, )?{re.escape(long)}(?![\w-])", text, re.MULTILINE)
            assert len(listed) == 1, (command, long, listed)


@pytest.mark.parametrize("command", FLAGS)
def test_a_config_file_builds_the_same_command_object_as_the_flags(command, tmp_path):
    """What the command runs, not only what it prints: the object built from the file equals the flags' (the values
    given in the file count as given, as flags do)."""
    from gaplan.cli.options import given_on_command_line
    from gaplan.workflows.bench_options import BenchCommand
    from gaplan.workflows.estimate_options import EstimateCommand
    from gaplan.workflows.parse_options import command_from_options
    from gaplan.workflows.plan_options import PlanCommand
    from gaplan.workflows.probe_options import ProbeCommand
    from gaplan.workflows.train_command import TrainCommand

    cls = {"train": TrainCommand, "probe": ProbeCommand, "bench": BenchCommand, "estimate": EstimateCommand,
           "plan": PlanCommand}[command]
    path = tmp_path / "run.toml"
    path.write_text(f"[{command}]\n{FILE[command]}")
    out = [] if command == "estimate" else ["--out", str(tmp_path / "run")]
    objects = []
    for args in (FLAGS[command], ["--config", str(path)]):
        with main.get_command(None, command).make_context(command, [*args, *out]) as ctx:
            objects.append(command_from_options(cls, ctx.params, given_on_command_line(ctx)))
    assert objects[0] == objects[1]


@pytest.mark.slow
def test_a_train_run_saves_its_config_and_the_config_repeats_the_run(tmp_path):
    import json

    first, second = tmp_path / "first", tmp_path / "second"
    args = ["train", "--seq-len", "16", "--effective-batch", "4", "--micro-batch", "2", "--steps", "1",
            "--grad-checkpointing", "every:2", "--memory-limit", "512MiB", "--no-noise-scale", "--quiet"]
    assert CliRunner().invoke(main, [*args, "--out", str(first)]).exit_code == 0
    saved = (first / "config.toml").read_text()
    assert 'grad-checkpointing = "every:2"' in saved and "\nout = " not in saved  # a repeat writes a new folder
    result = CliRunner().invoke(main, ["train", "--config", str(first / "config.toml"), "--out", str(second)])
    assert result.exit_code == 0, result.output

    def run_settings(folder):
        data = json.loads((folder / "train.json").read_text())
        return data["workload"], {k: v for k, v in data["options"].items() if k != "command"}, data["environment"]

    assert run_settings(second) == run_settings(first)
    assert "--memory-limit 536870912" in json.loads((second / "train.json").read_text())["options"]["command"]


@pytest.mark.slow
def test_a_probe_saves_its_config_once_done_the_print_of_the_same_flags(tmp_path):
    args = ["probe", "--seq-len", "16", "--effective-batch", "2", "--memory-limit", "256MiB", "--device", "cpu",
            "--quiet"]
    assert CliRunner().invoke(main, [*args, "--out", str(tmp_path / "run")]).exit_code == 0
    saved = (tmp_path / "run" / "config.toml").read_text()
    expected = "".join(line for line in printed(*args).splitlines(keepends=True)
                       if not line.startswith(("out =", "overwrite =", "resume =")))  # a repeat writes a new folder
    assert saved.split("\n", 1)[1] == expected  # after its comment line
    failed = CliRunner().invoke(main, [*args, "--memory-limit", "50MiB", "--out", str(tmp_path / "small")])
    assert failed.exit_code == 2 and not (tmp_path / "small" / "config.toml").exists()


@pytest.mark.parametrize("args, line", [
    (["train", "--steps", "0"], "gaplan: --steps must be a positive integer (got 0)"),
    (["train", "--lora-r", "8"], "gaplan: --lora-r sets LoRA adapters, and --lora is off"),
    (["probe", "--margin", "1.5"], "gaplan: --margin must be a fraction in [0, 1) (got 1.5)"),
    (["estimate", "--device", "tpu"], "gaplan: --device must be auto, cpu, cuda or cuda:N (got 'tpu')"),
    (["plan", "--repeats", "2"], "gaplan: --repeats applies to --measure"),
    # a resumed run's options are its own, not the command line's: printing those would mislead
    (["train", "--resume", "run"], "gaplan: --print-config with --resume: a resumed run keeps the options it was "
                                   "started with, in run/config.toml (gaplan train --config run/config.toml --out DIR"),
])
def test_print_config_checks_the_options_as_a_run_would(args, line):
    """It prints nothing that --config would then refuse."""
    result = CliRunner().invoke(main, [*args, "--print-config"])
    assert result.exit_code == 2 and result.stdout == "" and result.stderr.startswith(line), result.output
