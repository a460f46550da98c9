"""``gaplan train`` as a library function: where the plan comes from, the data, the loop, and what is written.

The CLI parses options and calls :func:`run_train`; under torchrun every rank calls it. A run folder
holds ``train.json`` (the workload and options the run was started with), so ``--resume DIR`` alone
continues the run as it was started (:func:`resume_settings`). The plan's per-node probe is
:mod:`gaplan.workflows.train_plan`; the data, :mod:`gaplan.workflows.train_data`; the options,
:mod:`gaplan.workflows.train_options`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gaplan.core.constants import DEFAULT_CPU_BUDGET
from gaplan.core.errors import GaplanError
from gaplan.core.progress import Say, quiet
from gaplan.devices.backend import out_of_memory_as
from gaplan.plan.split import Plan, make_plan
from gaplan.runs.folder import PLAN_JSON, path_in
from gaplan.runs.probe_result import plan_without_probe, save_probe
from gaplan.runs.schema import save_run_config
from gaplan.workflows.bench import run_bench
from gaplan.workflows.train_data import corpus_to_train, read_training_data
from gaplan.workflows.train_options import TrainOptions
from gaplan.workflows.train_outputs import save_outputs
from gaplan.workflows.train_plan import batch_schedule_for, plan_for_ranks, probe_token_budget_for_ranks
from gaplan.workflows.train_resume import (
    after_an_oom_restart,
    extended,
    from_the_start_without_a_checkpoint,
    new_split,
    resume_settings,
    save_settings,
    saved_position,
    say_split,
)
from gaplan.workload.spec import WorkloadSpec

__all__ = ["TrainOptions", "TrainRun", "resume_settings", "run_train"]


@dataclass
class TrainRun:
    """What :func:`run_train` did: the summary (what ``--json`` prints), and whether this is the process that reports."""

    summary: dict[str, Any]
    interrupted: bool
    is_main: bool
    plan: Plan | None = None
    notes: list[str] = field(default_factory=list)


def run_train(spec: WorkloadSpec, run_dir: str, options: TrainOptions, *, device: str = "auto",
              memory_limit: int | None = None, say: Say = quiet, on_step: Callable[[Any], None] | None = None,
              on_event: Say | None = None, on_row: Callable[[Any], None] | None = None,
              on_bench_trial: Callable[[int, str, float | None], None] | None = None,
              on_bench_start: Callable[[Any], None] | None = None, overwrite: bool = False,
              config_toml: str | None = None) -> TrainRun:
    """Plan (from ``--plan``, ``--micro-batch``, the cache or a new probe), train, and with ``compare`` bench and report.

    Under torchrun every rank calls this; the first process of each node probes for its node,
    all ranks plan with the smallest B* of any node, and only rank 0 writes the run folder's files
    (``TrainRun.is_main``). Rank 0 holds the run folder as its only writer throughout
    (:func:`gaplan.runs.claim.claim_run_folder`): a folder that holds another run is refused before any work, unless
    this continues it (``options.resume``) or ``overwrite`` replaces it. ``config_toml``: the options as ``--config``
    reads them, saved as the new run's ``config.toml`` (a resumed run keeps the one it was started with).
    """
    from gaplan.runs.claim import check_run_folder, claim_run_folder

    check_before_work(spec, run_dir, options)
    resume = options.resume or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0  # a restart goes on
    inputs = [options.plan_file] if options.plan_file else []
    if int(os.environ.get("RANK", "0")) == 0:
        claim = claim_run_folder(run_dir, "train", overwrite=overwrite, resume=resume, inputs=inputs,
                                 what="--resume" if options.resume else "--out")
    else:  # rank 0 holds the folder; the others only check it, as it does
        if not resume:
            check_run_folder(run_dir, "train", overwrite=overwrite)
        claim = contextlib.nullcontext()
    with claim:
        return _train(spec, run_dir, options, device, memory_limit, say, on_step, on_event, on_row, on_bench_trial,
                      on_bench_start, config_toml)


def _train(spec: WorkloadSpec, run_dir: str, options: TrainOptions, device: str, memory_limit: int | None, say: Say,
           on_step: Callable[[Any], None] | None, on_event: Say | None, on_row: Callable[[Any], None] | None,
           on_bench_trial: Callable[[int, str, float | None], None] | None,
           on_bench_start: Callable[[Any], None] | None, config_toml: str | None) -> TrainRun:
    import torch

    from gaplan.devices.backend import resolve_device
    from gaplan.parallel.process_group import init_distributed
    from gaplan.training.config import TrainConfig
    from gaplan.training.loop import train

    options = from_the_start_without_a_checkpoint(run_dir, options, say if os.environ.get("RANK", "0") == "0" else quiet)
    saved = saved_position(run_dir, spec, options) if options.resume else None  # the checkpoint's step and plan
    exports = options.save_weights or options.save_model or options.compare  # a finished run still writes these
    if saved is not None and saved[0] == options.steps and not exports:  # nothing to train, nothing written again
        return TrainRun({"steps": 0, "steps_done": saved[0], "run_dir": run_dir}, False,
                        int(os.environ.get("RANK", "0")) == 0)
    device = resolve_device(device)
    formed_here = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    dist = init_distributed(device)
    if options.threads:
        torch.set_num_threads(options.threads)
    if spec.parallel == "fsdp" and options.batch_schedule.kind != "fixed":
        raise GaplanError("--batch-schedule with --parallel fsdp is not supported: the noise scale is not measured "
                          "under FSDP, and a changing batch is tested with one process and DDP only")
    if spec.parallel == "fsdp" and not dist.active:
        raise GaplanError("--parallel fsdp shards the model over ranks: launch it with torchrun --nproc-per-node N "
                          "-m gaplan train ... (N at least 2)" + (", or resume it in one process with --parallel ddp"
                                                                  if options.resume else ""))
    is_main = dist.rank == 0
    main_say = say if is_main else quiet
    options, restart = after_an_oom_restart(spec, run_dir, options, dist, main_say)
    if dist.active and device == "cpu" and memory_limit is not None:
        main_say(f"each of the {dist.world_size} ranks has its own {memory_limit / 2**30:.2f} GiB budget "
                 f"({dist.local_world_size} on this machine)")
    corpus = read_training_data(spec, options.source, main_say)  # before the probe: bad data costs no probe
    if options.batch_by == "tokens" and options.token_budget is None:
        options = dataclasses.replace(options, token_budget=probe_token_budget_for_ranks(
            spec, corpus, options, device, memory_limit, dist, say, main_say))
    spec, probed, plan = plan_for_ranks(spec, options, device, memory_limit, dist, say)
    if restart is not None and restart.micro_batch and plan.micro_batch > restart.micro_batch:
        plan = make_plan(plan.effective_batch, restart.micro_batch, plan.world_size)
    schedule = batch_schedule_for(spec, options, plan, main_say)
    changed = new_split(run_dir, spec, options, device, memory_limit) if options.resume else []
    if saved is not None:
        say_split(saved[1], plan, changed, dist.world_size, main_say)
    meter = _memory_meter(spec, options, device, memory_limit, main_say)
    with out_of_memory_as(f"out of memory while building {spec.model}: it does not fit here (give more memory)"):
        workload = _build(spec, options, device, dist, main_say)
    if options.resume:  # the checkpoint's tensors against this model, before any file of the run is written
        from gaplan.training.checkpoint import check_checkpoint_fits

        check_checkpoint_fits(run_dir, workload)
    corpus = corpus_to_train(corpus, spec, options.seed, options.token_budget, workload)
    if not options.token_budget:  # by tokens, the micro-batches are packed anew each step (said below)
        main_say(f"plan{' at the top of the schedule' if schedule is not None else ''}: {plan.describe()}")
    if is_main:
        os.makedirs(run_dir, exist_ok=True)
        if not options.resume or changed or extended(run_dir, options):  # what the next resume compares with
            save_settings(run_dir, spec, options, device, memory_limit)
        save_run_config(run_dir, None if options.resume else config_toml)  # a resumed run keeps its first
        record = probed if probed is not None else plan_without_probe(
            spec, device, memory_limit, plan, workload.param_count, workload.task, workload.seq_len,
            token_budget=options.token_budget)
        save_probe(dataclasses.replace(record, plan=plan, command=options.command), path_in(run_dir, PLAN_JSON))
    config = TrainConfig(**dataclasses.asdict(options.loop), run_dir=run_dir, token_budget=options.token_budget,
                         effective_tokens=options.effective_tokens,
                         micro_batch_limit=restart.micro_batch if restart is not None else None,
                         new_split=bool(changed), data=dataclasses.asdict(options.source),
                         schedule=schedule, lr_scaling=options.lr_scaling if schedule is not None else "none")
    if options.token_budget:
        step = (f"samples until their real tokens reach {options.effective_tokens}" if options.effective_tokens
                else f"{plan.effective_batch} samples")
        main_say(f"batching by tokens: each step's {step} packed into micro-batches of at most "
                 f"{options.token_budget} padded tokens per rank")
    result = train(workload, plan, corpus, config, resume=options.resume, on_step=on_step,
                   on_event=on_event or main_say, peak_bytes=meter.process_peak_bytes, reset_peak=meter.reset_peak,
                   step_peak_bytes=meter.peak_bytes)
    if restart is not None:
        result.oom_fallbacks[:0] = restart.messages  # the failures before torchrun's restart, then this run's
    summary = save_outputs(run_dir, options, workload, corpus, result, dist, formed_here, main_say)
    if saved is not None and not result.logs:  # a finished run asked for its exports: nothing trained, said so
        summary["steps_done"] = saved[0]
    if options.compare and is_main and not result.interrupted:
        from gaplan.runs.probe_result import load_probe

        main_say("timing the plan against other splits and a true large batch ...")
        measured, files = run_bench(load_probe(path_in(run_dir, PLAN_JSON)), run_dir, result.plan.effective_batch,
                                    threads=options.threads, command=options.command, on_row=on_row,
                                    on_trial=on_bench_trial, on_start=on_bench_start)
        summary["report"] = files
        summary["throughput"] = measured.to_records()
        summary["verdict"] = measured.verdict
    if dist.active:
        # The model's references to its process group (FSDP's param groups, DDP's reducer) sit in reference cycles:
        # collected now, while the interpreter is whole, not at its teardown, where freeing a gloo group could abort
        # a rank that had finished ("terminate called without an active exception").
        del workload
        gc.collect()
    return TrainRun(summary, result.interrupted, is_main, result.plan)


def check_before_work(spec: WorkloadSpec, run_dir: str, options: TrainOptions) -> None:
    """What would fail only at the end, checked before any probe or step: the run folder and the output paths can be
    written (a file path is not a folder), and ``merge`` applies."""
    from gaplan.core.outputs import check_weights_file, check_writable
    from gaplan.runs.claim import check_not_a_run_file
    from gaplan.workflows.parse_options import check_tokens_apply
    from gaplan.workload.model_io import check_save_path

    check_writable(run_dir)
    if options.batch_by == "tokens":
        check_tokens_apply(spec)
    if options.save_weights:
        check_weights_file(options.save_weights)
        check_not_a_run_file(options.save_weights, run_dir, "--save-weights")
    if options.merge and not spec.lora:
        raise GaplanError("--merge merges LoRA adapters into the base: add --lora (a full fine-tune saves the full "
                          "model already)")
    if options.merge and spec.parallel == "fsdp":
        raise GaplanError("--merge with --parallel fsdp is not supported: save the adapter (leave --merge out) and "
                          "merge it after with peft's merge_and_unload")
    if options.save_model:
        check_not_a_run_file(options.save_model, run_dir, "--save-model")
        check_save_path(options.save_model)


def _memory_meter(spec: WorkloadSpec, options: TrainOptions, device: str, memory_limit: int | None, say: Say):
    """The device's peak meter, and on the CPU with ``enforce_memory_limit`` the budget, set before the model is
    built so it counts weights, gradients and optimizer states, as in a probe's trial. Without it nothing is bound.
    Either way the model's code is loaded before the baseline, as the probe's worker does, so the log's
    ``step_peak_bytes`` is the probe's peak (above the baseline); ``peak_bytes`` is the whole process's."""
    from gaplan.devices.backend import make_backend
    from gaplan.parallel.process_group import local_device

    meter = make_backend("cpu" if device == "cpu" else local_device(device))
    if options.enforce_memory_limit and device != "cpu":
        raise GaplanError("--enforce-memory-limit binds a CPU run (on CUDA the card is the limit)")
    from gaplan.workload.build import load_model_code

    load_model_code(spec)  # the libraries' one-time memory before the baseline, as the probe's worker does
    meter.activate(memory_limit or DEFAULT_CPU_BUDGET if options.enforce_memory_limit else None,
                   enforce=options.enforce_memory_limit)
    if options.enforce_memory_limit:
        say(f"training under an enforced budget of {meter.limit_bytes / 2**20:.0f} MiB (as the probe's trials)")
    return meter


def _build(spec: WorkloadSpec, options: TrainOptions, device: str, dist: Any, say: Say):
    """The workload on this rank's device; under FSDP built on meta, sharded, and filled by rank 0. A resumed run's
    weights come from its checkpoint: no need to read the folder's (but a QLoRA run's frozen 4-bit base)."""
    from gaplan.parallel.build import build_sharded_workload
    from gaplan.parallel.process_group import local_device
    from gaplan.workload.build import build_workload

    if spec.parallel == "fsdp":
        build = build_sharded_workload(spec, local_device(device), seed=options.seed, load_weights=not options.resume,
                                       cpu_offload=spec.cpu_offload)
        workload = build.workload
    else:
        # A QLoRA checkpoint holds the adapters alone: its 4-bit base is read from its source again.
        workload = build_workload(spec, local_device(device), seed=options.seed,
                                  load_weights=not options.resume or bool(spec.quantize))
    if not options.resume:
        weights = workload.info.get("weights")
        say(f"weights: {workload.info['weights_path']} (pretrained)" if weights == "pretrained"
            else "weights: random init" if weights == "random" else "weights: built by the model's function")
    if spec.parallel == "fsdp":
        say(f"FSDP2: {build.block_count} blocks and the root sharded over {dist.world_size} ranks"
            + (", parameters and optimizer states offloaded to the CPU" if spec.cpu_offload else "")
            + f", gradients reduced on {'every micro-step' if spec.grad_sync == 'every' else 'the last micro-step'}")
    return workload
