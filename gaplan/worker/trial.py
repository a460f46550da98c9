"""Running one probe trial: a steady-state accumulated optimizer step at micro-batch ``b``, measured.

Steady state means the optimizer states already exist (AdamW allocates them at its
first step, so a one-step trial sees a lower peak than every later step), at least
two micro-steps accumulate into live gradients, then the optimizer steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from gaplan.core.trial import Trial
from gaplan.devices.backend import Backend, is_out_of_memory
from gaplan.parallel.fsdp import no_sync_for
from gaplan.training.step import accumulate_gradients
from gaplan.workload.build import Workload
from gaplan.workload.loss import count_step_targets


def materialize_optimizer_state(workload: Workload) -> None:
    """Create the optimizer's state tensors without running the model (zero gradients, one step)."""
    make_optimizer_states(workload.model, workload.optimizer)


def make_optimizer_states(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                          step: Callable[[], None] | None = None) -> None:
    """The steady state's optimizer states, made before any measured step (AdamW makes them at its first): zero
    gradients, one step (``step``, default ``optimizer.step``), gradients dropped."""
    for param in model.parameters():
        if param.requires_grad:
            param.grad = torch.zeros_like(param)
    (step or optimizer.step)()
    optimizer.zero_grad(set_to_none=True)


def _no_sync(workload: Workload):
    """What keeps a micro-step from syncing gradients: DDP's ``no_sync``, or FSDP's switch (:func:`no_sync_for`).

    Only a sharded workload asks FSDP: ``no_sync_for`` imports it, and a trial imports nothing under its budget.
    """
    if workload.spec.parallel != "fsdp":
        return getattr(workload.model, "no_sync", None)
    return no_sync_for(workload.model, workload.spec.grad_sync)


def _world_size() -> int:
    """The ranks of this trial: above 1 in a rank of a sharded trial (:mod:`gaplan.worker.ranks`)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _targets_over_ranks(batches: list, task: str) -> int | None:
    """The step's targets summed over the ranks of a multi-rank trial, as training counts them (one all-reduce)."""
    import torch.distributed as dist

    if _world_size() == 1:
        return None  # counted by accumulate_gradients
    total = torch.tensor([count_step_targets(batches, task)], dtype=torch.int64)
    dist.all_reduce(total)
    return int(total.item())


def run_trial(workload: Workload, backend: Backend, micro_batch: int, micro_steps: int = 2,
              optimizer_steps: int = 1, sizes: Sequence[int] | None = None) -> Trial:
    """Run ``optimizer_steps`` steps of ``micro_steps`` micro-batches of ``micro_batch`` samples.

    ``sizes`` gives one step's micro-batch sizes instead (an uneven split, as a plan has).
    """
    sizes = list(sizes) if sizes else [micro_batch] * micro_steps

    def accumulate() -> tuple[int, list]:
        batches = [workload.make_batch(size) for size in sizes]
        # Under DDP, no gradient sync but on the last micro-step, as training does; sharded (FSDP), as the
        # workload's grad_sync says. The loss multiplier stays 1: it scales the loss, not the memory.
        accumulate_gradients(workload.model, batches, workload.raw_loss, workload.task,
                             workload.loss_is_scaled_for_ga, workload.forward_context,
                             num_items_in_batch=_targets_over_ranks(batches, workload.task),
                             no_sync=_no_sync(workload))
        return sum(int(b["attention_mask"].sum()) for b in batches if "attention_mask" in b), batches

    def step() -> None:
        workload.optimizer.step()
        workload.optimizer.zero_grad(set_to_none=True)

    return measure_steps(backend, micro_batch, optimizer_steps, accumulate, step,
                         recover=lambda: workload.optimizer.zero_grad(set_to_none=True), ranks=_world_size())


def measure_steps(backend: Backend, micro_batch: int, optimizer_steps: int,
                  accumulate: Callable[[], tuple[int, object]], step: Callable[[], None], recover: Callable[[], None],
                  ranks: int = 1) -> Trial:
    """``optimizer_steps`` times: ``accumulate()`` (the micro-steps; returns the step's tokens and what it keeps
    alive through the optimizer step, as training keeps its micro-batches), then ``step()``.

    Measures the peak of the micro-steps and of the whole step, each step's time; an out-of-memory error ends the
    trial as not fitting, ``recover()`` (dropping the gradients) runs after the except block. The one measuring
    loop of gaplan's own step and of a user's (:mod:`gaplan.worker.loop_trial`).
    """
    backend.release()
    before = backend.current_bytes()
    started = time.perf_counter()
    error = None
    completed = tokens = 0
    peak = micro_steps_peak = 0
    step_seconds: list[float] = []
    step_cpu_seconds: list[float] = []
    try:
        for _ in range(optimizer_steps):
            backend.reset_peak()
            step_started, cpu_started = time.perf_counter(), time.process_time()
            tokens, held = accumulate()
            micro_steps_peak = max(micro_steps_peak, backend.peak_bytes())  # no optimizer step in it yet
            step()
            peak = max(peak, backend.peak_bytes())  # synchronizes on CUDA, so the step time below is real
            step_seconds.append(time.perf_counter() - step_started)
            step_cpu_seconds.append(time.process_time() - cpu_started)
            del held
            completed += 1
    except Exception as exc:  # noqa: BLE001 - classified right below; anything else re-raises
        if not is_out_of_memory(exc):
            raise
        error = str(exc).splitlines()[0][:200]
    if error is not None and ranks > 1:
        # A rank of a sharded trial reports at once, without cleaning up: its peers wait in a collective it will
        # never join (the parent kills them), and on CUDA a synchronize would wait on their unfinished kernels.
        return Trial(micro_batch, False, None, round(time.perf_counter() - started, 3), error, completed)
    # Recover only here, after the except block: its traceback keeps the failed step's tensors alive.
    if error is not None:
        recover()
    backend.synchronize()
    seconds = time.perf_counter() - started
    backend.release()
    fits = error is None
    return Trial(micro_batch, fits, peak if fits else None, round(seconds, 3), error, completed,
                 micro_steps_peak if fits else None, step_seconds, tokens, before, backend.current_bytes(),
                 step_cpu_seconds=step_cpu_seconds)
