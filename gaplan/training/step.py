"""One optimizer step accumulated over micro-batches, with the token-exact loss.

Shared by the probe's trials and the training loop, so that what the probe measures
is exactly what training runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gaplan.core.errors import GaplanError
from gaplan.devices.mkl import release_gemm_workspace
from gaplan.training.noise_scale import NoiseScaleMeter
from gaplan.workload.loss import batch_size, count_step_targets, normalized_loss


@dataclass(frozen=True)
class StepResult:
    """The large-batch loss of the step and how many targets it had."""

    loss: float
    num_items_in_batch: int
    samples: int


def accumulate_gradients(
    model: nn.Module,
    micro_batches: Sequence[Mapping[str, Any]],
    raw_loss: Callable[[nn.Module, Mapping[str, Any]], torch.Tensor],
    task: str,
    loss_is_scaled_for_ga: bool | None = None,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    num_items_in_batch: int | None = None,
    loss_multiplier: float = 1.0,
    no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
    scale: Callable[[torch.Tensor], torch.Tensor] | None = None,
    before_last: Callable[[], None] | None = None,
    before_last_backward: Callable[[], None] | None = None,
    noise: NoiseScaleMeter | None = None,
    grad_scale: float = 1.0,
    items_per_batch: list[int] | None = None,
    parts_per_batch: list[tuple[tuple[int, int], ...]] | None = None,
) -> StepResult:
    """Forward and backward every micro-batch so the summed gradient is the large-batch gradient.

    Args:
        micro_batches: this rank's micro-batches of one optimizer step.
        raw_loss: ``raw_loss(model, batch)``, a micro-batch's loss: a sum over targets for the built-in tasks,
            or a custom loss described by ``loss_is_scaled_for_ga``.
        num_items_in_batch: targets in the whole step over all ranks (default: counted here).
        loss_multiplier: the world size under DDP, which averages gradients over ranks.
        no_sync: DDP's ``model.no_sync``, used on every micro-step but the last.
        scale: a GradScaler's ``scale`` for fp16.
        before_last: called before the last micro-batch, the one whose backward DDP synchronizes
            (training uses it to agree across ranks that no micro-step ran out of memory).
        before_last_backward: called between the last micro-batch's forward and its backward (the
            same agreement, for an OOM in that forward).
        noise: a :class:`gaplan.training.noise_scale.NoiseScaleMeter`, told each micro-step's size and how its
            contribution to ``.grad`` relates to its own mean gradient; ``grad_scale`` the loss scale (fp16).
        items_per_batch: each micro-batch's targets on this rank, when the caller has counted them (default: counted
            here, for the noise scale; a count reads a value off the device).
        parts_per_batch: each micro-batch's samples per draw, for the noise scale where they were drawn without
            replacement (:meth:`gaplan.training.noise_scale.NoiseScaleMeter.end_micro_step`).
    """
    if num_items_in_batch is None:
        num_items_in_batch = count_step_targets(micro_batches, task)
    elif not isinstance(num_items_in_batch, int) or isinstance(num_items_in_batch, bool) or num_items_in_batch < 0:
        raise GaplanError(f"num_items_in_batch is the step's target count, 0 or more (got {num_items_in_batch!r})")
    steps = len(micro_batches)
    total = 0.0
    for index, batch in enumerate(micro_batches):
        # MKL's cached GEMM buffers count against the CPU budget and grow with the shapes run before: release
        # them, so that every micro-step (a trial's, a training step's, a retry after an OOM) starts with none
        # and needs what its own shape needs (gaplan.devices.mkl says what was measured).
        release_gemm_workspace()
        if loss_is_scaled_for_ga is True:
            batch = {**batch, "num_items_in_batch": num_items_in_batch}
        if before_last is not None and index == steps - 1:
            before_last()
        sync = no_sync if (no_sync is not None and index < steps - 1) else contextlib.nullcontext
        with sync():
            phase = "forward"
            try:
                with autocast():
                    loss = normalized_loss(raw_loss(model, batch), num_items_in_batch, steps, loss_is_scaled_for_ga)
                total += float(loss.detach())
                loss = loss * loss_multiplier
                if before_last_backward is not None and index == steps - 1:
                    before_last_backward()
                phase = "backward"
                if noise is not None:
                    noise.start_micro_step()
                (scale(loss) if scale is not None else loss).backward()
                if noise is not None:
                    items = items_per_batch[index] if items_per_batch is not None else count_step_targets([batch], task)
                    # Its loss: its sum over the step's items, or its mean over the steps (= its sum / (items x steps)).
                    divisor = items * steps if loss_is_scaled_for_ga is False else num_items_in_batch
                    noise.end_micro_step(items, divisor, loss_multiplier, grad_scale,
                                         parts_per_batch[index] if parts_per_batch is not None else None)
            except Exception as exc:
                # Where it failed, for the caller's message (an OOM in a later micro-step's forward or backward).
                exc.gaplan_phase = f"the {phase} of micro-step {index + 1} of {steps}"  # type: ignore[attr-defined]
                # The backward DDP synchronizes: the peers wait in its all-reduce, where no vote can reach them.
                synced = no_sync is not None and sync is not no_sync
                exc.gaplan_in_collective = phase == "backward" and synced  # type: ignore[attr-defined]
                raise
        del loss  # free the graph's last reference before the next micro-batch
    release_gemm_workspace()  # nor into the optimizer step
    return StepResult(total, num_items_in_batch, sum(batch_size(mb) for mb in micro_batches))

