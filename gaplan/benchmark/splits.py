"""Throughput of the plan against other splits and against a true large batch, measured through the noise.

Gradient accumulation makes a large batch fit; it does not make it fast. For the effective batch E this times
whole optimizer steps of the plan, of its neighbouring splits (every split from B* down by powers of two with
``all_splits``) and of the true large batch (micro-batch E, no accumulation), in interleaved rounds
(:mod:`gaplan.benchmark.rounds`): every round runs each split once, in a fresh trial process, its warm-up steps
untimed. Rounds go on until the plan's ratio to the large batch is known to ``ci_target`` or the time budget is
spent, and every rate and ratio carries a 95% interval (:mod:`gaplan.benchmark.stats`).

Splits are timed the way a user trains: without the budget and with the allocators as they are (no mmap
threshold pin, MKL's pool on: :func:`gaplan.devices.cpu.native_environment`). Whether a split fits is the
probe's answer (its micro-batches are at most B*). On CPU a large batch over the budget is run for reference
when this machine has the memory, and labelled so; on CUDA it is not run: the memory line says what it would
need, and the largest batch that fits is the reference.

A sharded workload (``--parallel fsdp``) is timed as it trains: every run is a trial of all W ranks
(:mod:`gaplan.worker.ranks`), each rank takes E/W samples per step split into its micro-batches, the
step time is the slowest rank's, and samples/s count the whole step (E samples over all ranks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gaplan.benchmark.measurement import BenchResult, BenchSettings, Job, Outlook, SplitMeasurement, split_label
from gaplan.benchmark.rounds import measurement_rows, time_in_rounds
from gaplan.core.constants import LARGE_BATCH_KIND as LARGE_BATCH
from gaplan.core.constants import LARGEST_FIT_KIND as LARGEST_FIT
from gaplan.core.constants import PLAN_KIND as PLAN
from gaplan.core.constants import SPLIT_KIND as SPLIT
from gaplan.core.units import format_bytes
from gaplan.devices.cpu import available_bytes as cpu_available_bytes
from gaplan.plan.search import fit_memory_line
from gaplan.plan.split import make_plan
from gaplan.runs.probe_result import ProbeResult


def candidate_splits(effective_batch: int, max_micro_batch: int, world_size: int = 1) -> list[tuple[str, tuple[int, ...]]]:
    """The plan, then B*, B*/2, B*/4, ... 1 (each as an even split of E), without repeats: (kind, sizes).

    Over ``world_size`` ranks the sizes are one rank's (of its E/W samples per step).
    """
    splits = [(PLAN, make_plan(effective_batch, max_micro_batch, world_size).micro_batch_sizes)]
    micro = max_micro_batch
    while micro >= 1:
        sizes = make_plan(effective_batch, micro, world_size).micro_batch_sizes
        if all(sizes != s for _, s in splits):
            splits.append((SPLIT, sizes))
        micro //= 2
    return splits


def neighbouring_splits(splits: list[tuple[str, tuple[int, ...]]], most: int = 2) -> list[tuple[str, tuple[int, ...]]]:
    """The plan and the ``most`` other splits closest to it in accumulation steps (the default comparison)."""
    plan = next(s for s in splits if s[0] == PLAN)
    others = sorted((s for s in splits if s[0] != PLAN), key=lambda s: abs(len(s[1]) - len(plan[1])))
    return [plan, *others[:most]]


def bench_jobs(probed: ProbeResult, effective: int, settings: BenchSettings, world: int,
               splits: list[tuple[str, tuple[int, ...]]] | None,
               available_bytes: Callable[[], int | None]) -> tuple[list[Job], list[SplitMeasurement]]:
    """What to time, and the rows known without timing (a large batch that is not run, and why)."""
    edge = probed.max_micro_batch
    share = effective // world
    if splits is None:
        splits = candidate_splits(effective, edge, world)
        splits = splits if settings.all_splits else neighbouring_splits(splits)
    fits = probed.probed  # without a probe nothing says where the edge is
    jobs = [Job(kind, sizes, fits) for kind, sizes in splits]
    if not settings.large_batch:
        return jobs, []
    if any(len(job.sizes) == 1 and job.sizes[0] == share for job in jobs):
        return jobs, []  # the plan is the large batch already (see BenchResult's rows: its row is copied)
    if share <= edge:
        return [*jobs, Job(LARGE_BATCH, (share,), fits)], []
    need = probed_peak(probed, share)
    budget = format_bytes(probed.probe_limit_bytes) if probed.probe_limit_bytes else None
    free = available_bytes() if probed.device == "cpu" else None
    if probed.device == "cpu" and (need is None or free is None or need * world < 0.8 * free):
        # Not "needs <peak>": the peak is resident memory, which reads below the budget's address-space count.
        # What is known is that E > B*, and B*+1 ran out of memory.
        note = (f"over the {budget} budget (B* = {edge}); timed for reference" if budget and probed.probed
                else "timed for reference (no probe ran: whether it fits is unknown)")
        return [*jobs, Job(LARGE_BATCH, (share,), False, note)], []
    where = ("this machine's free memory" if probed.device == "cpu"
             else f"the {budget} budget" if budget else "the device's memory")
    per_rank = " per rank" if world > 1 else ""
    not_run = SplitMeasurement(split_label((share,), world), LARGE_BATCH, share, 1, effective, 0, None, None, None,
                               None, None, None, False, False,
                               note=f"needs ~{format_bytes(need)}{per_rank} (from the memory line), more than {where}; "
                                    "not run")
    largest = Job(LARGEST_FIT, (edge,), fits, f"the largest batch that fits ({edge}), as the reference")
    return [*jobs, largest], [not_run]


def bench(
    probed: ProbeResult,
    effective_batch: int | None = None,
    settings: BenchSettings | None = None,
    *,
    threads: int | None = None,
    on_row: Callable[[SplitMeasurement], None] | None = None,
    on_trial: Callable[[int, str, float | None], None] | None = None,
    on_start: Callable[[Outlook], None] | None = None,
    available_bytes: Callable[[], int | None] | None = None,
    splits: list[tuple[str, tuple[int, ...]]] | None = None,
    over_ranks: bool = False,
) -> BenchResult:
    """Time the splits of ``effective_batch`` (default: the probe's plan) on the probe's device, in rounds.

    Args:
        settings: rounds, repeats, stopping rule and which splits (:class:`BenchSettings`).
        splits: ``(kind, sizes)`` to time instead of the plan and its neighbours.
        on_trial: ``(round, split label, samples/s or None)`` after each trial (progress).
        on_start: what is about to be timed and its expected duration, before the first trial.
        over_ranks: time a replicated (DDP) plan over its W ranks too, each rank a process with E/W samples
            and DDP's all-reduce, as a sharded plan always is (``gaplan plan --measure`` compares them).
    """
    settings = settings or BenchSettings()
    effective = effective_batch or probed.plan.effective_batch
    # A sharded workload is timed over its ranks (each trial runs all of them); anything else in one process.
    world = probed.plan.world_size if probed.workload.parallel == "fsdp" or over_ranks else 1
    make_plan(effective, effective, world)  # a bad effective batch fails here, before any work
    jobs, untimed = bench_jobs(probed, effective, settings, world, splits, available_bytes or cpu_available_bytes)
    if not jobs:  # nothing to time (the tuner's checkpointing splits, when none is larger than B* without it)
        return BenchResult(effective, untimed, stopped_because="no split to time")
    reference = reference_job(jobs, effective // world) if settings.large_batch else None
    if on_start is not None:
        on_start(Outlook([split_label(job.sizes, world) for job in jobs], expected_round_seconds(probed, jobs, settings),
                         settings))
    timings = time_in_rounds(probed, jobs, settings, world, reference, threads=threads, on_trial=on_trial)
    rows = [replace(row, probe_peak_bytes=probed_peak(probed, row.micro_batch) if probed.probed else None)
            for row in measurement_rows(jobs, timings, reference, world) + untimed]
    result = BenchResult(effective, rows, **timings.summary())
    if reference is not None and jobs[reference].kind == PLAN:  # the plan is the large batch: the same run
        plan = result.rows[reference]
        result.rows.append(replace(plan, kind=LARGE_BATCH, note="the same run as the plan: E fits in one micro-batch"))
    for row in result.rows:
        if on_row is not None:
            on_row(row)
    return result


def reference_job(jobs: list[Job], share: int) -> int | None:
    """Which job the ratios are taken against: the true large batch, else the largest fit, else the plan when it is
    the large batch itself (E fits in one micro-batch)."""
    for kind in (LARGE_BATCH, LARGEST_FIT):
        found = next((i for i, job in enumerate(jobs) if job.kind == kind), None)
        if found is not None:
            return found
    return next((i for i, job in enumerate(jobs) if job.sizes == (share,)), None)


def expected_round_seconds(probed: ProbeResult, jobs: list[Job], settings: BenchSettings) -> float | None:
    """About how long one round takes, from the probe's trials (each: its optimizer steps of two micro-steps).

    A line through the micro-step times of the smallest and largest fitting trials gives a micro-step's time at any
    size; what the probe's wall time holds beyond its trials' steps, per trial, is what a fresh trial costs to start
    (fork, build). A job is such a start and ``warmup + repeats`` steps of its split. The trials ran with the budget's
    allocator settings and their first step allocates, so this leans long; the first round gives a better figure.
    """
    fitted = sorted((t for t in probed.trials if t.fits and t.seconds), key=lambda t: t.micro_batch)
    if not fitted:
        return None
    start = max(probed.wall_seconds - sum(t.seconds for t in probed.trials), 0.0) / len(probed.trials)

    def measured(trial) -> float:  # one micro-step of the trial's size
        return trial.seconds / (2 * max(trial.completed_steps, 1))

    small, large = fitted[0], fitted[-1]
    slope = ((measured(large) - measured(small)) / (large.micro_batch - small.micro_batch)
             if large.micro_batch > small.micro_batch else measured(large) / large.micro_batch)

    def micro_step(size: int) -> float:
        return max(measured(small) + slope * (size - small.micro_batch), 0.0)

    steps = settings.warmup + settings.repeats
    return sum(start + micro_step(max(job.sizes)) * steps * len(job.sizes) for job in jobs)


def probed_peak(probed: ProbeResult, micro_batch: int) -> int | None:
    """Peak bytes at ``micro_batch`` under the probe's budget: its trial's at that size, else from the line through
    the probe's measured peaks (None without two)."""
    exact = next((t.peak_bytes for t in probed.trials if t.fits and t.micro_batch == micro_batch and t.peak_bytes),
                 None)
    if exact is not None:
        return exact
    points = [(t.micro_batch, t.line_peak_bytes) for t in probed.trials if t.fits and t.line_peak_bytes]
    line = fit_memory_line(points)
    return None if line is None else int(line[0] + line[1] * micro_batch)
