"""The accumulated training loop: token-exact loss, DDP ``no_sync``, checkpoints, resume, OOM fallback.

Step ``s`` always trains on the same samples (:func:`gaplan.data.step_indices`), and
checkpoints hold model, optimizer, scheduler, RNG states, the step and the plan, so
``resume`` reaches the same weights as an uninterrupted run (bitwise on CPU).
"""

from __future__ import annotations

import csv
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

from gaplan.core.atomic_write import atomic_write
from gaplan.core.constants import DEFAULT_TRAIN_STEPS
from gaplan.core.errors import GaplanError, one_line
from gaplan.data import Sample
from gaplan.devices.backend import is_out_of_memory, release_after_oom
from gaplan.parallel.fsdp import is_sharded, no_sync_for
from gaplan.parallel.process_group import Distributed
from gaplan.parallel.state import load_sharded_state, remove_stale_sharded_states, save_sharded_state
from gaplan.plan.split import Plan, make_plan
from gaplan.runs.folder import CHECKPOINT, TRAIN_LOG_CSV
from gaplan.runs.schema import TRAIN_LOG
from gaplan.training.micro_batches import PLACEHOLDER, TokenSteps, longest_sample, sample_micro_batches, token_micro_batches
from gaplan.training.oom import OomAgreement, PeerOutOfMemory, halved_sizes, sharded_out_of_memory
from gaplan.training.step import accumulate_gradients
from gaplan.workload.build import Workload
from gaplan.workload.loss import batch_size, count_step_targets

LOG_FIELDS = ["step", "loss", "lr", "samples_per_s", "tokens_per_s", "peak_bytes", "micro_batch",
              "grad_accum_steps", "seconds"]
assert set(LOG_FIELDS) == set(TRAIN_LOG.columns), "train_log.csv's writer and its schema must agree"


@dataclass
class TrainConfig:
    """How long and how to train. ``checkpoint_every=0`` saves only at the end and on SIGINT/SIGTERM."""

    steps: int = DEFAULT_TRAIN_STEPS
    seed: int = 0
    max_grad_norm: float | None = None
    checkpoint_every: int = 0
    warmup_steps: int = 0
    run_dir: str | None = None
    token_budget: int | None = None  # batch by tokens: micro-batches of at most this many padded tokens
    effective_tokens: int | None = None  # with a token budget: steps of this many real tokens, not E samples
    micro_batch_limit: int | None = None  # no micro-batch above this (the size ranks agreed on after an OOM restart)


@dataclass
class StepLog:
    step: int
    loss: float
    lr: float
    samples_per_s: float
    tokens_per_s: float
    peak_bytes: int | None
    micro_batch: int
    grad_accum_steps: int
    seconds: float


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

    @property
    def padding_fraction(self) -> float | None:
        """The share of the fed positions that were padding (None for data without an attention mask)."""
        return 1 - self.real_tokens / self.padded_tokens if self.padded_tokens else None


def _schedule(config: TrainConfig) -> Callable[[int], float]:
    """Linear warm-up then cosine decay to 10% (a common default)."""
    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        span = max(1, config.steps - config.warmup_steps)
        progress = min(1.0, (step - config.warmup_steps) / span)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def _rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])


def save_checkpoint(path: str, state: dict[str, Any]) -> None:
    """Write atomically and flushed to disk: a cut-off write never replaces a good checkpoint."""
    atomic_write(path, lambda temp: torch.save(state, temp), fsync=True)


