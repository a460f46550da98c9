"""Timing splits in interleaved rounds, until the plan's ratio is known well enough or the time is spent.

A round runs every split once (ABC, then CBA, then ABC: a drift within a round hits every split alike on
average), each as a fresh trial of ``warmup`` untimed and ``repeats`` timed optimizer steps. A round's rate for a
split is E over the median of its timed steps; the rates of one round are compared with each other only
(:func:`gaplan.benchmark.stats.paired_ratio`). After ``min_rounds``, timing stops once the plan's ratio to the
reference has a 95% interval within ``ci_target``; it also stops before a round that would end past
``time_budget_s`` (``min_rounds`` always run), or after ``max_rounds``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gaplan.benchmark.measurement import LARGE_BATCH, PLAN, BenchSettings, Job, SplitMeasurement, split_label
from gaplan.benchmark.stats import Estimate, contention, estimate, paired_ratio, verdict
from gaplan.core.trial import Trial
from gaplan.runs.probe_result import ProbeResult
from gaplan.worker.client import WorkerProcess


@dataclass
class JobTimings:
    """What the rounds measured of one split."""

    rates: list[float | None] = field(default_factory=list)  # samples/s of each round (None: it did not run)
    step_seconds: list[float] = field(default_factory=list)  # every timed step, over the rounds
    cpu_seconds: list[float] = field(default_factory=list)
    peak_bytes: int | None = None
    tokens_per_step: int = 0
    error: str | None = None


@dataclass
class Timings:
    """Every split's timings, and how the rounds ended."""

    jobs: list[JobTimings]
    rounds: int
    stopped_because: str
    wall_seconds: float
    labels: list[str]  # each job's split
    kinds: list[str]
    plan: int | None  # index of the plan's job
    reference: int | None  # index of the job the ratios are taken against
    on_gpu: bool

    def ratio(self, index: int) -> Estimate | None:
        """A job's samples/s over the reference's, paired by round."""
        if self.reference is None:
            return None
        return paired_ratio(self.jobs[index].rates, self.jobs[self.reference].rates)

    def _verdict(self) -> str:
        if self.plan is not None and self.reference == self.plan:
            return "the plan is the true large batch (E fits in one micro-batch): there is no accumulation to pay for"
        plan_ratio = self.ratio(self.plan) if self.plan is not None else None
        if plan_ratio is None:
            return ""
        reference = "a true large batch" if self.kinds[self.reference] == LARGE_BATCH else "the largest batch that fits"
        return verdict(plan_ratio, reference=reference)

    def summary(self) -> dict:
        """The :class:`gaplan.benchmark.splits.BenchResult` fields beyond its rows."""
        timed = [j for j in self.jobs if j.step_seconds]
        cpu = None if self.on_gpu or not all(j.cpu_seconds for j in timed) else sum(sum(j.cpu_seconds) for j in timed)
        wall = sum(sum(j.step_seconds) for j in timed)
        seen = contention(cpu, wall, {label: [r for r in j.rates if r] for label, j in zip(self.labels, self.jobs,
                                                                                            strict=True)})
        return {"rounds": self.rounds, "stopped_because": self.stopped_because,
                "verdict": self._verdict(),
                "contention": seen.describe(), "contended": seen.contended, "wall_seconds": self.wall_seconds,
                "round_rates": {label: [None if r is None else round(r, 3) for r in j.rates]
                                for label, j in zip(self.labels, self.jobs, strict=True)}}


def time_in_rounds(probed: ProbeResult, jobs: list[Job], settings: BenchSettings, world: int, reference: int | None,
                   threads: int | None = None,
                   on_trial: Callable[[int, str, float | None], None] | None = None) -> Timings:
    """Run ``jobs`` in rounds in one worker with the allocators as training has them, no budget bound."""
    with WorkerProcess(probed.workload, probed.device, probed.probe_limit_bytes, threads=threads, ranks=world,
                       native_allocator=True) as worker:
        def trial(job: Job) -> Trial:
            return worker.trial(max(job.sizes), optimizer_steps=settings.warmup + settings.repeats,
                                sizes=list(job.sizes), unbounded=True)

        return run_rounds(jobs, settings, trial, world, reference, on_trial=on_trial,
                          on_gpu=not probed.device.startswith("cpu"))


