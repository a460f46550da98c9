"""--batch-by tokens: each step's samples packed into micro-batches of at most T padded tokens."""

import pytest
from click.testing import CliRunner

from gaplan.cli import main

from .test_train_cli import assert_same_weights
from .test_train_fsdp import torchrun

# SyntheticCorpus: lengths from 8 to 32 at seq 32, so a 64-token budget packs 2 to 8 samples per micro-batch.
TWO_SGD_STEPS = ["train", "--seq-len", "32", "--effective-batch", "32", "--steps", "2", "--optimizer", "sgd",
                 "--lr", "0.1", "--seed", "0", "--threads", "1", "--quiet"]


def run(*args):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.slow
def test_packed_by_tokens_trains_the_weights_of_one_full_batch(tmp_path):
    run(*TWO_SGD_STEPS, "--batch-by", "tokens", "--token-budget", "64", "--out", str(tmp_path / "tokens"),
        "--save-weights", str(tmp_path / "tokens.st"))
    log = (tmp_path / "tokens" / "train_log.csv").read_text().splitlines()
    micro_steps = [int(line.split(",")[-2]) for line in log[1:]]
    assert all(steps >= 5 for steps in micro_steps), micro_steps  # 32 samples of 8-32 tokens in <= 64-token batches
    run(*TWO_SGD_STEPS, "--micro-batch", "32", "--out", str(tmp_path / "full"), "--save-weights", str(tmp_path / "full.st"))
    assert_same_weights(tmp_path / "tokens.st", tmp_path / "full.st")


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_packed_by_tokens_over_two_ddp_ranks_trains_the_weights_of_one_full_batch(tmp_path):
    """Uneven tokens per rank, equal micro-step counts (an empty micro-step is a stand-in with no targets)."""
    result = torchrun(*TWO_SGD_STEPS, "--batch-by", "tokens", "--token-budget", "40", "--out", str(tmp_path / "ddp"),
                      "--save-weights", str(tmp_path / "ddp.st"), port=29551)
    assert result.returncode == 0, result.stderr[-3000:]
    run(*TWO_SGD_STEPS, "--micro-batch", "32", "--out", str(tmp_path / "full"), "--save-weights", str(tmp_path / "full.st"))
    assert_same_weights(tmp_path / "ddp.st", tmp_path / "full.st")


@pytest.mark.parametrize("args, message", [
    (["--batch-by", "tokens"], "give --data, or give --token-budget"),
    (["--batch-by", "tokens", "--granule", "0"], "--granule must be a positive number of tokens (got 0)"),
    (["--token-budget", "64"], "--token-budget needs --batch-by tokens"),
    (["--batch-by", "tokens", "--token-budget", "16", "--seq-len", "32"],
     "--token-budget 16 is below the longest sample (32 tokens)"),
    (["--batch-by", "tokens", "--token-budget", "64", "--micro-batch", "4"], "leave out --micro-batch"),
])
def test_bad_input(tmp_path, args, message):
    out = tmp_path / "never"
    result = CliRunner().invoke(main, ["train", "--quiet", "--out", str(out), *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists()


def test_a_budget_only_needs_to_hold_the_datas_longest_sample_not_the_sequence_length(tmp_path):
    data = tmp_path / "short.txt"
    data.write_text("".join(f"line number {i}\n" for i in range(16)))  # 13-14 byte tokens, seq len 64
    result = CliRunner().invoke(main, ["train", "--data", str(data), "--tokenizer", "bytes", "--seq-len", "64",
                                       "--batch-by", "tokens", "--token-budget", "32", "--effective-batch", "8",
                                       "--steps", "1", "--optimizer", "sgd", "--quiet", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
