"""The commands' work as library functions: probe -> bench -> breakdown -> report, and train -> compare.

The CLI parses options, calls one of these and prints what they return; Python users call them
the same way. Progress goes out through callbacks, never to a terminal.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gaplan.constants import DEFAULT_CPU_BUDGET, DEFAULT_EFFECTIVE_BATCH, DEFAULT_TRAIN_STEPS, SEARCH_CAP
from gaplan.lines import trial_line
from gaplan.plan import Plan, default_search_cap
from gaplan.probe_result import ProbeResult, save_probe
from gaplan.run_folder import PLAN_JSON, path_in
from gaplan.trial import Trial
from gaplan.workload_spec import WorkloadSpec

Say = Callable[[str], None]


def _quiet(text: str) -> None:
    pass


@dataclass
class ProbeRun:
    """What :func:`run_probe` did: the probe (its plan chosen), where it is saved, the report, the tuner's reason."""

    result: ProbeResult
    plan_path: str
    report_files: list[str] | None
    tuner_reason: str | None
    estimate_seed: int | None = None


def run_probe(
    spec: WorkloadSpec,
    out: str,
    *,
    device: str = "auto",
    memory_limit: int | None = None,
    effective_batch: int = DEFAULT_EFFECTIVE_BATCH,
    world_size: int = 1,
    margin: float = 0.0,
    search_cap: int | None = None,
    objective: str = "max-micro-batch",
    grad_checkpointing: str = "off",
    report: bool = False,
    repeats: int = 2,
    seed_from_estimate: bool = False,
    threads: int | None = None,
    command: str | None = None,
    on_trial: Callable[[Trial], None] | None = None,
    on_row: Callable[[Any], None] | None = None,
    say: Say = _quiet,
) -> ProbeRun:
    """Probe (tuned as asked), save ``plan.json`` in ``out``, and with ``report`` bench, break down and report."""
    from gaplan.tuner import tune

    start = 1
    if seed_from_estimate:
        start = estimate_start(spec, device, memory_limit, margin, search_cap, threads, say)
    tuned = tune(spec, objective=objective, grad_checkpointing=grad_checkpointing, device=device,
                 memory_limit=memory_limit, effective_batch=effective_batch, bench_large_batch=report, repeats=repeats,
                 on_trial=on_trial, on_row=on_row, on_stage=lambda text: say(text + " ..."), margin=margin,
                 world_size=world_size, search_cap=search_cap, threads=threads, start=start)
    result = dataclasses.replace(tuned.result, command=command)
    plan_path = path_in(out, PLAN_JSON)
    save_probe(result, plan_path)
    written = write_measurements(out, result, tuned.benches, on_row, say) if report else None
    return ProbeRun(result, plan_path, written, tuned.decision.reason if result.tuner else None,
                    start if seed_from_estimate else None)


def estimate_start(spec: WorkloadSpec, device: str, memory_limit: int | None, margin: float, search_cap: int | None,
                   threads: int | None, say: Say = _quiet) -> int:
    """The estimate's B* for this device and budget: where a seeded probe starts its search."""
    from gaplan.devices import resolve_device
    from gaplan.estimate import estimate

    device = resolve_device(device)
    kind = "cpu" if device == "cpu" else "cuda"
    limit = memory_limit or (DEFAULT_CPU_BUDGET if kind == "cpu" else None)
    if limit is None:
        import torch

        limit = torch.cuda.get_device_properties(torch.device(device)).total_memory
    limit = int(limit * (1 - margin))
    predicted = estimate(spec, memory_limit=limit, device_kind=kind, effective_batch=1, threads=threads,
                         search_cap=search_cap or SEARCH_CAP)
    say(f"estimate: B* = {predicted.max_micro_batch} ({predicted.trace_count} traces on fake tensors, "
        f"{predicted.trace_seconds:.1f} s); starting the search there")
    return predicted.max_micro_batch


