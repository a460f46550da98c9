"""One optimizer step of accumulated micro-batches: the token-exact loss over all ranks, the scaler, clipping.

:func:`gaplan.training.step.accumulate_gradients` runs the micro-steps; this adds what a step of a real run needs
around them: the step's target count summed over ranks, DDP's average undone, fp16's scaler, gradient clipping,
and an optimizer step that runs out of memory reported as such (a smaller micro-batch cannot cure it).
"""

from __future__ import annotations

import torch
from torch import nn

from gaplan.core.errors import GaplanError, one_line
from gaplan.devices.backend import is_out_of_memory
from gaplan.parallel.fsdp import is_sharded, no_sync_for
from gaplan.parallel.process_group import Distributed
from gaplan.training.micro_batches import PLACEHOLDER
from gaplan.training.noise_scale import NoiseScaleMeter
from gaplan.training.oom import OomAgreement
from gaplan.training.step import accumulate_gradients
from gaplan.workload.build import Workload
from gaplan.workload.loss import batch_size, count_step_targets


class OptimizerStepDoesNotFit(GaplanError):
    """The optimizer step ran out of memory: not cured by a smaller micro-batch, so not retried."""


def optimizer_step(workload: Workload, model: nn.Module, micro_batches: list[dict], dist: Distributed,
                   scaler: torch.amp.GradScaler | None, max_grad_norm: float | None,
                   agreement: OomAgreement | None = None, noise: NoiseScaleMeter | None = None,
                   parts: list[tuple[tuple[int, int], ...]] | None = None) -> tuple[float, int]:
    """Accumulate, then step. Returns the large-batch loss and the tokens seen (all ranks); ``noise`` measures the
    gradient noise scale of the step (its reading in ``noise.last``), told which draws each micro-batch's samples
    come from by ``parts`` (:func:`gaplan.training.micro_batches.micro_batch_parts`)."""
    # Each micro-batch counted once: the step's total, and each one's share for the noise scale.
    counts = [count_step_targets([mb], workload.task) for mb in micro_batches]
    num_items = int(dist.sum(sum(counts)))
    if noise is not None:
        noise.skip()  # a step redone after an OOM starts its measurement again
    # DDP averages gradients over ranks; a token-normalized loss must be summed, so undo the average.
    # FSDP here sums already (gaplan.parallel.fsdp sets it on every unit).
    averaged = dist.active and not is_sharded(model) and workload.loss_is_scaled_for_ga is not False
    result = accumulate_gradients(
        model, micro_batches, workload.raw_loss, workload.task, workload.loss_is_scaled_for_ga, workload.forward_context,
        num_items_in_batch=num_items, loss_multiplier=dist.world_size if averaged else 1,
        no_sync=no_sync_for(model, workload.spec.grad_sync),
        scale=scaler.scale if scaler is not None else None,
        before_last=agreement.before_last if agreement is not None and dist.active else None,
        before_last_backward=agreement.before_last_backward if agreement is not None and dist.active else None,
        noise=noise, grad_scale=float(scaler.get_scale()) if scaler is not None and noise is not None else 1.0,
        items_per_batch=counts, parts_per_batch=parts)
    if scaler is not None:
        scaler.unscale_(workload.optimizer)  # before clipping: clip the true gradient
    if noise is not None:  # the reduced, unscaled step gradient, before clipping changes it
        noise.finish(sum(batch_size(mb) for mb in micro_batches if PLACEHOLDER not in mb))
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(workload.model.parameters(), max_grad_norm)
    try:
        if scaler is not None:
            scaler.step(workload.optimizer)
            scaler.update()
        else:
            workload.optimizer.step()
    except Exception as exc:  # noqa: BLE001 - classified right below; anything else re-raises
        if not is_out_of_memory(exc):
            raise
        # A smaller micro-batch frees activations, not the step's own temporaries: retrying cannot help, and a
        # foreach step that failed part-way must not be applied a second time.
        raise OptimizerStepDoesNotFit(f"the optimizer step itself does not fit ({one_line(exc)[:160]}); a smaller "
                                      "micro-batch cannot help: give it more memory, or use --optimizer sgd") from None
    workload.optimizer.zero_grad(set_to_none=True)
    tokens = sum(int(mb["attention_mask"].sum()) if "attention_mask" in mb and PLACEHOLDER not in mb else 0
                 for mb in micro_batches)
    loss = result.loss
    if dist.active and workload.loss_is_scaled_for_ga is not False:
        loss = dist.sum(loss)  # each rank's share of the global normalized loss
    elif dist.active:
        loss = dist.sum(loss) / dist.world_size
    return loss, int(dist.sum(tokens))


def grad_scaler(workload: Workload, shards: bool) -> torch.amp.GradScaler | None:
    """fp16's loss scaler; for a sharded model the one that agrees over ranks on skipping a step (each rank
    sees only its shards' infinities)."""
    if workload.spec.dtype != "fp16":
        return None
    if shards:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(workload.device.type)
    return torch.amp.GradScaler(workload.device.type)