def load_checkpoint(run_dir: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The run folder's checkpoint, its tensors on ``map_location`` (this rank's device, not the saver's)."""
    path = os.path.join(run_dir, CHECKPOINT)
    if not os.path.isfile(path):
        raise GaplanError(f"--resume {run_dir}: no {CHECKPOINT} in it")
    try:
        return torch.load(path, weights_only=False, map_location=map_location)
    except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint is the user's to know about
        raise GaplanError(f"--resume {run_dir}: the checkpoint cannot be read "
                          f"({exc.__class__.__name__}: {one_line(exc)})") from None


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
) -> TrainResult:
    """Train ``config.steps`` optimizer steps of ``plan.effective_batch`` samples each.

    Args:
        corpus: indexable samples (``None`` for a custom workload: its ``make_batch`` is used, seeded per step).
        resume: continue from ``config.run_dir``'s checkpoint.
        on_step / on_event: progress and notices (OOM fallbacks, checkpoints) for the caller to show.
    """
    dist = Distributed()
    if plan.world_size != dist.world_size:
        plan = make_plan(plan.effective_batch, plan.micro_batch_cap, dist.world_size)
    model: nn.Module = workload.model
    shards = is_sharded(model)  # FSDP2: sharded by the caller (gaplan.parallel.fsdp.sharded), with its optimizer
    if dist.active and not shards:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(workload.model)
    optimizer = workload.optimizer
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config))
    scaler = _grad_scaler(workload, shards)
    start_step, logs, fallbacks = 0, [], []
    run_dir = config.run_dir
    if run_dir and dist.rank == 0:
        os.makedirs(run_dir, exist_ok=True)
    if resume:
        state = load_checkpoint(run_dir or ".", map_location=workload.device)
        if state.get("sharded_state"):
            load_sharded_state(run_dir or ".", state["sharded_state"], workload.model, optimizer)
        else:
            workload.model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        _set_rng_state(state["rng"][dist.rank] if isinstance(state["rng"], list) else state["rng"])
        start_step = int(state["step"])
        plan = Plan.from_dict(state["plan"]) if state["plan"]["world_size"] == dist.world_size else plan
        _truncate_log(run_dir, start_step)
    else:
        torch.manual_seed(config.seed)
        random.seed(config.seed)
    if config.micro_batch_limit and plan.micro_batch > config.micro_batch_limit:
        plan = make_plan(plan.effective_batch, config.micro_batch_limit, plan.world_size)

    def checkpoint(step: int) -> None:
        if not run_dir:
            return
        rng = _gather_rng(dist)
        # Sharded: each rank writes its shards (torch's distributed checkpoint); checkpoint.pt names their folder.
        shard_folder = save_sharded_state(run_dir, step, workload.model, optimizer, dist) if shards else None
        if dist.rank == 0:
            weights = ({"sharded_state": shard_folder} if shards else
                       {"model": workload.model.state_dict(), "optimizer": optimizer.state_dict()})
            save_checkpoint(os.path.join(run_dir, CHECKPOINT), {
                **weights, "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict() if scaler else None,
                "rng": rng, "step": step, "plan": plan.to_dict(), "workload": workload.spec.to_dict(),
            })
            if shards:
                remove_stale_sharded_states(run_dir, keep=shard_folder)

    started = time.perf_counter()
    interrupted = False
    token_budget = config.token_budget
    token_steps = None
    if config.effective_tokens:
        if corpus is None:
            raise GaplanError("--effective-tokens needs data whose samples have lengths; a module:function workload "
                              "makes its own batches")
        token_steps = TokenSteps(corpus, config.effective_tokens, config.seed, min_samples=dist.world_size)
    padded_total = real_total = 0
    with _StopRequested() as stop:
        for step in range(start_step, config.steps):
            if reset_peak:
                reset_peak()
            t0 = time.perf_counter()
            indices = token_steps.indices(step) if token_steps else None  # else the plan's E samples
            step_samples = len(indices) if indices is not None else plan.effective_batch
            while True:
                micro_batches = (token_micro_batches(workload, plan, corpus, step, dist, config.seed, token_budget,
                                                     indices)
                                 if token_budget else
                                 sample_micro_batches(workload, plan, corpus, step, dist.rank, config.seed))
                agreement = OomAgreement(dist)
                try:
                    loss, tokens = _optimizer_step(workload, model, micro_batches, dist, scaler, config, agreement)
                    padded = int(dist.sum(sum(int(mb["attention_mask"].numel()) for mb in micro_batches
                                              if "attention_mask" in mb and PLACEHOLDER not in mb)))
                    break
                except Exception as exc:  # noqa: BLE001 - classified right below
                    smallest = token_budget <= longest_sample(micro_batches) if token_budget else plan.micro_batch == 1
                    if not (is_out_of_memory(exc) or isinstance(exc, PeerOutOfMemory)) or smallest:
                        raise
                    if shards:
                        raise sharded_out_of_memory(exc, step, plan, token_budget, micro_batches, dist,
                                                     run_dir) from None
                    agreement.report_own_failure()
                    where = "another rank" if isinstance(exc, PeerOutOfMemory) else getattr(exc, "gaplan_phase", "")
                optimizer.zero_grad(set_to_none=True)  # after the except block: the traceback is gone
                release_after_oom(workload.device)
                halved = halved_sizes(plan, token_budget, micro_batches)
                message = (f"step {step + 1}: out of memory at {halved.was}{f' (in {where})' if where else ''}; "
                           f"redoing the step with {halved.now}")
                plan, token_budget = halved.plan, halved.token_budget
                fallbacks.append(message)
                if on_event:
                    on_event(message)
            padded_total, real_total = padded_total + padded, real_total + tokens
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            seconds = time.perf_counter() - t0
            log = StepLog(step + 1, loss, lr, step_samples / seconds, tokens / seconds,
                          peak_bytes() if peak_bytes else None,
                          # By tokens: this step's largest micro-batch and its number of micro-steps.
                          max(map(batch_size, micro_batches)) if token_budget else plan.micro_batch,
                          len(micro_batches) if token_budget else plan.grad_accum_steps, seconds)
            logs.append(log)
            if dist.rank == 0 and run_dir:
                _append_log(run_dir, log)
            if on_step:
                on_step(log)
            done = step + 1
            # One vote per step: a signal that reached some ranks stops all of them at this same boundary,
            # so every rank joins the checkpoint's collectives and none is left waiting in one.
            stopping = dist.any(stop.requested)
            if stopping or (config.checkpoint_every and done % config.checkpoint_every == 0) or \
                    done == config.steps:
                checkpoint(done)
            if stopping:
                interrupted = True
                if on_event:
                    on_event(f"stopped after step {done}; checkpoint saved in {run_dir} (resume with --resume)")
                break
    return TrainResult(logs, plan, fallbacks, interrupted, time.perf_counter() - started, padded_total, real_total)


