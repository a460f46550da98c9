"""Step 1 recomputed as one large batch: the claim holds, the check changes no weight, and a skip says why."""

import json
import types

import pytest
import torch
from torch import nn

from gaplan.data import SyntheticCorpus
from gaplan.plan.split import make_plan
from gaplan.runs.folder import LOSS_CHECK_JSON
from gaplan.training import loop as loop_module
from gaplan.training.loop import TrainConfig, train
from gaplan.training.loss_check import large_batch_loss
from gaplan.workload.build import WorkloadSpec, build_workload
from gaplan.workload.loss import batch_size

SPEC = WorkloadSpec(model="tiny-gpt2", seq_len=16, optimizer="adamw", lr=1e-3)
CPU_OOM = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes"


def run(tmp_path, name, micro=8, steps=2, spec=SPEC, resume=False, wrap_loss=None):
    workload = build_workload(spec, "cpu", seed=0)
    if wrap_loss:
        workload.raw_loss = wrap_loss(workload.raw_loss)
    config = TrainConfig(steps=steps, seed=0, checkpoint_every=1, run_dir=str(tmp_path / name))
    result = train(workload, make_plan(16, micro), SyntheticCorpus(16, seed=0), config, resume=resume)
    return workload.model, result


def test_the_accumulated_step_equals_one_large_batch(tmp_path):
    _, result = run(tmp_path, "run")
    check = result.loss_check
    assert check.skipped is None and check.samples == 16 and check.micro_steps == 2
    assert check.accumulated_loss == result.logs[0].loss
    assert check.relative_difference < 1e-5 and check.large_batch_loss > 5  # a real loss, not a zero
    saved = json.loads((tmp_path / "run" / LOSS_CHECK_JSON).read_text())
    assert saved["large_batch_loss"] == check.large_batch_loss and saved["skipped"] is None


def test_a_wrong_accumulation_would_show(tmp_path):
    """The one batch is its own computation: micro-steps that weigh their losses 1% too much show a 1% difference."""
    _, result = run(tmp_path, "run", wrap_loss=lambda raw: lambda model, batch: raw(model, batch) * (
        1.01 if batch_size(batch) < 16 else 1.0))
    assert result.loss_check.relative_difference == pytest.approx(0.01, rel=1e-3)


@pytest.mark.parametrize("dropout", [False, True], ids=["presets", "dropout"])
def test_the_check_changes_no_weight(tmp_path, monkeypatch, dropout):
    """Bitwise the weights of a run without the check, also with dropout (the check's forward draws from the RNG)."""
    spec = SPEC
    if dropout:
        from tests.model_folders import _make_folder, gpt2_config

        folder = _make_folder(str(tmp_path / "model"), lambda vocab: gpt2_config(
            vocab, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1), with_weights=False, with_tokenizer=False,
            sharded=False, seed=0, vocab_size=300)
        spec = WorkloadSpec(model=folder, seq_len=16, optimizer="adamw", lr=1e-3)
    checked, result = run(tmp_path, "checked", spec=spec)
    assert result.loss_check.skipped is None
    monkeypatch.setattr(loop_module, "skip_reason", lambda *args: "off for this test")
    plain, result = run(tmp_path, "plain", spec=spec)
    assert result.loss_check.skipped == "off for this test"
    for a, b in zip(checked.state_dict().values(), plain.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_running_statistics_are_put_back():
    """A forward in training mode updates BatchNorm's statistics even without gradients: the check undoes it."""
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    workload = types.SimpleNamespace(model=model, device=torch.device("cpu"), task="custom", loss_is_scaled_for_ga=None,
                                     raw_loss=lambda m, batch: m(batch["x"]).pow(2).sum(),
                                     autocast=lambda: torch.autocast("cpu", enabled=False))
    assert large_batch_loss(workload, {"x": torch.randn(8, 3) + 5}) > 0
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_a_step_too_large_for_one_batch_is_skipped_and_said(tmp_path):
    _, result = run(tmp_path, "run", micro=4)
    assert "16 samples is 4x the micro-batch (4)" in result.loss_check.skipped
    assert json.loads((tmp_path / "run" / LOSS_CHECK_JSON).read_text())["skipped"] == result.loss_check.skipped


def test_an_out_of_memory_one_batch_is_skipped_and_training_goes_on(tmp_path):
    def wrap(raw):
        def loss(model, batch):
            if batch_size(batch) == 16:  # only the one large batch runs out of memory
                raise RuntimeError(CPU_OOM)
            return raw(model, batch)
        return loss

    _, result = run(tmp_path, "run", wrap_loss=wrap)
    assert result.loss_check.skipped.startswith("one batch of the step's 16 samples does not fit (DefaultCPUAllocator")
    assert len(result.logs) == 2 and not result.oom_fallbacks


def test_a_resumed_run_keeps_the_check_of_its_start(tmp_path):
    _, first = run(tmp_path, "run", steps=1)
    saved = (tmp_path / "run" / LOSS_CHECK_JSON).read_text()
    _, resumed = run(tmp_path, "run", steps=2, resume=True)
    assert resumed.loss_check.skipped.startswith("the run resumed at step 2")
    assert (tmp_path / "run" / LOSS_CHECK_JSON).read_text() == saved
