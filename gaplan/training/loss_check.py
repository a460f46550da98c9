"""gaplan's claim, checked on the run itself: the first step's accumulated loss against the same step as one batch.

Before step 1 trains, its samples are fed as ONE batch (forward only, no gradients, the same initial weights and
the same normalization: the summed token losses over the step's target count). The loop then compares it with the
accumulated loss of that step. The check draws nothing from the random generators and puts back every buffer it
touched (BatchNorm's running statistics), so the trained weights are bitwise those of a run without it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from gaplan.core.errors import one_line
from gaplan.data import Sample, collate
from gaplan.devices.backend import is_out_of_memory, release_after_oom
from gaplan.plan.split import Plan, make_plan
from gaplan.runs.folder import LOSS_CHECK_JSON, path_in
from gaplan.runs.schema import read_loss_check_json, write_loss_check_json
from gaplan.training.micro_batches import sample_micro_batches
from gaplan.workload.build import Workload
from gaplan.workload.loss import batch_size, count_step_targets

# Without gradients a forward keeps no activations for a backward: per sample it holds well under half of what a
# training micro-step holds, so one batch of up to twice the (fitting) micro-batch fits too. Larger steps would
# need several times the memory the plan was made to fit, and on a CPU without an enforced budget nothing would
# stop them short of the machine's own limit: they are skipped, not tried.
MAX_BATCH_FACTOR = 2


@dataclass
class LossCheck:
    """Step ``step``'s accumulated loss against the same samples as one batch; ``skipped`` says why not, if not."""

    step: int = 1
    samples: int | None = None
    micro_steps: int | None = None
    accumulated_loss: float | None = None
    large_batch_loss: float | None = None
    skipped: str | None = None

    @property
    def absolute_difference(self) -> float | None:
        if self.accumulated_loss is None or self.large_batch_loss is None:
            return None
        return abs(self.accumulated_loss - self.large_batch_loss)

    @property
    def relative_difference(self) -> float | None:
        difference = self.absolute_difference
        if difference is None:
            return None
        return difference / abs(self.large_batch_loss) if self.large_batch_loss else None

    def to_dict(self) -> dict:
        return {**asdict(self), "absolute_difference": self.absolute_difference,
                "relative_difference": self.relative_difference}

    @classmethod
    def from_dict(cls, data: dict) -> LossCheck:
        """Read back :meth:`to_dict` (the differences are derived, not read)."""
        return cls(**{name: data.get(name) for name in cls.__dataclass_fields__})

    def describe(self) -> str:
        """One line, for the CLI's summary."""
        if self.skipped is not None:
            return f"large-batch check skipped: {self.skipped}"
        relative = "" if self.relative_difference is None else f", {self.relative_difference:.2e} relative"
        return (f"step {self.step}: loss {self.accumulated_loss:.6f} accumulated over {_micro_steps(self.micro_steps)}, "
                f"{self.large_batch_loss:.6f} as one batch of {self.samples} samples (difference "
                f"{self.absolute_difference:.2e}{relative})")


def _micro_steps(count: int | None) -> str:
    return f"{count} micro-step" + ("" if count == 1 else "s")


def skip_reason(workload: Workload, plan: Plan, start_step: int, world_size: int, sharded: bool,
                token_budget: int | None, samples: int) -> str | None:
    """Why the first step cannot be checked (None when it can): decided before anything is built."""
    if start_step > 0:
        return (f"the run resumed at step {start_step + 1}: step 1's initial weights are gone (the check runs when a "
                "run starts)")
    if sharded:
        return "the model is sharded (FSDP): one batch of the step would need the whole model on one rank"
    if world_size > 1:
        return f"{world_size} ranks each hold part of the step; the check runs in single-process runs"
    if workload.loss_is_scaled_for_ga is False:
        return ("the custom loss is a per-batch mean (loss_is_scaled_for_ga False): accumulation averages the "
                "micro-batch means, which is not token-normalized")
    if not token_budget and samples > MAX_BATCH_FACTOR * plan.micro_batch:
        return (f"one batch of the step's {samples} samples is {samples / plan.micro_batch:.0f}x the micro-batch "
                f"({plan.micro_batch}); the check runs up to {MAX_BATCH_FACTOR}x, where it surely fits")
    return None