def write_measurements(out: str, result: ProbeResult, benches: list, on_row: Callable[[Any], None] | None = None,
                       say: Say = _quiet) -> list[str]:
    """throughput.csv and breakdown.csv from measurements, then the report built from the folder's files."""
    from gaplan.benchmark import bench
    from gaplan.report import write_report
    from gaplan.schema import BREAKDOWN, THROUGHPUT, write_table
    from gaplan.worker_process import WorkerProcess

    rows = []
    if not benches:
        benches = [bench(result, on_row=on_row)]
    for index, measured in enumerate(benches):
        for row in measured.to_records():
            if index:  # the splits that only fit with gradient checkpointing
                row.update(split=row["split"] + " +ckpt", kind="split")
            rows.append(row)
    write_table(out, THROUGHPUT, rows)
    sizes = breakdown_sizes(result)
    say(f"memory breakdown by category at micro-batch {', '.join(map(str, sizes))} ...")
    peaks = {t.micro_batch: t.peak_bytes for t in result.trials if t.fits}
    with WorkerProcess(result.workload, result.device, result.probe_limit_bytes) as worker:
        breakdown = [dict(worker.breakdown(size), device_peak_bytes=peaks.get(size)) for size in sizes]
    write_table(out, BREAKDOWN, breakdown)
    return write_report(out).files


def breakdown_sizes(result: ProbeResult) -> list[int]:
    """Up to four measured sizes that fit, spread from the smallest to B*."""
    fitted = sorted({t.micro_batch for t in result.trials if t.fits})
    if len(fitted) <= 4:
        return fitted
    return sorted({fitted[round(i * (len(fitted) - 1) / 3)] for i in range(4)})


def run_bench(probed: ProbeResult, out: str, effective_batch: int, *, repeats: int = 3, warmup: int = 1,
              threads: int | None = None, large_batch: bool = True, command: str | None = None,
              on_row: Callable[[Any], None] | None = None) -> tuple[Any, list[str]]:
    """Time the splits, then write plan.json, throughput.csv and the report into ``out``; the rows and the files."""
    from gaplan.benchmark import bench
    from gaplan.report import write_report
    from gaplan.schema import THROUGHPUT, write_table

    measured = bench(probed, effective_batch, repeats=repeats, warmup=warmup, threads=threads, large_batch=large_batch,
                     on_row=on_row)
    os.makedirs(out, exist_ok=True)
    save_probe(dataclasses.replace(probed, command=command), path_in(out, PLAN_JSON))
    write_table(out, THROUGHPUT, measured.to_records())
    return measured, write_report(out).files


def plan_without_probe(spec: WorkloadSpec, device: str, memory_limit: int | None, plan: Plan, param_count: int,
                       task: str, seq_len: int | None, command: str | None = None) -> ProbeResult:
    """The plan.json of a run planned with ``--micro-batch``: what is known, and that no probe ran."""
    return ProbeResult(workload=spec, device=device, memory_limit_bytes=memory_limit, margin=0.0,
                       probe_limit_bytes=memory_limit, budget_is_default=False, max_micro_batch=plan.micro_batch_cap,
                       capped=False, trials=[], plan=plan, param_count=param_count, static_bytes=None, task=task,
                       seq_len=seq_len, wall_seconds=0.0, command=command, probed=False)


@dataclass
class TrainRun:
    """What :func:`run_train` did: the summary (what ``--json`` prints), and whether this is the process that reports."""

    summary: dict[str, Any]
    interrupted: bool
    is_main: bool
    plan: Plan | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TrainOptions:
    """How ``gaplan train`` runs, beyond the workload: the plan's source, the data, the loop, the outputs."""

    effective_batch: int | None = None  # default: the plan file's, else DEFAULT_EFFECTIVE_BATCH
    micro_batch: int | None = None  # skip the probe
    plan_file: str | None = None
    grad_checkpointing: str | None = None  # as given: None, "on", "off" or "auto" (auto needs a plan file)
    data: str | None = None
    steps: int = DEFAULT_TRAIN_STEPS
    seed: int = 0
    max_grad_norm: float | None = None
    warmup_steps: int = 0
    checkpoint_every: int = 0
    resume: bool = False
    save_weights: str | None = None
    compare: bool = False
    threads: int | None = None
    command: str | None = None


