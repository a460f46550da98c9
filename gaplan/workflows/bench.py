"""``gaplan bench`` as a library function: time the splits against a true large batch, break memory down by
category, and write throughput.csv, breakdown.csv and the report into the run folder.

The CLI parses options, calls one of these and prints what they return; progress goes out through callbacks.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from gaplan.core.checkpointing import Checkpointing
from gaplan.core.progress import Say, quiet
from gaplan.core.trial import Trial
from gaplan.runs.folder import PLAN_JSON, path_in
from gaplan.runs.probe_result import ProbeResult, save_probe
from gaplan.workload.spec import WorkloadSpec


def write_bench(out: str, measured: Any, extra_rows: list[dict] | None = None) -> None:
    """throughput.csv (the rows, then ``extra_rows``) and bench.json (how the rounds ended, the verdict)."""
    from gaplan.runs.folder import BENCH_JSON
    from gaplan.runs.schema import THROUGHPUT, write_bench_json, write_table

    write_table(out, THROUGHPUT, measured.to_records() + (extra_rows or []))
    summary = measured.to_dict()
    del summary["rows"]
    write_bench_json(path_in(out, BENCH_JSON), summary)


def write_measurements(out: str, result: ProbeResult, benches: list, on_row: Callable[[Any], None] | None = None,
                       say: Say = quiet) -> list[str]:
    """throughput.csv and breakdown.csv from measurements, then the report built from the folder's files."""
    from gaplan.benchmark.splits import bench
    from gaplan.report.write import write_report
    from gaplan.runs.schema import BREAKDOWN, write_table
    from gaplan.worker.client import WorkerProcess

    if not benches:
        benches = [bench(result, on_row=on_row)]
    extra = []
    for measured in benches[1:]:  # the splits that only fit with gradient checkpointing
        extra += [dict(row, split=row["split"] + " +ckpt", kind="split") for row in measured.to_records()]
    write_bench(out, benches[0], extra)
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


def run_bench(probed: ProbeResult, out: str, effective_batch: int, settings: Any = None, *,
              threads: int | None = None, command: str | None = None, on_row: Callable[[Any], None] | None = None,
              on_trial: Callable[[int, str, float | None], None] | None = None,
              on_start: Callable[[Any], None] | None = None) -> tuple[Any, list[str]]:
    """Time the splits (``settings``: a :class:`gaplan.benchmark.measurement.BenchSettings`), then write plan.json,
    throughput.csv, bench.json and the report into ``out``; the result and the files."""
    from gaplan.benchmark.splits import bench
    from gaplan.report.write import write_report

    measured = bench(probed, effective_batch, settings, threads=threads, on_row=on_row, on_trial=on_trial,
                     on_start=on_start)
    os.makedirs(out, exist_ok=True)
    save_probe(dataclasses.replace(probed, command=command), path_in(out, PLAN_JSON))
    write_bench(out, measured)
    return measured, write_report(out).files


def probe_and_bench(spec: WorkloadSpec, out: str, effective_batch: int, settings: Any = None, *,
                    device: str = "auto", memory_limit: int | None = None, plan_file: str | None = None,
                    grad_checkpointing: Checkpointing | str | None = None, world_size: int = 1, threads: int | None = None,
                    command: str | None = None, say: Say = quiet, on_trial: Callable[[Trial], None] | None = None,
                    on_row: Callable[[Any], None] | None = None,
                    on_bench_trial: Callable[[int, str, float | None], None] | None = None,
                    on_start: Callable[[Any], None] | None = None) -> tuple[Any, list[str]]:
    """``gaplan bench``: the probe (``plan_file``'s, the cache's, or a new one), then :func:`run_bench` over it."""
    from gaplan.devices.backend import resolve_device
    from gaplan.plan.split import default_search_cap
    from gaplan.probing.cache import probe_for

    device = resolve_device(device)
    spec, probed = probe_for(spec, device, memory_limit, default_search_cap(effective_batch, world_size),
                             plan_file=plan_file, grad_checkpointing=grad_checkpointing, threads=threads, say=say,
                             on_trial=on_trial, world_size=world_size)
    return run_bench(probed, out, effective_batch, settings, threads=threads, command=command, on_row=on_row,
                     on_trial=on_bench_trial, on_start=on_start)