def one_batch(workload: Workload, plan: Plan, corpus: Sequence[Sample] | None, step: int, seed: int,
              indices: Sequence[int] | None) -> dict[str, torch.Tensor]:
    """The step's samples as one batch: the same samples, masks and padding rule as its micro-batches."""
    if indices is None or corpus is None:
        whole = make_plan(plan.effective_batch, plan.effective_batch)
        return sample_micro_batches(workload, whole, corpus, step, 0, seed)[0]
    batch = collate([corpus[i] for i in indices], workload.task, seed, mask_id=getattr(corpus, "mask_id", 3),
                    pad_id=getattr(corpus, "pad_id", 0))
    return {k: v.to(workload.device) for k, v in batch.items()}


def large_batch_loss(workload: Workload, batch: dict[str, torch.Tensor]) -> float:
    """The normalized loss of ``batch`` as one batch, on the unwrapped model, leaving no trace in the run.

    Forked generators: a model with dropout draws here as in training, and training must not see those draws.
    Buffers (running statistics) are put back: a forward in training mode updates them even without gradients.
    """
    model = workload.model
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    devices = [workload.device] if workload.device.type == "cuda" else []
    num_items = count_step_targets([batch], workload.task)
    if workload.loss_is_scaled_for_ga is True:
        batch = {**batch, "num_items_in_batch": num_items}
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad(), workload.autocast():
            raw = workload.raw_loss(model, batch)
            loss = float(raw if workload.loss_is_scaled_for_ga is True else raw / max(num_items, 1))
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(buffers[name])
    return loss


def check_first_step(workload: Workload, plan: Plan, corpus: Sequence[Sample] | None, seed: int,
                     indices: Sequence[int] | None, token_budget: int | None) -> tuple[LossCheck, float | None]:
    """Step 1 as one batch: the check (its accumulated loss still to fill in) and the one-batch loss, or a skip."""
    samples = len(indices) if indices is not None else plan.effective_batch
    check = LossCheck(samples=samples)
    try:
        batch = one_batch(workload, plan, corpus, 0, seed, indices)
        if token_budget and batch["input_ids"].numel() > MAX_BATCH_FACTOR * token_budget:
            check.skipped = (f"one batch of the step's {samples} samples holds {batch['input_ids'].numel()} padded "
                             f"tokens, over {MAX_BATCH_FACTOR}x the token budget ({token_budget})")
            return check, None
        check.samples = batch_size(batch)
        return check, large_batch_loss(workload, batch)
    except Exception as exc:  # noqa: BLE001 - only an out-of-memory error is a reason to skip; others re-raise
        if not is_out_of_memory(exc):
            raise
        check.skipped = f"one batch of the step's {samples} samples does not fit ({one_line(exc)[:120]})"
    finally:
        batch = None  # noqa: F841 - no reference to the batch outlives the check
        release_after_oom(workload.device)  # give the one batch's memory back (CUDA's cache keeps it otherwise)
    return check, None


def save_loss_check(run_dir: str, check: LossCheck) -> None:
    """``loss_check.json`` in the run folder, for the report."""
    write_loss_check_json(path_in(run_dir, LOSS_CHECK_JSON), check.to_dict())


def load_loss_check(run_dir: str | None) -> dict | None:
    """The folder's ``loss_check.json`` as saved, or None (a resumed run keeps the check of the run's start)."""
    path = path_in(run_dir or ".", LOSS_CHECK_JSON)
    return read_loss_check_json(path) if os.path.isfile(path) else None
