"""End-to-end: ``gaplan probe`` through click's runner and a real subprocess."""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from gaplan.cli.main import main

from ..conftest import REPO_ROOT

SMALL = ["--model", "tiny-gpt2", "--seq-len", "16", "--memory-limit", "200MiB", "--device", "cpu"]


def invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


@pytest.mark.slow
def test_json_output_and_plan_file(tmp_path):
    out = tmp_path / "run"
    # A small effective batch caps the search (47 s to the edge at 128 on 2 cores): the JSON is the same either way.
    result = invoke(["probe", *SMALL, "--effective-batch", "16", "--json", "--quiet", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in ("max_micro_batch", "memory_limit_bytes", "device", "trials", "plan"):
        assert key in data
    assert data["memory_limit_bytes"] == 200 * 2**20 and data["device"] == "cpu"
    assert {"micro_batch", "fits", "peak_bytes", "seconds"} <= set(data["trials"][0])
    plan = data["plan"]
    assert {"effective_batch", "micro_batch", "grad_accum_steps", "micro_batch_sizes", "world_size"} <= set(plan)
    assert sum(plan["micro_batch_sizes"]) == 16 and plan["micro_batch"] <= data["max_micro_batch"]
    assert json.loads((out / "plan.json").read_text())["max_micro_batch"] == data["max_micro_batch"]
    train = data["train_command"]  # the next step, as the text output names it
    assert train.startswith("gaplan train ") and "--seq-len 16" in train and train.endswith(f"--plan {out / 'plan.json'}")


@pytest.mark.heavy
@pytest.mark.slow
def test_table_output_and_custom_cnn(tmp_path):
    os.chdir(REPO_ROOT)  # module:function resolves from the current directory, like python -m
    result = invoke(["probe", "--model", "examples.custom_model:make_cnn", "--memory-limit", "128MiB",
                     "--effective-batch", "512", "--out", str(tmp_path / "cnn")])
    assert result.exit_code == 0, result.output
    assert "largest micro-batch that fits:" in result.stdout
    assert "plan: effective batch 512" in result.stdout
    assert (tmp_path / "cnn" / "plan.json").exists()


@pytest.mark.slow
def test_default_budget_is_announced(tmp_path):
    result = invoke(["probe", "--model", "tiny-bert-cls", "--seq-len", "16", "--max-micro-batch", "8",
                     "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "default CPU budget" in result.stdout and "1.00 GiB" in result.stdout
    assert "the search cap" in result.stdout


BAD_INPUT = [
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--model", "nosuchmodule:make"], "cannot import nosuchmodule"),
    (["--model", "json:no_such_function"], "json has no function no_such_function"),
    (["--task", "regression"], "unknown task 'regression'"),
    (["--dtype", "fp8"], "unknown dtype 'fp8'"),
    (["--optimizer", "adamax"], "unknown --optimizer 'adamax'; choose one of adamw, adamw-fused, adamw-forloop, adamw-8bit"),
    (["--memory-limit", "0"], "--memory-limit must be at least 1 byte"),
    (["--memory-limit", "abc"], "--memory-limit must be a size"),
    (["--memory-limit", "50MiB"], "needs at least 84.21 MiB for weights, gradients and optimizer states"),
    (["--device", "cuda"], "no CUDA device is available"),
    (["--device", "tpu"], "--device must be auto, cpu, cuda or cuda:N"),
    (["--effective-batch", "0"], "--effective-batch must be a positive integer (got 0)"),
    (["--effective-batch", "3", "--world-size", "4"], "smaller than the world size"),
    (["--seq-len", "4096"], "longer than the model's 1024 positions"),
    (["--margin", "1.5"], "--margin must be a fraction"),
    (["--threads", "100000"], "--threads 100000 is more than 4 per core on this machine"),  # was a MemoryError
    (["--offload-activations", "--device", "cpu"], "--offload-activations moves the tensors saved for backward off"),
    (["--out", "/proc/gaplan-cannot-write-here"], "is not writable"),
    # the numeric sweep: negative, zero, NaN, inf each refused, named by its flag
    (["--memory-limit", "-5"], "--memory-limit must be a size"),
    (["--margin", "nan"], "--margin must be a fraction"),
    (["--margin", "-0.1"], "--margin must be a fraction"),
    (["--time-budget", "nan"], "--time-budget must be positive"),
    (["--time-budget", "inf"], "--time-budget must be positive"),
    (["--ci-target", "nan"], "--ci-target must be between 0 and 1"),
    (["--lr", "inf"], "--lr must be a positive number (got inf)"),
    (["--lr", "-1"], "--lr must be a positive number (got -1.0)"),
    (["--lora", "--lora-alpha", "inf"], "--lora-alpha must be a positive number (got inf)"),
    (["--lora", "--lora-dropout", "nan"], "--lora-dropout must be in [0, 1)"),
    (["--lora", "--lora-r", "0"], "--lora-r must be a positive integer (got 0)"),
    # LoRA's settings without --lora would train a full fine-tune and ignore them
    (["--lora-r", "8"], "--lora-r sets LoRA adapters, and --lora is off"),
    (["--lora-r", "16", "--lora-targets", "all-linear"], "--lora-r, --lora-targets set LoRA adapters"),
    (["--quantize", "4bit"], "add --lora"),
    # beside --lora-config, a --lora-* flag would be replaced by the file's value without a word
    (["--lora-config", "adapter_config.json", "--lora-r", "4"], "--lora-r and --lora-config both set the adapters'"),
    (["--lora-config", "/no/such/adapter_config.json"], "--lora-config /no/such/adapter_config.json: no such file"),
]


@pytest.mark.parametrize("args, message", BAD_INPUT)
def test_bad_input_is_one_line_exit_2(tmp_path, args, message):
    if not any(a == "--out" for a in args):
        args = [*args, "--out", str(tmp_path / "runs" / "out")]  # its parent too: refused, it leaves neither
    if "cuda" in args and _has_cuda():
        pytest.skip("this machine has CUDA")
    result = CliRunner().invoke(main, ["probe", "--quiet", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gaplan: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "runs").exists(), "nothing may be written on bad input"


def _has_cuda():
    import torch

    return torch.cuda.is_available()


def test_python_dash_m_and_help():
    result = subprocess.run([sys.executable, "-m", "gaplan", "probe", "--help"], capture_output=True, text=True,
                            cwd=REPO_ROOT, check=True)
    assert "Examples:" in result.stdout and "--memory-limit" in result.stdout
    version = subprocess.run([sys.executable, "-m", "gaplan", "--version"], capture_output=True, text=True,
                             check=True)
    assert "gaplan, version" in version.stdout


@pytest.mark.parametrize("switch", [["--debug"], "GAPLAN_DEBUG"])
def test_debug_shows_the_traceback_before_the_one_line(tmp_path, switch):
    """An error's traceback (and what is chained to it: a disk fault's writer) for a report; its line stays last."""
    env = {"GAPLAN_DEBUG": "1"} if switch == "GAPLAN_DEBUG" else {}
    flags = switch if isinstance(switch, list) else []
    result = CliRunner(env=env).invoke(main, [*flags, "probe", "--quiet", "--effective-batch", "0", "--out",
                                              str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0] == "Traceback (most recent call last):" and "OptionError" in lines[-2], result.stderr
    assert lines[-1] == "gaplan: --effective-batch must be a positive integer (got 0)"
    quiet = CliRunner(env={"GAPLAN_DEBUG": ""}).invoke(main, ["probe", "--quiet", "--effective-batch", "0"])
    assert quiet.stderr.strip().splitlines() == [lines[-1]]


@pytest.mark.parametrize("args, line", [
    (["estimate", "--seq-len", "abc"], "gaplan: Invalid value for '--seq-len': 'abc' is not a valid integer. (see "
                                       "gaplan estimate --help)"),
    (["probe", "--bogus-flag"], "gaplan: No such option '--bogus-flag'. (see gaplan probe --help)"),
    (["train", "--steps"], "gaplan: Option '--steps' requires an argument. (see gaplan train --help)"),
    (["report"], "gaplan: Missing argument 'DIR'. (see gaplan report --help)"),
])
def test_clicks_own_usage_errors_are_one_line_too(args, line):
    result = CliRunner().invoke(main, args, prog_name="gaplan")
    assert result.exit_code == 2 and result.stderr.splitlines() == [line], result.stderr


@pytest.mark.slow
def test_the_train_command_a_probe_prints_trains_its_workload(tmp_path):
    """The next command printed carries the probe's workload, so it runs as printed; a --plan given another workload
    says what differs and the plan's own flags."""
    import shlex

    out = tmp_path / "probe"
    probed = CliRunner().invoke(main, ["probe", "--seq-len", "16", "--memory-limit", "256MiB", "--effective-batch",
                                       "8", "--threads", "1", "--quiet", "--out", str(out)])
    assert probed.exit_code == 0, probed.output
    hint = probed.stdout.split("plan written to ")[1].splitlines()[0]
    words = shlex.split(hint[hint.index("(") + 1:hint.rindex(")")])
    assert words[:2] == ["gaplan", "train"] and "--seq-len" in words
    trained = CliRunner().invoke(main, [*words[1:], "--steps", "1", "--quiet", "--out", str(tmp_path / "t")])
    assert trained.exit_code == 0, trained.output
    other = CliRunner().invoke(main, ["train", "--plan", str(out / "plan.json"), "--steps", "1", "--quiet", "--out",
                                      str(tmp_path / "u")])
    assert other.exit_code == 2 and ("was made for another workload (--seq-len 16 there, the default here): give its "
                                     "workload, --model tiny-gpt2 --seq-len 16") in other.stderr