def _gather_rng(dist: Distributed) -> Any:
    state = _rng_state()
    if not dist.active:
        return state
    gathered: list[Any] = [None] * dist.world_size
    dist.dist.all_gather_object(gathered, state)
    return gathered


class OptimizerStepDoesNotFit(GaplanError):
    """The optimizer step ran out of memory: not cured by a smaller micro-batch, so not retried."""


def _optimizer_step(workload: Workload, model: nn.Module, micro_batches: list[dict], dist: Distributed,
                    scaler: torch.amp.GradScaler | None, config: TrainConfig,
                    agreement: OomAgreement | None = None) -> tuple[float, int]:
    """Accumulate, then step. Returns the large-batch loss and the tokens seen (all ranks)."""
    num_items = int(dist.sum(count_step_targets(micro_batches, workload.task)))
    # DDP averages gradients over ranks; a token-normalized loss must be summed, so undo the average.
    # FSDP here sums already (gaplan.parallel.fsdp sets it on every unit).
    averaged = dist.active and not is_sharded(model) and workload.loss_is_scaled_for_ga is not False
    result = accumulate_gradients(
        model, micro_batches, workload.raw_loss, workload.task, workload.loss_is_scaled_for_ga, workload.autocast,
        num_items_in_batch=num_items, loss_multiplier=dist.world_size if averaged else 1,
        no_sync=no_sync_for(model, workload.spec.grad_sync),
        scale=scaler.scale if scaler is not None else None,
        before_last=agreement.before_last if agreement is not None and dist.active else None,
        before_last_backward=agreement.before_last_backward if agreement is not None and dist.active else None)
    if scaler is not None:
        scaler.unscale_(workload.optimizer)  # before clipping: clip the true gradient
    if config.max_grad_norm:
        torch.nn.utils.clip_grad_norm_(workload.model.parameters(), config.max_grad_norm)
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


def _grad_scaler(workload: Workload, shards: bool) -> torch.amp.GradScaler | None:
    """fp16's loss scaler; for a sharded model the one that agrees over ranks on skipping a step (each rank
    sees only its shards' infinities)."""
    if workload.spec.dtype != "fp16":
        return None
    if shards:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(workload.device.type)
    return torch.amp.GradScaler(workload.device.type)


def _append_log(run_dir: str, log: StepLog) -> None:
    path = os.path.join(run_dir, TRAIN_LOG_CSV)
    new = not os.path.exists(path)
    with open(path, "a", newline="") as handle:
        writer = csv.DictWriter(handle, LOG_FIELDS)
        if new:
            writer.writeheader()
        writer.writerow({k: getattr(log, k) for k in LOG_FIELDS})


def _truncate_log(run_dir: str | None, step: int) -> None:
    """Drop log rows past the checkpoint (steps that will be redone after a resume)."""
    path = os.path.join(run_dir or ".", TRAIN_LOG_CSV)
    if not os.path.exists(path):
        return
    with open(path, newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if int(row["step"]) <= step]

    def write(temp: str) -> None:
        with open(temp, "w", newline="") as handle:
            writer = csv.DictWriter(handle, LOG_FIELDS)
            writer.writeheader()
            writer.writerows(rows)

    atomic_write(path, write)  # a crash mid-rewrite must not lose the steps before the checkpoint


