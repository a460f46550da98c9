"""Token-exact loss normalization for gradient accumulation.

Summing per-micro-batch *mean* losses and dividing by the accumulation steps weighs
each token by 1/(its micro-batch's token count). The exact rule: sum the token
losses of a micro-batch and divide by ``num_items_in_batch``, the number of
prediction targets in *all* micro-batches of the optimizer step (and all ranks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from gaplan.core.errors import GaplanError
from gaplan.core.tasks import IGNORE_INDEX
from gaplan.data.tasks.component import batch_size
from gaplan.data.tasks.registry import task_component

__all__ = ["batch_size", "count_step_targets", "count_targets", "loss_targets", "normalized_loss",
           "summed_token_loss"]  # batch_size: the components' rule, shared from here as before


def count_targets(batch: Mapping[str, Any], task: str) -> int:
    """Prediction targets in one micro-batch, as the loss will count them (the task's component counts them).

    Causal LM shifts labels (position 0 has no target) unless the batch carries
    ``shift_labels``; other tasks count the full label tensor, ignoring -100.
    """
    with _named_key(task):
        return task_component(task).count_targets(batch)


def count_step_targets(micro_batches: Iterable[Mapping[str, Any]], task: str) -> int:
    """``num_items_in_batch`` for one optimizer step on this rank (samples, for a custom workload)."""
    with _named_key(task):
        return task_component(task).count_step_targets(micro_batches)


@contextlib.contextmanager
def _named_key(task: str) -> Iterator[None]:
    """A batch without what the task counts its targets from (``labels``): one line, not a KeyError."""
    try:
        yield
    except KeyError as exc:
        raise GaplanError(f"a micro-batch has no {exc.args[0]!r}: the {task} loss counts its targets from it") from None


def loss_targets(batch: Mapping[str, Any], task: str) -> torch.Tensor:
    """The target of each position of a micro-batch's logits (``IGNORE_INDEX`` where none), shaped like the labels
    (causal LM's labels shifted by one)."""
    return task_component(task).loss_targets(batch)


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
    if not isinstance(raw_loss, torch.Tensor) or raw_loss.numel() != 1:  # a float, a per-sample vector: say so
        shape = f"a tensor of shape {tuple(raw_loss.shape)}" if isinstance(raw_loss, torch.Tensor) else \
            f"a {type(raw_loss).__name__}"
        raise GaplanError(f"the loss function must return a scalar tensor, one number to backpropagate (got {shape})")
    if loss_is_scaled_for_ga is True:
        return raw_loss
    if loss_is_scaled_for_ga is False:
        return raw_loss / accum_steps
    return raw_loss / max(num_items_in_batch, 1)
