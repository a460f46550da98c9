"""Token-exact loss normalization for gradient accumulation.

Summing per-micro-batch *mean* losses and dividing by the accumulation steps weighs
each token by 1/(its micro-batch's token count). The exact rule: sum the token
losses of a micro-batch and divide by ``num_items_in_batch``, the number of
prediction targets in *all* micro-batches of the optimizer step (and all ranks).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from gaplan.core.tasks import CAUSAL_LM, CUSTOM, IGNORE_INDEX


def count_targets(batch: Mapping[str, Any], task: str) -> int:
    """Prediction targets in one micro-batch, as the loss will count them.

    Causal LM shifts labels (position 0 has no target) unless the batch carries
    ``shift_labels``; other tasks count the full label tensor, ignoring -100.
    """
    if task == CAUSAL_LM:
        if "shift_labels" in batch:
            return int((batch["shift_labels"] != IGNORE_INDEX).sum())
        return int((batch["labels"][..., 1:] != IGNORE_INDEX).sum())
    if "labels" in batch:
        return int((batch["labels"] != IGNORE_INDEX).sum())
    return batch_size(batch)  # a custom batch without labels: one item per sample


def count_step_targets(micro_batches: Iterable[Mapping[str, Any]], task: str) -> int:
    """``num_items_in_batch`` for one optimizer step on this rank (samples, for a custom workload)."""
    if task == CUSTOM:
        return sum(batch_size(mb) for mb in micro_batches)
    return sum(count_targets(mb, task) for mb in micro_batches)


def batch_size(batch: Mapping[str, Any]) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    first = next(v for v in batch.values() if isinstance(v, torch.Tensor))
    return int(first.shape[0])


def loss_targets(batch: Mapping[str, Any], task: str) -> torch.Tensor:
    """The target of each position of a micro-batch's logits (``IGNORE_INDEX`` where none), shaped like the labels."""
    if task == CAUSAL_LM:
        if "shift_labels" in batch:
            return batch["shift_labels"]
        # Shift the labels, not the logits (as transformers does): slicing off the last position
        # makes the flattened logits a copy, and its backward another; that cost 10% of a tiny-gpt2 step.
        return F.pad(batch["labels"][..., 1:], (0, 1), value=IGNORE_INDEX)
    return batch["labels"]


def summed_token_loss(logits: torch.Tensor, batch: Mapping[str, Any], task: str) -> torch.Tensor:
    """Sum (not mean) of the per-target cross-entropy of one micro-batch, in fp32."""
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        loss_targets(batch, task).reshape(-1).to(logits.device),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def normalized_loss(
    raw_loss: torch.Tensor, num_items_in_batch: int, accum_steps: int, loss_is_scaled_for_ga: bool | None
) -> torch.Tensor:
    """Turn one micro-batch's loss into its share of the large-batch loss.

    ``loss_is_scaled_for_ga`` describes a custom loss: ``True`` means it already
    divided by ``num_items_in_batch``; ``False`` means it is a per-batch mean (so it
    is divided by the accumulation steps); ``None`` means ``raw_loss`` is a sum
    over targets (the built-in tasks) and is divided by ``num_items_in_batch``.
    """
    if loss_is_scaled_for_ga is True:
        return raw_loss
    if loss_is_scaled_for_ga is False:
        return raw_loss / accum_steps
    return raw_loss / max(num_items_in_batch, 1)
