"""Which samples each micro-step of an optimizer step gets: by the plan's sizes, or packed by tokens.

Every step takes the same samples (``step_indices``: seeded, epoch by epoch) whatever the split, which is what
makes accumulation, an OOM fallback and a resume give the weights of one large batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from gaplan.data import Sample, collate, step_indices
from gaplan.distributed import Distributed
from gaplan.errors import GaplanError
from gaplan.packing import PackingError, pack_step
from gaplan.plan import Plan
from gaplan.tasks import IGNORE_INDEX
from gaplan.workload import Workload

PLACEHOLDER = "gaplan_placeholder"  # marks an empty micro-step's stand-in batch (all labels ignored)


def sample_micro_batches(workload: Workload, plan: Plan, corpus: Sequence[Sample] | None, step: int, rank: int,
                   seed: int) -> list[dict[str, torch.Tensor]]:
    """This rank's micro-batches of step ``step``, split by the plan's sizes."""
    sizes = plan.rank_micro_batch_sizes[rank]
    if corpus is None:  # a custom workload makes its own batches: seed them by step so resume sees the same
        generator_state = torch.get_rng_state()
        torch.manual_seed(seed * 1_000_003 + step * 97 + rank)
        whole = workload.make_batch(sum(sizes))
        torch.set_rng_state(generator_state)
        return [{k: v[start:end] for k, v in whole.items()} for start, end in _bounds(sizes)]
    indices = step_indices(step, plan.effective_batch, len(corpus), seed)
    share = plan.effective_batch // plan.world_size
    mine = indices[rank * share:(rank + 1) * share]
    batches = []
    for start, end in _bounds(sizes):
        batch = collate([corpus[i] for i in mine[start:end]], workload.task, seed,
                        mask_id=getattr(corpus, "mask_id", 3), pad_id=getattr(corpus, "pad_id", 0))
        batches.append({k: v.to(workload.device) for k, v in batch.items()})
    return batches


def token_micro_batches(workload: Workload, plan: Plan, corpus: Sequence[Sample] | None, step: int,
                         dist: Distributed, seed: int, token_budget: int) -> list[dict[str, torch.Tensor]]:
    """This rank's micro-batches of step ``step`` packed by tokens (:func:`gaplan.packing.pack_step`).

    An empty micro-step (this rank has fewer samples to split than another rank has micro-steps) feeds one of
    its samples with every label ignored: no target, no gradient, but the forward and backward that DDP's
    and FSDP's collectives wait for.
    """
    if corpus is None:
        raise GaplanError("--batch-by tokens needs data whose samples have lengths (text data or a preset's "
                          "synthetic corpus); a module:function workload makes its own batches")
    indices = step_indices(step, plan.effective_batch, len(corpus), seed)
    samples = [corpus[i] for i in indices]
    try:
        packed = pack_step([len(sample.ids) for sample in samples], token_budget, dist.world_size)
    except PackingError as exc:
        raise GaplanError(f"step {step + 1}: {exc}") from None
    mine = packed.micro_batches[dist.rank]
    stand_in = next(batch for batch in mine if batch)[:1]
    batches = []
    for positions in mine:
        batch = collate([samples[p] for p in positions or stand_in], workload.task, seed,
                        mask_id=getattr(corpus, "mask_id", 3), pad_id=getattr(corpus, "pad_id", 0))
        if not positions:
            batch["labels"] = torch.full_like(batch["labels"], IGNORE_INDEX)
            batch[PLACEHOLDER] = True
        batches.append({k: (v.to(workload.device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()})
    return batches


def longest_sample(micro_batches: Sequence[dict[str, torch.Tensor]]) -> int:
    """The longest sample's tokens in a step's micro-batches (padded width)."""
    return max(int(batch["input_ids"].shape[1]) for batch in micro_batches)


def _bounds(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of each micro-batch within the step's samples."""
    ends = list(itertools.accumulate(sizes))
    return list(zip([0, *ends[:-1]], ends, strict=True))
