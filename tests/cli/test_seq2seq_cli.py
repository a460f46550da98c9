"""seq2seq-lm end to end: source/target data through ``gaplan train``, its bad input in one line, the exact edge in
fresh processes, and LoRA with peft's seq2seq task type. (The token-exact loss is in tests/workload/test_loss.py,
the estimate against real trials in tests/estimate/test_trace.py.)"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from gaplan.cli.main import main

LENGTHS = ["--seq-len", "32", "--target-len", "16", "--tokenizer", "bytes"]


def _pairs(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _train(tmp_path, data, *extra):
    return CliRunner().invoke(main, ["train", "--model", "tiny-t5", "--data", data, *LENGTHS, "--micro-batch", "2",
                                     "--effective-batch", "6", "--steps", "2", "--out", str(tmp_path / "run"),
                                     "--quiet", "--json", *extra])


def test_source_target_pairs_train_with_the_loss_over_their_targets(tmp_path):
    rows = [{"text": f"s{i} " * (1 + i % 4), "target": f"t{i} " * (1 + i % 3)} for i in range(12)]
    result = _train(tmp_path, _pairs(tmp_path / "pairs.jsonl", rows))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["plan"]["micro_batch"] * summary["plan"]["grad_accum_steps"] == 6
    assert torch.isfinite(torch.tensor(summary["loss_last"]))


@pytest.mark.parametrize("row, extra, message", [
    ({"text": "a b", "summary": "x"}, [], "line 1 has no 'target' field (--target-field names it"),
    ({"text": "a b", "target": "  "}, [], "line 1: the target ('target') is empty"),
    ({"text": "a b", "target": "x" * 40}, [], "its target has 40 tokens, more than --target-len 16"),
], ids=["no target field", "empty target", "target too long"])
def test_bad_seq2seq_input_is_one_line_and_writes_nothing(tmp_path, row, extra, message):
    result = _train(tmp_path, _pairs(tmp_path / "bad.jsonl", [row]), *extra)
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
    assert json.loads(result.stdout) == {"error": result.stderr.strip().removeprefix("gaplan: "), "exit_status": 2}


@pytest.mark.parametrize("command", ["probe", "train"])
def test_a_token_budget_is_refused_for_seq2seq(tmp_path, command):
    data = _pairs(tmp_path / "pairs.jsonl", [{"text": "a b", "target": "x"}])
    result = CliRunner().invoke(main, [command, "--model", "tiny-t5", "--data", data, *LENGTHS, "--batch-by", "tokens",
                                       "--out", str(tmp_path / "run"), "--quiet"])
    assert result.exit_code == 2 and "a seq2seq-lm sample has two (source and target)" in result.output, result.output
    assert not (tmp_path / "run").exists()


def test_a_too_long_target_is_cut_with_long_samples_truncate(tmp_path):
    result = _train(tmp_path, _pairs(tmp_path / "long.jsonl", [{"text": "a b", "target": "x" * 40}] * 3),
                    "--long-samples", "truncate")
    assert result.exit_code == 0, result.output


def test_target_len_is_refused_for_a_model_that_is_not_seq2seq():
    result = CliRunner().invoke(main, ["probe", "--model", "tiny-gpt2", "--target-len", "8"])
    assert result.exit_code == 2 and "--target-len applies to seq2seq-lm models" in result.output


def test_lora_wraps_an_encoder_decoder_with_peft_s_seq2seq_task_type():
    pytest.importorskip("peft")
    from gaplan.workload.build import WorkloadSpec, build_workload

    workload = build_workload(WorkloadSpec(model="tiny-t5", seq_len=16, lora=True), "cpu")
    assert type(workload.model).__name__ == "PeftModelForSeq2SeqLM"
    loss = workload.raw_loss(workload.model, workload.make_batch(2))
    loss.backward()
    trained = [name for name, p in workload.model.named_parameters() if p.grad is not None]
    assert trained and all("lora_" in name for name in trained)


@pytest.mark.heavy
@pytest.mark.slow
def test_the_edge_of_tiny_t5_holds_in_fresh_processes():
    """B* trains two optimizer steps in a new process under the same budget, and B*+1 runs out of memory there.
    Measured: B* = 7 (source 64, target 32, 320 MiB, one thread), 5 trials."""
    from gaplan.core.constants import SEARCH_CAP
    from gaplan.probing.edge import check_in_fresh_process, probe
    from gaplan.workload.build import WorkloadSpec

    spec, budget = WorkloadSpec(model="tiny-t5", seq_len=64, target_len=32), 320 * 2**20
    result = probe(spec, device="cpu", memory_limit=budget, effective_batch=256, search_cap=SEARCH_CAP, threads=1)
    edge = result.max_micro_batch
    assert edge >= 2 and result.task == "seq2seq-lm"
    assert check_in_fresh_process(spec, "cpu", budget, edge, optimizer_steps=2, threads=1)
    assert not check_in_fresh_process(spec, "cpu", budget, edge + 1, optimizer_steps=2, threads=1)

