"""A training step that runs out of memory is redone at half the micro-batch (or token budget), all ranks together.

The loop calls :func:`step_until_it_fits` once per optimizer step. Under DDP the ranks agree through
:class:`~gaplan.training.oom.OomAgreement`; under FSDP, or in the backward DDP synchronizes, the failing rank
stops and torchrun's restart redoes the step (:func:`~gaplan.training.oom.stranded_out_of_memory`). At
micro-batch 1 (or a budget no larger than the longest sample) nothing smaller exists, and the error is the user's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gaplan.core.errors import GaplanError
from gaplan.data import Sample
from gaplan.devices.backend import is_out_of_memory, release_after_oom
from gaplan.parallel.process_group import Distributed
from gaplan.plan.split import Plan
from gaplan.training.micro_batches import (
    PLACEHOLDER,
    longest_sample,
    micro_batch_parts,
    sample_micro_batches,
    token_micro_batches,
)
from gaplan.training.noise_scale import NoiseScaleMeter
from gaplan.training.oom import OomAgreement, PeerOutOfMemory, halved_sizes, stranded_out_of_memory
from gaplan.training.optimizer_step import optimizer_step
from gaplan.workload.build import Workload


@dataclass
class StepDone:
    """One optimizer step that fitted, and the sizes it fitted at (smaller than asked after an OOM)."""

    loss: float
    tokens: int  # real tokens, all ranks
    padded: int  # token positions fed, padding included, all ranks
    micro_batches: list[dict]
    plan: Plan
    token_budget: int | None


@dataclass
class StepInputs:
    """What every attempt of a step reads: the model as trained (DDP-wrapped or sharded) and where data comes from."""

    workload: Workload
    model: nn.Module
    corpus: Sequence[Sample] | None
    dist: Distributed
    scaler: torch.amp.GradScaler | None
    max_grad_norm: float | None
    seed: int
    shards: bool
    run_dir: str | None
    noise: NoiseScaleMeter | None = None  # measures the gradient noise scale of each step


def step_until_it_fits(inputs: StepInputs, step: int, plan: Plan, token_budget: int | None, indices: list[int] | None,
                       on_fallback: Callable[[str], None], first_sample: int | None = None) -> StepDone:
    """Train step ``step``; on an OOM, halve and redo it (``on_fallback`` hears why) until it fits.
    ``first_sample``: where the step's samples start in the data's order (a batch schedule's or a token step's;
    default by step)."""
    workload, dist = inputs.workload, inputs.dist
    while True:
        micro_batches = (token_micro_batches(workload, plan, inputs.corpus, step, dist, inputs.seed, token_budget,
                                             indices)
                         if token_budget else
                         sample_micro_batches(workload, plan, inputs.corpus, step, dist.rank, inputs.seed,
                                              first_sample))
        parts = (micro_batch_parts(plan, inputs.corpus, step, dist.rank, inputs.seed, first_sample, token_budget,
                                   indices)
                 if inputs.noise is not None and inputs.noise.drawing.without_replacement else None)
        agreement = OomAgreement(dist)
        try:
            loss, tokens = optimizer_step(workload, inputs.model, micro_batches, dist, inputs.scaler,
                                          inputs.max_grad_norm, agreement, inputs.noise, parts)
            padded = int(dist.sum(sum(int(mb["attention_mask"].numel()) for mb in micro_batches
                                      if "attention_mask" in mb and PLACEHOLDER not in mb)))
            return StepDone(loss, tokens, padded, micro_batches, plan, token_budget)
        except Exception as exc:  # noqa: BLE001 - classified right below
            smallest = token_budget <= longest_sample(micro_batches) if token_budget else plan.micro_batch == 1
            if not (is_out_of_memory(exc) or isinstance(exc, PeerOutOfMemory)):
                raise
            where = "another rank" if isinstance(exc, PeerOutOfMemory) else getattr(exc, "gaplan_phase", "")
            if smallest:  # nothing left to halve: the budget is too small for this workload
                size = f"a token budget of {token_budget}" if token_budget else "micro-batch 1"
                raise GaplanError(f"step {step + 1}: out of memory at {size}{f' (in {where})' if where else ''}, the "
                                  "smallest split of a step: it does not fit this budget; give more memory "
                                  "(--memory-limit), or a memory lever (--grad-checkpointing on, --loss chunked, "
                                  "--optimizer sgd: docs/levers.md)") from None
            if inputs.shards or (dist.active and getattr(exc, "gaplan_in_collective", False)):
                raise stranded_out_of_memory(exc, step, plan, token_budget, micro_batches, dist, inputs.run_dir,
                                             inputs.shards) from None
            agreement.report_own_failure()
        workload.optimizer.zero_grad(set_to_none=True)  # after the except block: the traceback is gone
        release_after_oom(workload.device)
        halved = halved_sizes(plan, token_budget, micro_batches)
        on_fallback(f"step {step + 1}: out of memory at {halved.was}{f' (in {where})' if where else ''}; "
                    f"redoing the step with {halved.now}")
        plan, token_budget = halved.plan, halved.token_budget
