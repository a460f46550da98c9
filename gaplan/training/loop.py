"""The accumulated training loop: token-exact loss, DDP ``no_sync``, checkpoints, resume, OOM fallback.

Step ``s`` always trains on the same samples (:func:`gaplan.data.step_indices`), and
checkpoints hold model, optimizer, scheduler, RNG states, the step and the plan, so
``resume`` reaches the same weights as an uninterrupted run (bitwise on CPU). The pieces, by idea:
:mod:`~gaplan.training.checkpoint` (save and restore), :mod:`~gaplan.training.oom_retry` (a step redone
smaller after an OOM), :mod:`~gaplan.training.optimizer_step` (one step), :mod:`~gaplan.training.train_log`.
"""

from __future__ import annotations

import math
import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gaplan.core.disk import WriteFailed
from gaplan.core.errors import GaplanError, is_rank_own, mark_rank_own
from gaplan.data import Sample
from gaplan.parallel.fsdp import is_sharded
from gaplan.parallel.process_group import Distributed
from gaplan.plan.draws import Drawing
from gaplan.plan.goodput import SCHEDULE_LR_SCALING
from gaplan.plan.split import Plan, make_plan
from gaplan.training.batch_schedule import ScheduleFollower
from gaplan.training.checkpoint import RunState
from gaplan.training.config import TrainConfig
from gaplan.training.loss_check import LossCheck, check_first_step, save_loss_check, skip_reason
from gaplan.training.micro_batches import TokenSteps
from gaplan.training.noise_scale import NoiseScaleMeter
from gaplan.training.oom_retry import StepInputs, step_until_it_fits
from gaplan.training.optimizer_step import grad_scaler
from gaplan.training.train_log import StepLog, append_log, remove_log, truncate_log
from gaplan.workload.build import Workload
from gaplan.workload.loss import batch_size


@dataclass
class TrainResult:
    """What the run did: per-step logs, the plan it ended with, and any OOM fallbacks."""

    logs: list[StepLog]
    plan: Plan
    oom_fallbacks: list[str] = field(default_factory=list)
    interrupted: bool = False
    seconds: float = 0.0
    padded_tokens: int = 0  # token positions fed, padding included (all ranks, all steps)
    real_tokens: int = 0  # of which real tokens (attention mask)
    loss_check: LossCheck | None = None  # step 1 against the same samples as one batch (or why it was skipped)
    checkpoint_step: int | None = None  # the step the run folder's checkpoint holds at the end (None: none)
    noise_drawing: str | None = None  # how the noise scale took the samples' draws (gaplan.plan.draws.KINDS)

    @property
    def padding_fraction(self) -> float | None:
        """The share of the fed positions that were padding (None for data without an attention mask)."""
        return 1 - self.real_tokens / self.padded_tokens if self.padded_tokens else None


def _schedule(config: TrainConfig, batch_factor: Callable[[], float] = lambda: 1.0) -> Callable[[int], float]:
    """Linear warm-up then cosine decay to 10% (a common default), times ``batch_factor()`` (a batch schedule's
    learning-rate scaling at the current effective batch)."""
    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps * batch_factor()
        span = max(1, config.steps - config.warmup_steps)
        progress = min(1.0, (step - config.warmup_steps) / span)
        return (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))) * batch_factor()
    return factor


