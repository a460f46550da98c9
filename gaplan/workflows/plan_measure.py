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

from gaplan.benchmark.splits import BenchSettings, bench, candidate_splits, probed_peak
from gaplan.core.errors import DoesNotFit, GaplanError, one_line
from gaplan.plan.layouts import LayoutComparison, LayoutResult, launch_command
from gaplan.probing.edge import probe
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
    try:
        probed = probe(layout_spec, device=device, memory_limit=memory_limit, effective_batch=effective,
                       world_size=world, threads=threads)
    except DoesNotFit as exc:
        return dataclasses.replace(result, fits=False, note=f"measured: {one_line(exc)}",
                                   extra={**result.extra, **estimated, "measured": True})
    except GaplanError as exc:  # the device cannot run this layout (CPU offload on a CPU)
        return dataclasses.replace(result, note=f"not measured: {one_line(exc)}", extra={**result.extra, **estimated})
    kind, sizes = candidate_splits(effective, probed.max_micro_batch, world)[0]
    # One layout against the others, each timed after its own probe: a single round (no pairing across layouts).
    settings = BenchSettings(repeats=repeats, warmup=warmup, min_rounds=1, max_rounds=1, large_batch=False)
    timed = bench(probed, effective, settings, threads=threads, splits=[(kind, sizes)], over_ranks=True)
    row = timed.rows[0]
    plan = probed.plan
    return dataclasses.replace(
        result, max_micro_batch=probed.max_micro_batch, micro_batch=plan.micro_batch,
        # The peak under the budget (the probe's, at the plan's micro-batch), not the timing run's: that one ran with
        # the allocators as training has them, whose resident peak is not what the budget bounds.
        grad_accum_steps=plan.grad_accum_steps, peak_bytes=probed_peak(probed, plan.micro_batch) or row.peak_bytes,
        samples_per_s=row.samples_per_s,
        extra={**result.extra, **estimated, "measured": True, "capped": probed.capped,
               "probe_seconds": round(probed.wall_seconds, 1), "step_seconds_median": row.step_seconds_median},
        command=launch_command(layout_spec.to_dict(), plan.micro_batch, effective, world, nodes,
                               device=None if probed.device.startswith("cuda") else probed.device),
        note=result.note if row.samples_per_s else "; ".join(filter(None, [result.note, "measured: the plan's split "
                                                                                        "did not run"])))
