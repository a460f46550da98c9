"""One probe trial: a steady-state accumulated optimizer step at micro-batch ``b``, measured.

Steady state means the optimizer states already exist (AdamW allocates them at its
first step, so a one-step trial sees a lower peak than every later step), at least
two micro-steps accumulate into live gradients, then the optimizer steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from gaplan.devices import Backend, is_out_of_memory
from gaplan.step import accumulate_gradients
from gaplan.workload import Workload


@dataclass(frozen=True)
class TrialOutcome:
    """What one trial measured. ``peak_bytes`` is above the pre-budget baseline."""

    micro_batch: int
    fits: bool
    peak_bytes: int | None
    seconds: float
    after_bytes: int  # memory held after the trial was cleaned up (should equal the level before it)
    before_bytes: int
    error: str | None = None
    completed_steps: int = 0  # optimizer steps finished before the end (or the OOM)


def materialize_optimizer_state(workload: Workload) -> None:
    """Create the optimizer's state tensors without running the model (zero gradients, one step)."""
    for param in workload.model.parameters():
        if param.requires_grad:
            param.grad = torch.zeros_like(param)
    workload.optimizer.step()
    workload.optimizer.zero_grad(set_to_none=True)


def run_trial(workload: Workload, backend: Backend, micro_batch: int, micro_steps: int = 2,
              optimizer_steps: int = 1) -> TrialOutcome:
    """Run ``optimizer_steps`` steps of ``micro_steps`` micro-batches of ``micro_batch`` samples."""
    backend.release()
    before = backend.current_bytes()
    backend.reset_peak()
    started = time.perf_counter()
    error = None
    completed = 0
    try:
        for _ in range(optimizer_steps):
            batches = [workload.make_batch(micro_batch) for _ in range(micro_steps)]
            accumulate_gradients(workload.model, batches, workload.raw_loss, workload.task,
                                 workload.loss_is_scaled_for_ga, workload.autocast)
            workload.optimizer.step()
            workload.optimizer.zero_grad(set_to_none=True)
            del batches
            completed += 1
    except Exception as exc:  # noqa: BLE001 - classified right below; anything else re-raises
        if not is_out_of_memory(exc):
            raise
        error = str(exc).splitlines()[0][:200]
    # Recover only here, after the except block: its traceback keeps the failed step's tensors alive.
    if error is not None:
        workload.optimizer.zero_grad(set_to_none=True)
    backend.synchronize()
    seconds = time.perf_counter() - started
    peak = backend.peak_bytes() if error is None else None
    backend.release()
    return TrialOutcome(micro_batch, error is None, peak, seconds, backend.current_bytes(), before, error, completed)