class _StopRequested:
    """SIGINT/SIGTERM set a flag; the loop checkpoints after the current step and stops."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopRequested:
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:
            pass  # not the main thread: signals stay as they are
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def train(
    workload: Workload,
    plan: Plan,
    corpus: Sequence[Sample] | None,
    config: TrainConfig,
    resume: bool = False,
    on_step: Callable[[StepLog], None] | None = None,
    on_event: Callable[[str], None] | None = None,
    peak_bytes: Callable[[], int | None] | None = None,
    reset_peak: Callable[[], None] | None = None,
    step_peak_bytes: Callable[[], int | None] | None = None,
) -> TrainResult:
    """Train ``config.steps`` optimizer steps of ``plan.effective_batch`` samples each.

    Args:
        corpus: indexable samples (``None`` for a custom workload: its ``make_batch`` is used, seeded per step).
        resume: continue from ``config.run_dir``'s checkpoint.
        on_step / on_event: progress and notices (OOM fallbacks, checkpoints) for the caller to show.
        peak_bytes / step_peak_bytes: each step's peak, of the whole process and above the budget's baseline
            (the probe's definition), logged as ``peak_bytes`` and ``step_peak_bytes``.
    """
    _check_arguments(workload, plan, corpus, config)
    dist = Distributed()
    if plan.world_size != dist.world_size:
        plan = make_plan(plan.effective_batch, plan.micro_batch_cap, dist.world_size)
    model: nn.Module = workload.model
    shards = is_sharded(model)  # FSDP2: sharded by the caller (gaplan.parallel.fsdp.sharded), with its optimizer
    if dist.active and not shards:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(workload.model)
    scaler = grad_scaler(workload, shards)
    follower = (ScheduleFollower(config.schedule, config.lr_scaling or SCHEDULE_LR_SCALING, plan.micro_batch_cap,
                                 dist.world_size)
                if config.schedule is not None and config.schedule.kind != "fixed" else None)
    batch_factor = follower.lr_factor if follower is not None else (lambda: 1.0)
    run = RunState(workload, torch.optim.lr_scheduler.LambdaLR(workload.optimizer, _schedule(config, batch_factor)),
                   scaler, shards, dist, config.run_dir, data=config.data)
    if config.run_dir and dist.rank == 0:
        os.makedirs(config.run_dir, exist_ok=True)
    start_step = 0
    if resume:
        start_step, plan = run.restore(plan, config.seed, config.new_split)
    else:
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        if config.run_dir and dist.rank == 0:
            remove_log(config.run_dir)  # a new run in a used folder: its log starts empty, not after the old one's
    if start_step < config.steps:
        run.check_room()  # a disk with no room for one checkpoint would keep no step of the run
    if config.micro_batch_limit and plan.micro_batch > config.micro_batch_limit:
        plan = make_plan(plan.effective_batch, config.micro_batch_limit, plan.world_size)
    loop_state = run.loop_state or {}
    if follower is not None:
        if loop_state.get("schedule"):
            follower.load_state_dict(loop_state["schedule"])
            if run.replanned:  # the same effective batch and window, split as the new setting allows
                follower.micro_cap = plan.micro_batch_cap
        if config.micro_batch_limit:
            follower.micro_cap = min(follower.micro_cap, config.micro_batch_limit)
        plan = follower.plan()
    if resume:
        _rates_on_this_schedule(run.scheduler, start_step, on_event)
    token_steps = None
    if config.effective_tokens:
        if corpus is None:
            raise GaplanError("--effective-tokens needs data whose samples have lengths; a module:function workload "
                              "makes its own batches")
        token_steps = TokenSteps(corpus, config.effective_tokens, config.seed, min_samples=dist.world_size)
    noise = None
    if config.noise_scale and shards:
        if on_event:
            on_event("noise scale: not measured under FSDP (each rank holds a shard of every gradient)")
    elif config.noise_scale:
        drawing = _drawing(workload, corpus)
        noise = NoiseScaleMeter(workload.model, reduce=dist.sums if dist.active else None, drawing=drawing)
        if on_event and not resume:
            on_event(f"noise scale: {drawing.describe()}")
        if loop_state.get("noise"):  # the smoothed estimates go on where the checkpoint left them
            noise.load_state_dict(loop_state["noise"])
    inputs = StepInputs(workload, model, corpus, dist, scaler, config.max_grad_norm, config.seed, shards,
                        config.run_dir, noise)
    peaks = (peak_bytes, step_peak_bytes)
    try:
        result = _loop(inputs, run, plan, config, start_step, token_steps, on_step, on_event, peaks, reset_peak,
                       follower)
    except WriteFailed as exc:
        raise _kept_from(exc, run) from None
    finally:
        if noise is not None:
            noise.close()
    result.checkpoint_step = run.saved_step
    result.noise_drawing = noise.drawing.kind if noise is not None else None
    return result


def _drawing(workload: Workload, corpus: Sequence[Sample] | None) -> Drawing:
    """How the run's samples are drawn: gaplan's own order (a permutation of the corpus each epoch), or what a
    ``module:function`` workload declared (``CustomWorkload.draws``)."""
    if corpus is not None:
        return Drawing("epochs", len(corpus)) if len(corpus) > 1 else Drawing("independent")
    return Drawing.declared(workload.draws)


def _rates_on_this_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, step: int,
                            on_event: Callable[[str], None] | None) -> None:
    """A resumed run's rates from its own schedule at the step it goes on from, not the checkpoint's: a run extended
    by ``--steps`` goes on along the cosine over its new length (as the HF Trainer re-creates its scheduler for a new
    ``max_steps``); an unchanged run gets the same rates, computed the same way."""
    groups = scheduler.optimizer.param_groups
    before = [group["lr"] for group in groups]
    after = [base * factor(scheduler.last_epoch) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas,
                                                                         strict=True)]
    for group, rate in zip(groups, after, strict=True):
        group["lr"] = rate
    scheduler._last_lr = list(after)  # what get_last_lr() reports
    if on_event and any(abs(a - b) > 1e-12 * max(abs(b), 1e-30) for a, b in zip(after, before, strict=True)):
        on_event(f"learning rate at step {step + 1}: {after[0]:.4g} on this run's schedule (the checkpoint's "
                 f"schedule had {before[0]:.4g})")


def _kept_from(failure: WriteFailed, run: RunState) -> WriteFailed:
    """After a failed write: ``train_log.csv`` cut back to the checkpoint the folder keeps, and the one line that
    says what is kept and how to go on."""
    run_dir = run.run_dir or "."
    if run.dist.rank == 0:
        truncate_log(run_dir, run.saved_step or 0)
    if run.saved_step is None:
        kept = WriteFailed(f"{failure}; no checkpoint of this run was written, so none of its steps are kept "
                           "(train_log.csv is cut back to none): make room and train again", failure.code)
    else:
        kept = WriteFailed(f"{failure}; the checkpoint of step {run.saved_step} is kept and train_log.csv is cut back "
                           f"to it: make room, then gaplan train --resume {run_dir}", failure.code)
    return mark_rank_own(kept) if is_rank_own(failure) else kept


def _check(inputs: StepInputs, plan: Plan, start_step: int, token_budget: int | None,
           indices: list[int] | None) -> tuple[LossCheck, float | None]:
    """The first step's samples as one batch before it trains (:mod:`gaplan.training.loss_check`), or why not."""
    samples = len(indices) if indices is not None else plan.effective_batch
    reason = skip_reason(inputs.workload, plan, start_step, inputs.dist.world_size, inputs.shards, token_budget,
                         samples)
    if reason is not None:
        return LossCheck(step=start_step + 1, samples=samples, skipped=reason), None
    return check_first_step(inputs.workload, plan, inputs.corpus, inputs.seed, indices, token_budget)


def _noise_columns(noise: NoiseScaleMeter | None) -> dict[str, float | None]:
    """The step's noise-scale columns of ``train_log.csv`` (:class:`StepLog`), empty where it was not measured."""
    reading = noise.last if noise is not None else None
    if reading is None:
        return {}
    return {"noise_scale": reading.noise_scale, "grad_sq": reading.grad_sq, "grad_var": reading.grad_var,
            "noise_scale_items": reading.noise_scale_items, "step_grad_sq": reading.step_grad_sq,
            "step_grad_var": reading.step_grad_var, "items_per_sample": reading.items_per_sample}


def _follow(follower: ScheduleFollower, step: int, noise: NoiseScaleMeter | None, plan: Plan,
            on_event: Callable[[str], None] | None) -> Plan:
    """The schedule's decision after step ``step``: the plan of the next step, and one line when it changes. Every
    rank decides alike: the reading comes from statistics summed over the ranks."""
    change = follower.after_step(step, noise.last if noise is not None else None)
    if change is None:
        return plan
    new = follower.plan()
    if on_event:
        rate = f"; learning rate x{follower.lr_factor():.3g} of --lr" if follower.lr_scaling != "none" else ""
        on_event(f"step {change.step}: effective batch {change.before} -> {change.after} ({change.reason}): "
                 f"micro-batch {new.micro_batch} x {new.grad_accum_steps} accumulation steps x world size "
                 f"{new.world_size}{rate}")
    return new


def _above_baseline(peak: Callable[[], int | None] | None) -> int | None:
    """The step's peak above the baseline; None where it reads nothing: in a long-lived process (a notebook, a test
    run) freed memory that is still resident is reused without the resident size growing."""
    value = peak() if peak else None
    return value if value is not None and value > 0 else None


def _loop(inputs: StepInputs, run: RunState, plan: Plan, config: TrainConfig, start_step: int,
          token_steps: TokenSteps | None, on_step: Callable[[StepLog], None] | None,
          on_event: Callable[[str], None] | None,
          peaks: tuple[Callable[[], int | None] | None, Callable[[], int | None] | None],
          reset_peak: Callable[[], None] | None, follower: ScheduleFollower | None = None) -> TrainResult:
    """Steps ``start_step`` to ``config.steps``: train, log, checkpoint; stop cleanly on SIGINT/SIGTERM. With a
    ``follower``, each step's effective batch is its schedule's, decided after the step before."""
    dist, run_dir = inputs.dist, config.run_dir
    logs: list[StepLog] = []
    fallbacks: list[str] = []

    def fell_back(message: str) -> None:
        fallbacks.append(message)
        if on_event:
            on_event(message)

    started = time.perf_counter()
    interrupted = False
    token_budget = config.token_budget
    padded_total = real_total = 0
    check: LossCheck | None = None
    step_plan = plan  # the plan of the last step trained (a schedule may have planned the next one already)
    with _StopRequested() as stop:
        for step in range(start_step, config.steps):
            indices = token_steps.indices(step) if token_steps else None  # else the plan's E samples
            if step == start_step:  # before the peak is reset and the clock starts: the step's figures exclude it
                check, one_batch_loss = _check(inputs, plan, start_step, token_budget, indices)
            if reset_peak:
                reset_peak()
            t0 = time.perf_counter()
            step_samples = len(indices) if indices is not None else plan.effective_batch
            done_step = step_until_it_fits(inputs, step, plan, token_budget, indices, fell_back,
                                           follower.state.first_sample if follower is not None else
                                           token_steps.first(step) if token_steps else None)
            if follower is not None and done_step.plan is not plan:
                follower.fell_back_to(done_step.plan)
            plan, token_budget, micro_batches = done_step.plan, done_step.token_budget, done_step.micro_batches
            step_plan = plan
            padded_total, real_total = padded_total + done_step.padded, real_total + done_step.tokens
            lr = run.scheduler.get_last_lr()[0]
            if follower is not None:  # before the scheduler's step: the next step's rate follows its batch
                plan = _follow(follower, step, inputs.noise, plan, on_event)
            run.scheduler.step()
            seconds = time.perf_counter() - t0
            log = StepLog(step + 1, done_step.loss, lr, step_samples / seconds, done_step.tokens / seconds,
                          peaks[0]() if peaks[0] else None,
                          # By tokens: this step's largest micro-batch and its number of micro-steps.
                          max(map(batch_size, micro_batches)) if token_budget else step_plan.micro_batch,
                          len(micro_batches) if token_budget else step_plan.grad_accum_steps, seconds,
                          _above_baseline(peaks[1]), done_step.padded / seconds,
                          effective_batch=step_samples, **_noise_columns(inputs.noise))
            logs.append(log)
            log_failure = None
            if step == start_step and check is not None:
                if one_batch_loss is not None:
                    check.accumulated_loss, check.large_batch_loss = done_step.loss, one_batch_loss
                    check.micro_steps = len(micro_batches)
                if start_step == 0 and dist.rank == 0 and run_dir:  # a resumed run keeps its start's check
                    try:
                        save_loss_check(run_dir, check)
                    except WriteFailed as exc:
                        log_failure = exc
            # The step's inputs go before the next step makes its own: held across it, a workload's float inputs
            # (images) were two steps' worth under the budget where the probe's trial holds one step's, and a run
            # at the probed B* ran out of memory at step 2.
            del done_step, micro_batches
            if dist.rank == 0 and run_dir and log_failure is None:
                try:
                    append_log(run_dir, log)
                except WriteFailed as exc:
                    log_failure = exc
            if on_step:
                on_step(log)
            done = step + 1
            # One vote per step: a signal that reached some ranks stops all of them at this same boundary,
            # so every rank joins the checkpoint's collectives and none is left waiting in one; and a log that
            # could not be written stops all of them too, with the folder's last checkpoint as it was.
            signalled, log_failed = dist.sums([float(stop.requested), float(log_failure is not None)])
            if log_failed:
                raise log_failure or WriteFailed(f"rank 0 could not write to {run_dir} (its line says why)")
            stopping = signalled > 0
            if stopping or (config.checkpoint_every and done % config.checkpoint_every == 0) or \
                    done == config.steps:
                run.save(done, plan, {"schedule": follower.state_dict() if follower is not None else None,
                                      "noise": inputs.noise.state_dict() if inputs.noise is not None else None})
            if stopping:
                interrupted = True
                if on_event:
                    on_event(f"stopped after step {done}; checkpoint saved in {run_dir} (resume with --resume)")
                break
    return TrainResult(logs, step_plan, fallbacks, interrupted, time.perf_counter() - started, padded_total,
                       real_total, check)


def _check_arguments(workload: Any, plan: Any, corpus: Any, config: Any) -> None:
    """What a Python caller may pass wrong, said in one line (a WorkloadSpec is not yet a built workload)."""
    if not isinstance(workload, Workload):
        raise GaplanError(f"train takes a built workload (gaplan.workload.build.build_workload(spec, device)), got "
                          f"{type(workload).__name__}")
    if not isinstance(plan, Plan) or not isinstance(config, TrainConfig):
        raise GaplanError(f"train takes a gaplan Plan and a TrainConfig (got {type(plan).__name__}, "
                          f"{type(config).__name__})")
    if corpus is not None and len(corpus) == 0:
        raise GaplanError("train's corpus is empty: give samples (or None for a module:function workload)")
