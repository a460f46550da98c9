"""Checks shared by the LoRA and QLoRA workload tests: accumulation against one batch, and a cut run resumed."""

from __future__ import annotations

import pytest
import torch

from gaplan.data import SyntheticCorpus, collate
from gaplan.training.step import accumulate_gradients
from gaplan.workload.build import build_workload
from gaplan.workload.spec import WorkloadSpec

TASK = "causal-lm"


def assert_accumulated_adapter_grads_equal_one_batch(spec: WorkloadSpec) -> None:
    """11 padded samples as 4 + 4 + 3 micro-batches give the adapters one batch's gradient (rtol 1e-5)."""
    corpus = SyntheticCorpus(32, seed=0)
    samples = [corpus[i] for i in range(11)]

    def adapter_grads(splits):
        workload = build_workload(spec, seed=0)
        # B starts at zero in peft (the adapter adds nothing at first); a seeded non-zero B gives A a gradient too.
        with torch.no_grad():
            for name, p in workload.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.02, generator=torch.Generator().manual_seed(len(name)))
        starts = [sum(splits[:i]) for i in range(len(splits))]
        batches = [collate(samples[s:s + n], TASK) for s, n in zip(starts, splits, strict=True)]
        accumulate_gradients(workload.model, batches, workload.raw_loss, TASK)
        return {n: p.grad.clone() for n, p in workload.model.named_parameters() if p.requires_grad}

    full, split = adapter_grads([11]), adapter_grads([4, 4, 3])
    assert set(full) == set(split) and any("lora_A" in n for n in full)
    for name, grad in full.items():
        torch.testing.assert_close(split[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def cut_and_resumed(spec: WorkloadSpec, tmp_path) -> tuple[torch.nn.Module, dict, torch.nn.Module]:
    """A 4-step run straight, and one cut after the checkpoint of step 2 then resumed (in ``tmp_path/cut``): the
    straight run's model, the cut run's checkpoint (before the resume), the resumed run's model."""
    from gaplan import make_plan
    from gaplan.training.checkpoint import load_checkpoint
    from gaplan.training.config import TrainConfig
    from gaplan.training.loop import train

    def run(name, resume=False, stop_after=None):
        workload = build_workload(spec, "cpu", seed=0)

        def on_step(log):
            if stop_after is not None and log.step == stop_after + 1:
                raise KeyboardInterrupt  # the process dies mid-run, after the checkpoint of step `stop_after`

        config = TrainConfig(steps=4, seed=0, checkpoint_every=1, run_dir=str(tmp_path / name))
        train(workload, make_plan(8, 4), SyntheticCorpus(16, seed=0), config, resume=resume, on_step=on_step)
        return workload.model

    reference = run("straight")
    with pytest.raises(KeyboardInterrupt):
        run("cut", stop_after=2)
    cut = load_checkpoint(str(tmp_path / "cut"))
    return reference, cut, run("cut", resume=True)


def assert_same_weights(resumed: torch.nn.Module, reference: torch.nn.Module) -> None:
    """Bitwise, every parameter; the adapters among them."""
    reference_params = dict(reference.named_parameters())
    assert any(p.requires_grad for p in reference_params.values())
    for name, value in resumed.named_parameters():
        assert torch.equal(value, reference_params[name]), name
