"""gaplan for accelerate users: the micro-batch of your own step, its plan fed by a batch sampler, and the
token-exact loss over ``accelerator.accumulate``.

accelerate's ``find_executable_batch_size`` multiplies the batch by 0.9 on each OOM and ignores accumulation.
:func:`plan_accelerator` instead probes your step (:func:`gaplan.probing.loop.probe_loop`: fresh processes under
the budget, at steady state, under the Accelerator's mixed precision, your ``optimizer_step`` too) and plans the
effective batch over ``accelerator.num_processes`` at B* itself. It never changes the Accelerator: how your loop
scales its loss decides what ``gradient_accumulation_steps`` must be, and only your loop knows it.

* The ``accumulate`` form (``accelerator.backward`` divides by ``gradient_accumulation_steps``): set
  ``accelerator.gradient_accumulation_steps = result.plan.grad_accum_steps`` yourself, and do not divide again.
  Build the Accelerator with ``GradientAccumulationPlugin(num_steps=1, sync_with_dataloader=False)``: the recipe
  takes a step's micro-batches before their backward (to count the step's targets), and an Accelerator that syncs
  at the end of its dataloader would sync every micro-batch of an epoch's last step (:func:`count_step_items`
  refuses it).
* The manual form (your loop divides its loss by its own accumulation steps and steps the optimizer every
  ``result.plan.grad_accum_steps`` micro-batches): leave the Accelerator at 1.

An Accelerator built to accumulate another number of steps than the plan's is warned about in one line. The plan
may be uneven (``12 x14, 11 x8``): :class:`gaplan.data.plan_sampler.PlanBatchSampler` feeds it to ``prepare``::

    accelerator = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=1,
                                                                                      sync_with_dataloader=False))
    result = plan_accelerator(accelerator, setup, make_batch, micro_step, effective_batch=256)
    accelerator.gradient_accumulation_steps = result.plan.grad_accum_steps
    loader = accelerator.prepare(DataLoader(data, batch_sampler=PlanBatchSampler(result.plan, len(data)),
                                            collate_fn=collate))
    batches = iter(loader)
    for _ in range(len(loader) // result.plan.grad_accum_steps):
        micro_batches = [next(batches) for _ in range(result.plan.grad_accum_steps)]
        items = count_step_items(accelerator, micro_batches, "causal-lm")
        for batch in micro_batches:
            with accelerator.accumulate(model):
                summed = summed_token_loss(model(**batch).logits, batch, "causal-lm")
                accelerator.backward(step_loss(accelerator, summed, items))
                optimizer.step(); optimizer.zero_grad()

:func:`step_loss` gives ``sum / num_items_in_batch`` over the whole optimizer step and all ranks: it undoes the
``1 / gradient_accumulation_steps`` that ``accelerator.backward`` applies and DDP's mean over the ranks, so uneven
and padded micro-batches give the one-large-batch gradient.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gaplan.core.errors import GaplanError
from gaplan.probing.loop import LoopProbeResult, probe_loop

log = logging.getLogger(__name__)


def accelerator_device(accelerator: Any) -> str:
    """``cpu`` or ``cuda:N``: where this process of the Accelerator trains."""
    device = accelerator.device
    return "cpu" if device.type == "cpu" else f"{device.type}:{device.index or 0}"


@dataclass(frozen=True)
class AutocastStep:
    """Your ``micro_step`` under the Accelerator's mixed precision. It holds ``torch.autocast``'s arguments, not the
    Accelerator: picklable with your step, for a trial spawned where this process cannot fork."""

    micro_step: Callable[[Any, Any], Any]
    autocast: dict[str, Any] | None  # torch.autocast's arguments; None: the Accelerator trains without autocast

    def __call__(self, model: Any, batch: Any) -> Any:
        if self.autocast is None:
            return self.micro_step(model, batch)
        import torch

        with torch.autocast(**self.autocast):
            return self.micro_step(model, batch)


def accelerator_autocast(accelerator: Any) -> dict[str, Any] | None:
    """The ``torch.autocast`` arguments of ``accelerator.autocast()``, as accelerate itself chooses them."""
    import torch
    from accelerate.utils import get_mixed_precision_context_manager

    context = get_mixed_precision_context_manager(accelerator.native_amp, accelerator.autocast_handler)
    if not isinstance(context, torch.autocast):
        return None
    handler = accelerator.autocast_handler
    return dict(device_type=context.device, dtype=context.fast_dtype, **(handler.to_kwargs() if handler else {}))


def plan_accelerator(accelerator: Any, setup: Callable[[], tuple[Any, Any]], make_batch: Callable[[int], Any],
                     micro_step: Callable[[Any, Any], Any], optimizer_step: Callable[[Any, Any], Any] | None = None,
                     *, effective_batch: int, memory_limit: int | str | None = None, search_cap: int | None = None,
                     threads: int | None = None, on_trial: Callable[[Any], None] | None = None,
                     progress: bool = True) -> LoopProbeResult:
    """Probe ``micro_step`` (your forward and backward) under the Accelerator's mixed precision and
    ``optimizer_step`` (clipping, a scheduler: default ``step()`` then ``zero_grad``), and plan ``effective_batch``
    over the Accelerator's processes at B*.

    ``setup``, ``make_batch``, ``micro_step``, ``optimizer_step`` and ``progress`` (a bar of the trials) are
    :func:`gaplan.probing.loop.probe_loop`'s.
    Over several processes the main one probes (its device is every rank's) and every rank takes its answer.
    Returns the probe: ``result.plan`` (``result.split``, the same) is the per-process split at B*, possibly uneven;
    feed it with :class:`gaplan.data.plan_sampler.PlanBatchSampler`. The Accelerator is left as it is (see the
    module docstring for the two loss forms); one warning when it accumulates another number of steps.
    """
    if not hasattr(accelerator, "num_processes"):  # None, a name: said so, not an AttributeError
        raise GaplanError(f"plan_accelerator takes your accelerate.Accelerator (got {accelerator!r})")
    world = accelerator.num_processes
    result = None
    if accelerator.is_main_process:
        autocast_step = AutocastStep(micro_step, accelerator_autocast(accelerator))
        result = probe_loop(setup, make_batch, autocast_step, optimizer_step,
                            device=accelerator_device(accelerator), memory_limit=memory_limit,
                            effective_batch=effective_batch, world_size=world, search_cap=search_cap,
                            threads=threads, on_trial=on_trial, progress=progress)
    if world > 1:
        from accelerate.utils import broadcast_object_list

        result = broadcast_object_list([result])[0]
    assert result is not None
    steps = accelerator.gradient_accumulation_steps
    if steps != 1 and steps != result.plan.grad_accum_steps:
        warnings.warn(f"your Accelerator accumulates {steps} micro-steps (accelerator.backward divides the loss by "
                      f"{steps}), but gaplan's plan runs {result.plan.grad_accum_steps} per optimizer step "
                      f"({result.plan.describe()}); plan_accelerator does not change the Accelerator: set "
                      f"accelerator.gradient_accumulation_steps = result.plan.grad_accum_steps", stacklevel=2)
    log.info("plan_accelerator: %s", result.describe())
    return result


SYNC_WITH_DATALOADER_FIX = ("Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=1, "
                            "sync_with_dataloader=False))")


def count_step_items(accelerator: Any, micro_batches: Iterable[Mapping[str, Any]], task: str) -> int:
    """``num_items_in_batch`` of one optimizer step over all processes: the targets of its micro-batches.

    The step's micro-batches are taken from the loader before the first of them runs backward. Under ``accumulate``
    an Accelerator that syncs at the end of its dataloader (accelerate's default) then syncs on every micro-batch of
    an epoch's last step, as the loader has handed out its last batch already: the optimizer would step on each
    partial gradient. That Accelerator is refused here, at the first step, in one line that says how to build it."""
    import torch

    from gaplan.workload.loss import count_step_targets

    state = accelerator.gradient_state
    if accelerator.gradient_accumulation_steps > 1 and state.sync_with_dataloader and state.in_dataloader:
        raise GaplanError("count_step_items: the step's micro-batches are taken before their backward, and this "
                          "Accelerator syncs at the end of its dataloader, so on an epoch's last step accumulate() "
                          "would step the optimizer on every micro-batch; build it with "
                          f"{SYNC_WITH_DATALOADER_FIX} (the plan's steps set later)")

    local = torch.tensor([count_step_targets(micro_batches, task)], device=accelerator.device)
    return int(accelerator.reduce(local, reduction="sum").item())


def step_loss(accelerator: Any, summed_loss: Any, step_items: int) -> Any:
    """A micro-batch's summed token loss as the share of the step's ``sum / num_items`` to pass to
    ``accelerator.backward``: times the accumulation steps (which ``backward`` divides by) and the processes (whose
    gradients DDP averages)."""
    if not isinstance(step_items, int) or isinstance(step_items, bool) or step_items < 0:
        raise GaplanError(f"step_items is the step's target count, 0 or more (count_step_items), got {step_items!r}")
    return summed_loss * (accelerator.gradient_accumulation_steps * accelerator.num_processes) / max(step_items, 1)