def run_rounds(jobs: list[Job], settings: BenchSettings, trial: Callable[[Job], Trial], world: int,
               reference: int | None, on_trial: Callable[[int, str, float | None], None] | None = None,
               on_gpu: bool = False, clock: Callable[[], float] = time.perf_counter) -> Timings:
    """The rounds and their stopping rule over any ``trial`` runner (a worker's, or recorded trials in a test)."""
    settings.check_interval()
    labels = [split_label(job.sizes, world) for job in jobs]
    timings = [JobTimings() for _ in jobs]
    plan = next((i for i, job in enumerate(jobs) if job.kind == PLAN), None)
    target = plan if plan is not None else 0
    started = clock()
    rounds, why = 0, f"{settings.max_rounds} round{'s' if settings.max_rounds != 1 else ''} (--max-rounds)"
    while rounds < settings.max_rounds:
        elapsed = clock() - started
        if rounds >= settings.min_rounds:
            known = _ratio_or_rate(timings, target, reference)
            width = known.relative_half_width if known is not None else None
            if width is not None and width <= settings.ci_target:
                what = "the plan's ratio" if reference != target else "every split's ratio to the plan"
                why = f"{what} is known to ±{width:.1%} (target ±{settings.ci_target:.0%})"
                break
        # The time budget bounds the rounds past the minimum (which the forecast announced): without two rounds
        # there is no interval, and without the minimum the stopping rule has not looked.
        if rounds >= settings.min_rounds and elapsed + elapsed / rounds > settings.time_budget_s:
            why = f"the time budget of {settings.time_budget_s:.0f} s (--time-budget)"
            break
        rounds += 1
        order = range(len(jobs)) if rounds % 2 else reversed(range(len(jobs)))
        for index in order:
            job, timing = jobs[index], timings[index]
            if timing.error is not None:
                timing.rates.append(None)
                continue
            # Each job's own samples a step: the goodput tuner times the splits of several effective batches at once.
            _record(timing, trial(job), settings.warmup, sum(job.sizes) * world)
            if on_trial is not None:
                on_trial(rounds, labels[index], timing.rates[-1])
    return Timings(timings, rounds, why, clock() - started, labels, [j.kind for j in jobs], plan, reference, on_gpu)


def _record(timing: JobTimings, trial: Trial, warmup: int, effective: int) -> None:
    if not trial.fits:
        timing.error = trial.error or "did not fit"
        timing.rates.append(None)
        return
    timed = trial.step_seconds[warmup:]
    timing.rates.append(effective / statistics.median(timed))
    timing.step_seconds += timed
    timing.cpu_seconds += trial.step_cpu_seconds[warmup:]
    timing.peak_bytes = max(timing.peak_bytes or 0, trial.peak_bytes or 0) or None
    timing.tokens_per_step = trial.tokens_per_step


def _ratio_or_rate(timings: list[JobTimings], target: int, reference: int | None) -> Estimate | None:
    """What the stopping rule watches: the plan's ratio to the reference; where the plan is the reference (E fits
    in one micro-batch), the least known ratio of another split to it; without a reference the plan's own rate."""
    if reference is not None and reference != target:
        return paired_ratio(timings[target].rates, timings[reference].rates)
    if reference is not None:
        others = [paired_ratio(t.rates, timings[reference].rates) for i, t in enumerate(timings) if i != reference]
        known = [r for r in others if r is not None and r.relative_half_width is not None]
        if known:
            return max(known, key=lambda r: r.relative_half_width)
    rates = [r for r in timings[target].rates if r]
    return estimate(rates) if rates else None


def measurement_rows(jobs: list[Job], timings: Timings, reference: int | None, world: int) -> list[SplitMeasurement]:
    """One row per job: its rate's estimate and interval, its ratio to the reference with its interval."""
    rows = []
    for index, (job, timing) in enumerate(zip(jobs, timings.jobs, strict=True)):
        effective = sum(job.sizes) * world
        label = split_label(job.sizes, world)
        rates = [r for r in timing.rates if r]
        if not rates:
            rows.append(SplitMeasurement(label, job.kind, max(job.sizes), len(job.sizes), effective, 0, None, None, None,
                                         None, None, None, False, False, note=f"failed: {timing.error}",
                                         rounds=timings.rounds))
            continue
        rate = estimate(rates)
        ratio = timings.ratio(index)
        tokens = timing.tokens_per_step * rate.value / effective if timing.tokens_per_step else None
        cpu = (sum(timing.cpu_seconds) / sum(timing.step_seconds)
               if timing.cpu_seconds and not timings.on_gpu else None)
        rows.append(SplitMeasurement(
            label, job.kind, max(job.sizes), len(job.sizes), effective, len(timing.step_seconds),
            round(statistics.median(timing.step_seconds), 4), round(min(timing.step_seconds), 4),
            round(max(timing.step_seconds), 4), round(rate.value, 3), None if tokens is None else round(tokens, 1),
            timing.peak_bytes, job.fits_budget, False,
            ratio_to_large_batch=None if ratio is None else round(ratio.value, 4), note=job.note,
            rounds=len(rates), samples_per_s_low=_rounded(rate.low, 3), samples_per_s_high=_rounded(rate.high, 3),
            ratio_low=None if ratio is None else _rounded(ratio.low, 4),
            ratio_high=None if ratio is None else _rounded(ratio.high, 4),
            cpu_per_wall=None if cpu is None else round(cpu, 3)))
    return rows


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