def run_train(spec: WorkloadSpec, run_dir: str, options: TrainOptions, *, device: str = "auto",
              memory_limit: int | None = None, say: Say = _quiet, on_step: Callable[[Any], None] | None = None,
              on_event: Say | None = None, on_row: Callable[[Any], None] | None = None) -> TrainRun:
    """Plan (from ``--plan``, ``--micro-batch``, the cache or a new probe), train, and with ``compare`` bench and report.

    Under torchrun every rank calls this; only rank 0 writes plan.json, the weights and the report
    (``TrainRun.is_main``), and all ranks plan with the smallest B* any of them found.
    """
    import torch

    from gaplan.data import SyntheticCorpus, TextCorpus
    from gaplan.devices import make_backend, resolve_device
    from gaplan.distributed import init_distributed
    from gaplan.errors import GaplanError
    from gaplan.plan import make_plan
    from gaplan.plan_cache import probe_for
    from gaplan.training import TrainConfig, train
    from gaplan.workload import build_workload
    from gaplan.workload_spec import model_source_kind

    device = resolve_device(device)
    dist = init_distributed(device)
    if options.threads:
        torch.set_num_threads(options.threads)
    is_main = dist.rank == 0
    say = say if is_main else _quiet
    probed = None
    effective = options.effective_batch or DEFAULT_EFFECTIVE_BATCH
    if options.plan_file or options.micro_batch is None:
        spec, probed = probe_for(spec, device, memory_limit, default_search_cap(effective, dist.world_size),
                                 plan_file=options.plan_file, grad_checkpointing=options.grad_checkpointing,
                                 threads=options.threads, write_cache=is_main, say=say,
                                 on_trial=lambda trial: say(trial_line(trial)))
        effective = options.effective_batch or (probed.plan.effective_batch if options.plan_file else effective)
    elif options.grad_checkpointing == "auto":
        raise GaplanError("--grad-checkpointing auto is decided by gaplan probe; give its --plan, or on/off")
    if options.micro_batch and probed is not None and options.micro_batch > probed.max_micro_batch:
        raise GaplanError(f"--micro-batch {options.micro_batch} does not fit: the probed maximum is "
                          f"{probed.max_micro_batch}")
    plan = make_plan(effective, options.micro_batch or dist.min(probed.plan_cap), dist.world_size)
    workload = build_workload(spec, device if device == "cpu" else f"cuda:{dist.rank}" if dist.active else device,
                              seed=options.seed)
    notes = []
    if model_source_kind(spec.model) == "function":
        corpus = None
    elif options.data:
        corpus = TextCorpus(options.data, workload.seq_len, workload.vocab_size,
                            spec.model if os.path.isdir(spec.model) else None)
        notes.append(f"data: {len(corpus)} samples from {options.data}, tokenizer {corpus.tokenizer}")
    else:
        corpus = SyntheticCorpus(workload.seq_len, workload.num_labels or 4, seed=options.seed)
    for note in notes:
        say(note)
    say(f"plan: {plan.describe()}")
    if is_main:
        record = probed if probed is not None else plan_without_probe(
            spec, device, memory_limit, plan, workload.param_count, workload.task, workload.seq_len)
        save_probe(dataclasses.replace(record, plan=plan, command=options.command), path_in(run_dir, PLAN_JSON))
    meter = make_backend(workload.device.type if device == "cpu" else str(workload.device))
    meter.activate(None, enforce=False)  # measure this process's peaks; the budget binds only the probe
    config = TrainConfig(steps=options.steps, seed=options.seed, max_grad_norm=options.max_grad_norm,
                         checkpoint_every=options.checkpoint_every, warmup_steps=options.warmup_steps, run_dir=run_dir)
    result = train(workload, plan, corpus, config, resume=options.resume, on_step=on_step,
                   on_event=on_event or say, peak_bytes=meter.peak_bytes, reset_peak=meter.reset_peak)
    if options.save_weights and is_main:
        from safetensors.torch import save_file

        state = {k: v.detach().contiguous().clone() for k, v in workload.model.state_dict().items()}
        save_file(state, options.save_weights)  # cloned per name: tied weights no longer share storage
    logs = result.logs
    summary = {
        "run_dir": run_dir, "steps": len(logs), "plan": result.plan.to_dict(),
        "loss_first": logs[0].loss if logs else None, "loss_last": logs[-1].loss if logs else None,
        "samples_per_s": (sum(log.samples_per_s for log in logs) / len(logs)) if logs else None,
        "tokens_per_s": (sum(log.tokens_per_s for log in logs) / len(logs)) if logs else None,
        "seconds": round(result.seconds, 2), "oom_fallbacks": result.oom_fallbacks, "interrupted": result.interrupted,
    }
    if options.compare and is_main and not result.interrupted:
        from gaplan.probe_result import load_probe

        say("timing the plan against other splits and a true large batch ...")
        measured, files = run_bench(load_probe(path_in(run_dir, PLAN_JSON)), run_dir, result.plan.effective_batch,
                                    threads=options.threads, command=options.command, on_row=on_row)
        summary["report"] = files
        summary["throughput"] = measured.to_records()
    return TrainRun(summary, result.interrupted, is_main, result.plan, notes)
