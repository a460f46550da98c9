"""--batch-by tokens: each step's samples packed into micro-batches of at most T padded tokens."""

import json

import pytest
from click.testing import CliRunner

from gaplan.cli.main import main
from gaplan.data import Sample, step_indices
from gaplan.training.micro_batches import TokenSteps

from ..conftest import free_port
from ..token_corpus import long_tailed_lines
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
    header, *rows = (tmp_path / "tokens" / "train_log.csv").read_text().splitlines()
    column = header.split(",").index("grad_accum_steps")
    micro_steps = [int(row.split(",")[column]) for row in rows]
    assert all(steps >= 5 for steps in micro_steps), micro_steps  # 32 samples of 8-32 tokens in <= 64-token batches
    run(*TWO_SGD_STEPS, "--micro-batch", "32", "--out", str(tmp_path / "full"), "--save-weights", str(tmp_path / "full.st"))
    assert_same_weights(tmp_path / "tokens.st", tmp_path / "full.st")


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_packed_by_tokens_over_two_ddp_ranks_trains_the_weights_of_one_full_batch(tmp_path):
    """Uneven tokens per rank, equal micro-step counts (an empty micro-step is a stand-in with no targets)."""
    result = torchrun(*TWO_SGD_STEPS, "--batch-by", "tokens", "--token-budget", "40", "--out", str(tmp_path / "ddp"),
                      "--save-weights", str(tmp_path / "ddp.st"), port=free_port())
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
    (["--effective-tokens", "64"], "--effective-tokens needs --batch-by tokens"),
    (["--batch-by", "tokens", "--token-budget", "64", "--effective-tokens", "64", "--effective-batch", "8"],
     "--effective-tokens and --effective-batch both set the size of a step: give one"),
    (["--batch-by", "tokens", "--token-budget", "64", "--effective-tokens", "0"],
     "--effective-tokens must be a positive integer (got 0)"),
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


def test_steps_of_a_number_of_tokens_take_the_data_in_order_until_their_tokens_reach_it():
    corpus = [Sample(tuple(range(1, 2 + (7 * i) % 30))) for i in range(50)]  # 2 to 31 tokens
    steps = TokenSteps(corpus, 100, seed=3)
    order = step_indices(0, 400, len(corpus), seed=3)  # the same order as steps of samples: 8 epochs
    taken = []
    for step in range(25):
        indices = steps.indices(step)
        tokens = [len(corpus[i].ids) for i in indices]
        # At least 100 real tokens, and no fewer samples would reach 100: the last one crosses the mark.
        assert sum(tokens) >= 100 and sum(tokens) - tokens[-1] < 100, (step, tokens)
        taken += indices
    assert taken == order[:len(taken)]  # consecutive, across epochs, every sample once per epoch
    assert steps.indices(3) == TokenSteps(corpus, 100, seed=3).indices(3)  # a resumed run finds the same step
    assert all(len(TokenSteps(corpus, 1, seed=0, min_samples=2).indices(s)) == 2 for s in range(10))


@pytest.mark.slow
def test_a_step_of_a_number_of_tokens_trains_the_weights_of_one_full_batch_of_its_samples(tmp_path):
    lines = long_tailed_lines(40, 8, 32)
    data = tmp_path / "corpus.txt"
    data.write_text("\n".join(lines) + "\n")
    common = ["train", "--tokenizer", "bytes", "--seq-len", "32", "--steps", "1", "--optimizer", "sgd", "--lr", "0.1",
              "--seed", "0", "--threads", "1", "--quiet", "--json"]
    result = run(*common, "--data", str(data), "--batch-by", "tokens", "--token-budget", "64",
                 "--effective-tokens", "150", "--out", str(tmp_path / "tokens"), "--save-weights", str(tmp_path / "t.st"))
    header, first = (tmp_path / "tokens" / "train_log.csv").read_text().splitlines()[:2]
    row = dict(zip(header.split(","), first.split(","), strict=True))
    assert int(row["grad_accum_steps"]) >= 3  # micro-steps: 150+ tokens in micro-batches of at most 64 padded tokens
    step = TokenSteps([Sample(tuple(line.encode())) for line in lines], 150, seed=0).indices(0)
    assert sum(len(lines[i]) for i in step) >= 150 > sum(len(lines[i]) for i in step[:-1])
    summary = json.loads(result.stdout)
    assert summary["padding_fraction"] is not None
    # What it records is what it trained: micro-batches within 64 tokens, a step of len(step) samples; no phantom
    # plan of micro-batch 256 "given with --micro-batch" (its plan.json fed to --plan trained 256 x 1, 14x B*).
    assert summary["plan"] is None and summary["token_budget"] == 64
    assert summary["effective_batches"] == [{"from_step": 1, "effective_batch": len(step)}]
    assert summary["noise_scale"]["summary"].startswith(f"effective batch {len(step)} is ")
    assert json.loads((tmp_path / "tokens" / "plan.json").read_text())["token_budget"] == 64
    report = CliRunner().invoke(main, ["report", str(tmp_path / "tokens")])
    assert report.exit_code == 0, report.output
    text = (tmp_path / "tokens" / "report.md").read_text()
    assert "**Micro-batches:** packed each step within 64 padded tokens a rank" in text
    assert "given with `--micro-batch`" not in text
    again = CliRunner().invoke(main, ["train", "--plan", str(tmp_path / "tokens" / "plan.json"), "--tokenizer", "bytes",
                                      "--seq-len", "32", "--data", str(data), "--quiet", "--out", str(tmp_path / "x")])
    assert again.exit_code == 2 and "records a run batched by tokens" in again.stderr, again.output
    # The same samples as one batch: a file of just them, one step of all of them (their order does not matter).
    (tmp_path / "step.txt").write_text("".join(lines[i] + "\n" for i in step))
    run(*common, "--data", str(tmp_path / "step.txt"), "--effective-batch", str(len(step)), "--micro-batch",
        str(len(step)), "--out", str(tmp_path / "full"), "--save-weights", str(tmp_path / "full.st"))
    assert_same_weights(tmp_path / "t.st", tmp_path / "full.st")
