"""End-to-end ``gaplan estimate`` and ``gaplan probe --seed-from-estimate``."""

import json

import pytest
from click.testing import CliRunner

from gaplan.cli.main import main


def test_list_targets():
    result = CliRunner().invoke(main, ["estimate", "--list-targets"])
    assert result.exit_code == 0, result.output
    assert "h100-80gb" in result.output and "usable" in result.output
    listed = json.loads(CliRunner().invoke(main, ["estimate", "--list-targets", "--json"]).stdout)
    assert all(t["usable_bytes"] < t["total_bytes"] for t in listed)


BAD_INPUT = [
    (["--target", "gtx-480"], "unknown target 'gtx-480'"),
    (["--model", "tiny-gpt2", "--seq-len", "5000"], "longer than the model's 1024 positions"),
    (["--sizes", "4"], "--sizes needs at least two"),
    (["--device", "cpu", "--target", "h100-80gb"], "does not go with --device cpu"),
    # a trace times nothing: auto was estimated as off without a word
    (["--grad-checkpointing", "auto"], "--grad-checkpointing auto applies to probe, bench and train"),
    (["--device", "cpu", "--threads", "100000"], "--threads 100000 is more than 4 per core"),  # as probe's, train's
]


@pytest.mark.parametrize("args, message", BAD_INPUT)
def test_bad_input_is_one_line_exit_2(args, message):
    result = CliRunner().invoke(main, ["estimate", "--quiet", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_config_dir_without_config(tmp_path):
    result = CliRunner().invoke(main, ["estimate", "--quiet", "--model", str(tmp_path)])
    assert result.exit_code == 2 and "without a config.json" in result.stderr


@pytest.mark.slow
def test_json_estimate_for_a_target():
    result = CliRunner().invoke(main, ["estimate", "--model", "tiny-bert-cls", "--seq-len", "16", "--target", "t4",
                                       "--effective-batch", "64", "--max-micro-batch", "64", "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["target"] == "t4" and data["usable_bytes"] < data["memory_limit_bytes"]
    assert data["max_micro_batch"] >= 1 and data["plan"]["effective_batch"] == 64
    assert {"parameters", "gradients", "optimizer_states", "activations"} <= set(data["rows"][0])
    assert data["assumptions"]
    trust = data["trust"]  # the zoo's measured error for BERT, and that a T4 is not what it measured
    assert trust["family"] == "bert" and trust["measured"] and "a CUDA target" in trust["differences"][0]
