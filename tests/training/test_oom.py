"""Out of memory in training, for real: ``gaplan train --enforce-memory-limit`` under the CPU budget.

A plan too big for the budget hits the allocator's own error in its micro-steps (gradients of the earlier
micro-steps held, or the first one's activations); the step is redone with the same samples at half the
micro-batch, and the weights equal a run planned at that size from the start.
"""

import json
import os
import subprocess
import sys
import types

import pytest
import torch
from safetensors.torch import load_file

from tests.tolerances import assert_close_at_scale

pytestmark = pytest.mark.slow

TRAIN = ["train", "--seq-len", "16", "--effective-batch", "256", "--optimizer", "sgd", "--lr", "0.1", "--steps", "1",
         "--seed", "0", "--threads", "1", "--device", "cpu", "--json", "--quiet"]


def gaplan(*args: str, cwd) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")  # as the probe's worker: a sharp, repeatable edge
    done = subprocess.run([sys.executable, "-m", "gaplan", *TRAIN, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.heavy
def test_a_plan_too_big_for_the_budget_falls_back_to_the_weights_of_the_smaller_plan(tmp_path):
    summary = gaplan("--micro-batch", "256", "--memory-limit", "256MiB", "--enforce-memory-limit",
                     "--out", str(tmp_path / "big"), "--save-weights", str(tmp_path / "big.st"), cwd=tmp_path)
    fallbacks = summary["oom_fallbacks"]
    assert fallbacks and all("out of memory at micro-batch" in line for line in fallbacks), fallbacks
    final = summary["plan"]["micro_batch"]
    assert final < 256 and summary["plan"]["effective_batch"] == 256
    print(f"real OOM fallback: {' | '.join(fallbacks)} -> trained at {final} x {summary['plan']['grad_accum_steps']}")
    reference = gaplan("--micro-batch", str(final), "--out", str(tmp_path / "small"),
                       "--save-weights", str(tmp_path / "small.st"), cwd=tmp_path)
    assert reference["oom_fallbacks"] == [] and reference["plan"] == summary["plan"]
    big, small = load_file(tmp_path / "big.st"), load_file(tmp_path / "small.st")
    for name, value in small.items():
        assert_close_at_scale(big[name], value, msg=name)


def test_an_optimizer_step_that_runs_out_of_memory_is_reported_not_retried(tmp_path, monkeypatch):
    """A stand-in optimizer step raising the CPU allocator's error: glue test of the classification, not of memory."""
    from gaplan.core.errors import GaplanError
    from gaplan.data import SyntheticCorpus
    from gaplan.plan.split import make_plan
    from gaplan.training.loop import TrainConfig, train
    from gaplan.training.optimizer_step import OptimizerStepDoesNotFit
    from gaplan.workload.build import build_workload
    from gaplan.workload.spec import WorkloadSpec

    workload = build_workload(WorkloadSpec(seq_len=16, optimizer="sgd"), "cpu")
    calls = []

    def step(self, *args, **kwargs):
        calls.append(1)
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 22020096 bytes.")

    monkeypatch.setattr(workload.optimizer, "step", types.MethodType(step, workload.optimizer))
    with pytest.raises(OptimizerStepDoesNotFit, match="the optimizer step itself does not fit") as raised:
        train(workload, make_plan(8, 4), SyntheticCorpus(16), TrainConfig(steps=1, run_dir=str(tmp_path)))
    assert isinstance(raised.value, GaplanError) and "22020096 bytes" in str(raised.value)
    assert len(calls) == 1, "a failed optimizer step must not be retried with a smaller micro-batch"
    assert torch.isfinite(next(workload.model.parameters())).all()
