"""Measuring the layouts on this machine's device: ``gaplan plan --measure``.

The estimate ranks layouts by their largest micro-batch; which one trains fastest is a question for the
hardware (gathers, recomputation and host transfers cost time the estimate does not model). For every
layout the estimate says fits, this probes the exact B* on the device (:func:`gaplan.probing.edge.probe`: trials of
all W ranks for FSDP) and times the plan's split at it (:func:`gaplan.benchmark.splits.bench`, over all W ranks for
DDP too, so both pay their communication). The results then carry the measured B*, split, peak and samples/s,
and :func:`gaplan.plan.layouts.pick` takes the fastest. No torch here: probe and bench run in worker processes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from gaplan.benchmark.measurement import SplitMeasurement
from gaplan.benchmark.splits import BenchSettings, bench, candidate_splits, probed_peak
from gaplan.core.errors import DoesNotFit, GaplanError, one_line
from gaplan.plan.layouts import LayoutComparison, LayoutResult, launch_command
from gaplan.probing.edge import probe
from gaplan.runs.probe_result import ProbeResult
from gaplan.workflows.plan import spec_of
from gaplan.workload.spec import WorkloadSpec


def measure_layouts(comparison: LayoutComparison, spec: WorkloadSpec, *, device: str,
                    memory_limit: int | None = None, threads: int | None = None, repeats: int = 3, warmup: int = 1,
                    on_result: Callable[[LayoutResult], None] | None = None) -> LayoutComparison:
    """``comparison`` with every layout that fits probed and timed on ``device`` (``cpu``, ``cuda``, ``auto``).

    ``memory_limit``: per rank (default: the CPU default budget, or the whole card). A layout the device cannot
    run (CPU offload on the CPU) or that does not fit once measured keeps its estimate with a note that says so.
    """
    world = comparison.world_size
    measured: list[LayoutResult] = []
    for result in comparison.results:
        if result.fits:
            result = _measure_one(result, spec, device, memory_limit, threads, repeats, warmup, world,
                                  comparison.nodes, comparison.effective_batch)
            if on_result is not None:
                on_result(result)
        measured.append(result)
    return dataclasses.replace(comparison, results=measured, measured_on=device)


def _measure_one(result: LayoutResult, spec: WorkloadSpec, device: str, memory_limit: int | None,
                 threads: int | None, repeats: int, warmup: int, world: int, nodes: int,
                 effective: int) -> LayoutResult:
    """One layout probed, then its plan timed; a layout that fails either way keeps its estimate with a note."""
    layout_spec = spec_of(spec, result.layout)
    estimated = {"estimated_max_micro_batch": result.max_micro_batch, "estimated_peak_bytes": result.peak_bytes}
    # One layout against the others, each timed after its own probe: a single round (no pairing across layouts).
    settings = BenchSettings(repeats=repeats, warmup=warmup, min_rounds=1, max_rounds=1, large_batch=False)
    try:
        done = probe_and_time(layout_spec, device=device, memory_limit=memory_limit, effective=effective,
                              threads=threads, settings=settings, world=world, nodes=nodes, over_ranks=True)
    except DoesNotFit as exc:
        return dataclasses.replace(result, fits=False, note=f"measured: {one_line(exc)}",
                                   extra={**result.extra, **estimated, "measured": True})
    except GaplanError as exc:  # the device cannot run this layout (CPU offload on a CPU)
        return dataclasses.replace(result, note=f"not measured: {one_line(exc)}", extra={**result.extra, **estimated})
    probed, row, plan = done.probed, done.row, done.probed.plan
    return dataclasses.replace(
        result, max_micro_batch=probed.max_micro_batch, micro_batch=plan.micro_batch,
        grad_accum_steps=plan.grad_accum_steps, peak_bytes=done.peak_bytes, samples_per_s=row.samples_per_s,
        extra={**result.extra, **estimated, "measured": True, "capped": probed.capped,
               "probe_seconds": round(probed.wall_seconds, 1), "step_seconds_median": row.step_seconds_median},
        command=done.command,
        note=result.note if row.samples_per_s else "; ".join(filter(None, [result.note, "measured: the plan's split "
                                                                                        "did not run"])))


@dataclass(frozen=True)
class ProbedAndTimed:
    """A workload probed for its exact B* and its plan's split timed (:func:`probe_and_time`)."""

    probed: ProbeResult
    row: SplitMeasurement  # the timed split
    peak_bytes: int | None  # under the budget, at the plan's micro-batch
    command: str  # the gaplan train (torchrun) line of the measured plan


def probe_and_time(spec: WorkloadSpec, *, device: str, memory_limit: int | None, effective: int,
                   threads: int | None, settings: BenchSettings, world: int = 1, nodes: int = 1,
                   over_ranks: bool = False) -> ProbedAndTimed:
    """``spec`` probed on ``device`` (all ``world`` ranks), then its plan's split timed by the bench with
    ``settings``: what ``gaplan plan --measure`` records of a layout or a lever row. A probe that finds nothing
    fits raises :class:`DoesNotFit`; a workload the device cannot run, :class:`GaplanError`."""
    probed = probe(spec, device=device, memory_limit=memory_limit, effective_batch=effective, world_size=world,
                   threads=threads)
    split = candidate_splits(effective, probed.max_micro_batch, world)[0]
    row = bench(probed, effective, settings, threads=threads, splits=[split], over_ranks=over_ranks).rows[0]
    plan = probed.plan
    # The peak under the budget (the probe's, at the plan's micro-batch), not the timing run's: that one ran with the
    # allocators as training has them, whose resident peak is not what the budget bounds.
    return ProbedAndTimed(probed, row, probed_peak(probed, plan.micro_batch) or row.peak_bytes,
                          launch_command(spec.to_dict(), plan.micro_batch, effective, world, nodes,
                                         device=None if probed.device.startswith("cuda") else probed.device))
