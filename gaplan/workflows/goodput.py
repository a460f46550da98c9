"""``gaplan probe --objective goodput``: the effective batch worth its accumulation steps, measured.

1. Probe B* (the search reaching the range's top).
2. A short measuring run trains the asked-for effective batch with the noise scale on
   (:mod:`gaplan.training.noise_scale`), in its own run folder under ``out``.
3. One bench times the plan of every candidate effective batch in the range, interleaved in rounds.
4. Each candidate's goodput is its samples/s times Pollux's statistical efficiency at the measured noise scale
   (:mod:`gaplan.plan.goodput`); plan.json gets the best one's plan.

The learning rate is left as given: the decision says what the chosen batch implies (linear and square-root
scaling), and ``gaplan train --plan plan.json --lr-scaling linear|sqrt`` applies one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gaplan.benchmark.measurement import BenchSettings, SplitMeasurement
from gaplan.core.errors import GaplanError
from gaplan.core.progress import Say, quiet
from gaplan.plan.goodput import (
    GoodputRow,
    candidate_effective_batches,
    rank_by_goodput,
    scaled_learning_rate,
)
from gaplan.plan.split import make_plan
from gaplan.runs.probe_result import ProbeResult
from gaplan.workflows.probe_settings import GoodputOptions
from gaplan.workload.spec import WorkloadSpec

MEASURE_RUN = "goodput-measure"  # the measuring run's folder, under the probe's


@dataclass
class GoodputChoice:
    """What the goodput tuner measured and chose."""

    noise_scale: float
    reference_batch: int  # the asked-for effective batch: the one the learning rate was set for
    rows: list[GoodputRow]  # best first
    measure_run: str

    @property
    def chosen(self) -> GoodputRow:
        return self.rows[0]

    def lr_note(self, learning_rate: float) -> str:
        batch, reference = self.chosen.effective_batch, self.reference_batch
        if batch == reference:
            return f"the learning rate {learning_rate:g} stays as it was set for {reference}"
        linear = scaled_learning_rate(learning_rate, batch, reference, "linear")
        root = scaled_learning_rate(learning_rate, batch, reference, "sqrt")
        return (f"the learning rate {learning_rate:g} was set for {reference}; for {batch}, linear scaling gives "
                f"{linear:.3g} and square-root {root:.3g}: gaplan train keeps {learning_rate:g} unless --lr-scaling "
                "linear|sqrt")

    def to_dict(self) -> dict[str, Any]:
        return {"noise_scale": self.noise_scale, "reference_batch": self.reference_batch,
                "rows": [row.to_dict() for row in self.rows], "measure_run": self.measure_run}


def choose_by_goodput(probed: ProbeResult, asked: int, options: GoodputOptions, settings: BenchSettings, out: str,
                      *, device: str, memory_limit: int | None, threads: int | None, say: Say = quiet,
                      on_row: Callable[[SplitMeasurement], None] | None = None,
                      on_bench_trial: Callable[[int, str, float | None], None] | None = None,
                      on_bench_start: Callable[[Any], None] | None = None) -> tuple[ProbeResult, GoodputChoice]:
    """Measure the noise scale at ``asked``, time every candidate's plan, and return the probe re-planned for the
    best goodput, its tuner decision recorded."""
    from gaplan.benchmark.splits import PLAN, SPLIT, bench
    from gaplan.benchmark.tuner import TunerDecision

    if probed.plan.world_size != 1 or probed.workload.parallel == "fsdp":
        raise GaplanError("--objective goodput plans one process (its measuring run and bench run here); for "
                          "several ranks, choose the effective batch on one and give it to torchrun's run")
    low, high = options.bounds(asked)
    edge = probed.max_micro_batch
    noise, run_dir = measure_noise_scale(probed.workload, asked, edge, options, out, device=device,
                                         memory_limit=memory_limit, threads=threads, say=say)
    batches = candidate_effective_batches(low, high, asked)
    splits = [(PLAN if batch == asked else SPLIT, make_plan(batch, edge).micro_batch_sizes) for batch in batches]
    say(f"timing the plans of effective batches {', '.join(map(str, batches))} (B* {edge}) ...")
    timing = dataclasses.replace(settings, large_batch=False)
    measured = bench(probed, asked, timing, threads=threads, on_row=on_row, on_trial=on_bench_trial,
                     on_start=on_bench_start, splits=splits)
    rates = {row.effective_batch: row.samples_per_s for row in measured.rows if row.samples_per_s}
    if not rates:
        raise GaplanError("the goodput tuner timed no effective batch (every candidate failed)")
    choice = GoodputChoice(noise, asked, rank_by_goodput(rates, noise, asked), run_dir)
    best = choice.chosen
    plan = make_plan(best.effective_batch, edge)
    asked_row = next((row for row in choice.rows if row.effective_batch == asked), None)
    versus = (f"; the asked-for {asked}: {asked_row.samples_per_s:.1f} samples/s x {asked_row.efficiency:.2f} = "
              f"{asked_row.goodput:.1f}" if asked_row is not None and best is not asked_row else "")
    reason = (f"best goodput at the measured noise scale ~{noise:.0f}: effective batch {best.effective_batch} "
              f"({plan.micro_batch} x {plan.grad_accum_steps}), {best.samples_per_s:.1f} samples/s x statistical "
              f"efficiency {best.efficiency:.2f} = {best.goodput:.1f}{versus}; {choice.lr_note(probed.workload.learning_rate)}")
    decision = TunerDecision("goodput", plan.micro_batch, plan.grad_accum_steps, probed.workload.grad_checkpointing.spec_value(),
                             best.samples_per_s, reason)
    return dataclasses.replace(probed, plan=plan, tuner={**decision.to_dict(), "goodput": choice.to_dict()}), choice


def measure_noise_scale(spec: WorkloadSpec, effective: int, edge: int, options: GoodputOptions, out: str, *,
                        device: str, memory_limit: int | None, threads: int | None, say: Say = quiet
                        ) -> tuple[float, str]:
    """Train ``effective`` for ``options.measure_steps`` steps with the noise scale on; its last smoothed value.

    The micro-batch is B* or less, at least two micro-steps a step: the estimator needs a small batch and a big one.
    """
    from gaplan.training.config import LoopOptions
    from gaplan.workflows.train import run_train
    from gaplan.workflows.train_options import TrainOptions

    if effective < 2:
        raise GaplanError("--objective goodput measures the noise scale from two micro-batches a step: the "
                          "effective batch must be at least 2")
    micro = min(edge, effective // 2)
    run_dir = os.path.join(out, MEASURE_RUN)
    say(f"measuring the gradient noise scale: {options.measure_steps} steps at effective batch {effective} "
        f"(micro-batch {micro}) in {run_dir} ...")
    train_options = TrainOptions(effective_batch=effective, micro_batch=micro, source=options.source,
                                 loop=LoopOptions(steps=options.measure_steps, noise_scale=True), threads=threads)
    summary = run_train(spec, run_dir, train_options, device=device, memory_limit=memory_limit).summary
    measured = summary.get("noise_scale")
    noise = measured["noise_scale"] if measured else None
    if noise is None or not noise > 0:
        raise GaplanError(f"the measuring run ({options.measure_steps} steps at {effective}) measured no positive "
                          "noise scale: give more --measure-steps")
    assumed = (" (assuming independent draws: the workload does not say how it draws its samples)"
               if measured.get("drawing") == "unknown" else "")
    say(f"noise scale ~{noise:.1f} samples after {measured['steps_measured']} steps{assumed}")
    return float(noise), run_dir

