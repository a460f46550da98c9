"""gaplan.estimate.trace: fake-tensor traces of the steady state, checked against real CPU trials."""

from __future__ import annotations

import dataclasses

import pytest

from gaplan.core.constants import BREAKDOWN_CATEGORIES
from gaplan.estimate import TracedRow, trace_steps
from gaplan.workload.build import WorkloadSpec

from .helpers import model_parameters


def test_a_traced_row_has_every_breakdown_category():
    assert set(BREAKDOWN_CATEGORIES) <= {f.name for f in dataclasses.fields(TracedRow)}


def test_cpu_trace_counts_the_optimizer_states_of_the_steady_state():
    (row,) = trace_steps(WorkloadSpec(model="tiny-llama", seq_len=32), [4])
    params = model_parameters("tiny-llama")
    # AdamW keeps two fp32 tensors per parameter and a 4-byte step counter per parameter tensor.
    assert row.optimizer_states == 8 * sum(p.numel() for p in params) + 4 * len(params)
    assert row.gradients == sum(p.numel() * 4 for p in params)
    assert row.activations > 0
    assert row.phase == "step" and row.peak_bytes > row.tracked_total  # the CPU process's heap and MKL buffers


@pytest.mark.heavy
@pytest.mark.slow
# Sizes where activations set the peak, and one (bert-cls at 2) where the optimizer step does.
@pytest.mark.parametrize(("preset", "micro_batch"), [("tiny-gpt2", 8), ("tiny-llama", 4), ("tiny-bert-mlm", 8),
                                                     ("tiny-bert-cls", 2)])
def test_cpu_estimate_is_within_3_percent_of_a_real_trial(preset, micro_batch):
    from gaplan.worker.client import WorkerProcess

    spec = WorkloadSpec(model=preset, seq_len=32)
    (row,) = trace_steps(spec, [micro_batch], device_kind="cpu", threads=2)
    with WorkerProcess(spec, "cpu", 2 * 2**30, threads=2) as worker:
        measured = worker.trial(micro_batch, optimizer_steps=2).peak_bytes
    print(f"{preset} at {micro_batch}: estimated {row.peak_bytes}, measured {measured}, "
          f"{100 * (row.peak_bytes - measured) / measured:+.2f}%")
    # Measured on torch 2.13, 2 threads, MKL's pool off, its buffer counted while each product runs: tiny-gpt2
    # +0.07%, tiny-llama -0.04%, tiny-bert-mlm -0.20%, tiny-bert-cls -0.02% (counted at every peak: +3.3, +2.3, +3.2,
    # +1.0%).
    assert abs(row.peak_bytes - measured) <= 0.03 * measured, (preset, micro_batch, row.peak_bytes, measured)


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-t5", "bart"])
def test_seq2seq_estimate_is_within_3_percent_of_real_trials(model, tmp_path):
    """An encoder-decoder at a small micro-batch and a larger one: source 64, target 32 (T5's relative position
    bias, BART's learned positions and ``shift_tokens_right``). Measured on torch 2.13, 2 threads: tiny-t5 -0.07%
    at 2 and -0.06% at 8; the BART (4 + 4 layers x 256, vocab 8192) -0.36% and -0.32%. (At source 32, -2.35% and
    -2.21% at 2: a gap of 4-5 MiB not explained yet, docs/seq2seq.md.)"""
    from gaplan.worker.client import WorkerProcess

    from ..model_folders import make_bart_folder

    if model == "bart":
        model = make_bart_folder(str(tmp_path / "bart"), vocab_size=8192, d_model=256, encoder_ffn_dim=1024,
                                 decoder_ffn_dim=1024, encoder_layers=4, decoder_layers=4)
    spec = WorkloadSpec(model=model, seq_len=64)
    sizes = [2, 8]
    rows = {row.micro_batch: row.peak_bytes for row in trace_steps(spec, sizes, device_kind="cpu", threads=2)}
    with WorkerProcess(spec, "cpu", 2 * 2**30, threads=2) as worker:
        measured = {size: worker.trial(size, optimizer_steps=2).peak_bytes for size in sizes}
    errors = {size: (rows[size] - measured[size]) / measured[size] for size in sizes}
    print(f"{spec.model}: " + ", ".join(f"{size}: {100 * error:+.2f}%" for size, error in errors.items()))
    assert all(abs(error) <= 0.03 for error in errors.values()), errors


def test_attention_chooses_transformers_implementation_and_eager_keeps_more(tmp_path):
    """--attention eager|sdpa reaches transformers (attn_implementation), and the estimate sees the difference:
    eager keeps the seq x seq probabilities for backward, SDPA does not."""
    from click.testing import CliRunner

    from gaplan.cli.main import main
    from gaplan.workload.build import build_workload

    assert build_workload(WorkloadSpec(model="tiny-llama", seq_len=16, attention="eager"),
                          "meta").model.config._attn_implementation == "eager"
    eager, sdpa = (trace_steps(WorkloadSpec(model="tiny-llama", seq_len=128, attention=kind), [4])[0].activations
                   for kind in ("eager", "sdpa"))
    assert eager > sdpa
    result = CliRunner().invoke(main, ["probe", "--attention", "flash"])
    assert result.exit_code == 2 and "--attention" in result.output
