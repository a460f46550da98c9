"""The tuner: pick the split to train with, by the largest micro-batch or by measured throughput.

``max-micro-batch`` (the default) takes the probe's plan. ``throughput`` times every
split that keeps the effective batch (:mod:`gaplan.benchmark.splits`) and takes the fastest;
a larger micro-batch is usually, not always, faster (cache effects, thread counts).
Gradient checkpointing ``auto`` probes with it off and on: on only when it lets a
larger micro-batch fit *and* that split wins on measured throughput.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import asdict, dataclass

from gaplan.benchmark.splits import (
    PLAN,
    SPLIT,
    BenchResult,
    BenchSettings,
    Outlook,
    SplitMeasurement,
    bench,
    candidate_splits,
)
from gaplan.core.checkpointing import AUTO, OFF, ON, Checkpointing
from gaplan.core.errors import GaplanError
from gaplan.core.options import OptionError
from gaplan.core.trial import Trial
from gaplan.plan.split import make_plan
from gaplan.probing.edge import probe
from gaplan.runs.probe_result import ProbeResult
from gaplan.workload.spec import WorkloadSpec

OBJECTIVES = ("max-micro-batch", "throughput")


@dataclass(frozen=True)
class TunerDecision:
    """The split chosen, and why (saved as ``tuner`` in ``plan.json``)."""

    objective: str
    micro_batch: int
    grad_accum_steps: int
    grad_checkpointing: bool | str  # as plan.json holds it (Checkpointing.spec_value)
    samples_per_s: float | None
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TunedProbe:
    """The probe to train with (its plan is the chosen split), every bench run, and the decision."""

    result: ProbeResult
    benches: list[BenchResult]
    decision: TunerDecision


def choose(objective: str, candidates: list[tuple[ProbeResult, BenchResult | None]]) -> tuple[ProbeResult, TunerDecision]:
    """Pick among probes (checkpointing off and/or on) and their benches. No measuring here."""
    if objective not in OBJECTIVES:
        raise OptionError(f"objective must be one of {', '.join(OBJECTIVES)} (got {objective!r})", "objective")
    baseline, baseline_bench = candidates[0]
    plan_row = _plan_row(baseline_bench)
    if objective == "max-micro-batch" and len(candidates) == 1:
        return baseline, _decision(objective, baseline, baseline.plan.micro_batch, baseline.plan.grad_accum_steps,
                                   plan_row, "the largest micro-batch that fits (B*), evenly split")
    scored = [(row, result) for result, measured in candidates if measured for row in _rows(objective, measured)]
    if not scored:
        raise GaplanError("the tuner has no measured split to choose from")
    row, result = max(scored, key=lambda pair: pair[0].samples_per_s)
    what = "fastest measured split" if objective == "throughput" else "the largest micro-batch's plan"
    versus = f"; the plan from B*={baseline.max_micro_batch} ran {plan_row.samples_per_s:.1f} samples/s" \
        if plan_row is not None and plan_row.samples_per_s and row is not plan_row else ""
    checkpointing = " with gradient checkpointing" if result.workload.grad_checkpointing else ""
    reason = f"{what}{checkpointing}: {row.split} at {row.samples_per_s:.1f} samples/s{versus}"
    if len(candidates) > 1 and not result.workload.grad_checkpointing:
        slower = max((r for r, res in scored if res.workload.grad_checkpointing), key=lambda r: r.samples_per_s,
                     default=None)
        if slower is not None:
            reason += (f"; gradient checkpointing off: its larger micro-batch ran slower "
                       f"({slower.split} at {slower.samples_per_s:.1f} samples/s)")
    return result, _decision(objective, result, row.micro_batch, row.grad_accum_steps, row, reason)


def _rows(objective: str, measured: BenchResult) -> list[SplitMeasurement]:
    rows = [r for r in measured.rows if r.kind in (PLAN, SPLIT) and r.fits_budget and r.samples_per_s]
    return rows if objective == "throughput" else [r for r in rows if r.kind == PLAN]


def _plan_row(measured: BenchResult | None) -> SplitMeasurement | None:
    return next((r for r in measured.rows if r.kind == PLAN), None) if measured else None


def _decision(objective: str, result: ProbeResult, micro: int, steps: int, row: SplitMeasurement | None,
              reason: str) -> TunerDecision:
    return TunerDecision(objective, micro, steps, result.workload.grad_checkpointing.spec_value(),
                         row.samples_per_s if row is not None else None, reason)


def tune(
    spec: WorkloadSpec,
    objective: str = "max-micro-batch",
    grad_checkpointing: Checkpointing | str = OFF,
    device: str = "auto",
    memory_limit: int | None = None,
    effective_batch: int = 256,
    bench_large_batch: bool = False,
    bench_settings: BenchSettings | None = None,
    on_trial: Callable[[Trial], None] | None = None,
    on_row: Callable[[SplitMeasurement], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
    on_bench_trial: Callable[[int, str, float | None], None] | None = None,
    on_bench_start: Callable[[Outlook], None] | None = None,
    **probe_options,
) -> TunedProbe:
    """Probe (once, or with checkpointing off and on), bench when the choice needs it, and choose.

    ``bench_settings``: how splits are timed; choosing by throughput times every split (``all_splits``)."""
    # auto: off and on, the tuner chooses; any other value is the blocks to checkpoint (gaplan.core.checkpointing)
    settings = [OFF, ON] if grad_checkpointing == AUTO else [grad_checkpointing]
    if objective not in OBJECTIVES:
        raise OptionError(f"objective must be one of {', '.join(OBJECTIVES)} (got {objective!r})", "objective")
    stage = on_stage or (lambda text: None)
    probes = []
    for checkpointing in settings:
        if len(settings) > 1:
            stage(f"probing with gradient checkpointing {'on' if checkpointing else 'off'}")
        probes.append(probe(dataclasses.replace(spec, grad_checkpointing=checkpointing), device=device,
                            memory_limit=memory_limit, effective_batch=effective_batch, on_trial=on_trial,
                            **probe_options))
    if len(probes) == 2 and probes[1].max_micro_batch <= probes[0].max_micro_batch:
        stage(f"checkpointing lets no larger micro-batch fit (B* {probes[1].max_micro_batch} vs "
              f"{probes[0].max_micro_batch}): off")
        probes = probes[:1]
    needs_bench = objective == "throughput" or len(probes) == 2 or bench_large_batch
    benches: list[BenchResult] = []
    if needs_bench:
        timing = bench_settings or BenchSettings()
        timing = dataclasses.replace(timing, all_splits=timing.all_splits or objective == "throughput"
                                     or len(probes) == 2)
        off_edge = probes[0].max_micro_batch
        for index, probed in enumerate(probes):
            stage(f"timing splits{' with checkpointing' if probed.workload.grad_checkpointing else ''}")
            # With checkpointing only the sizes that do not fit without it can win.
            splits = None if index == 0 else [s for s in candidate_splits(effective_batch, probed.max_micro_batch)
                                               if max(s[1]) > off_edge]
            settings = dataclasses.replace(timing, large_batch=bench_large_batch and index == 0)
            benches.append(bench(probed, effective_batch, settings, on_row=on_row, on_trial=on_bench_trial,
                                 on_start=on_bench_start,
                                 splits=splits))
    chosen, decision = choose(objective, list(zip(probes, benches or [None] * len(probes), strict=True)))
    if objective == "max-micro-batch" and grad_checkpointing != AUTO:
        return TunedProbe(chosen, benches, decision)  # the probe's own plan; nothing was chosen over it
    plan = make_plan(effective_batch, decision.micro_batch, chosen.plan.world_size)
    chosen = dataclasses.replace(chosen, plan=plan, tuner=decision.to_dict())
    return TunedProbe(chosen, benches, decision)
