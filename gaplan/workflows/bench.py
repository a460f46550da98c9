"""``gaplan bench`` as a library function: time the splits against a true large batch, break memory down by
category, and write throughput.csv, breakdown.csv and the report into the run folder.

The CLI parses options, calls one of these and prints what they return; progress goes out through callbacks.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from gaplan.core.progress import Say, quiet
from gaplan.runs.folder import PLAN_JSON, path_in
from gaplan.runs.probe_result import ProbeResult, save_probe


def write_measurements(out: str, result: ProbeResult, benches: list, on_row: Callable[[Any], None] | None = None,
                       say: Say = quiet) -> list[str]:
    """throughput.csv and breakdown.csv from measurements, then the report built from the folder's files."""
    from gaplan.benchmark.splits import bench
    from gaplan.report.write import write_report
    from gaplan.runs.schema import BREAKDOWN, THROUGHPUT, write_table
    from gaplan.worker.client import WorkerProcess

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
    from gaplan.benchmark.splits import bench
    from gaplan.report.write import write_report
    from gaplan.runs.schema import THROUGHPUT, write_table

    measured = bench(probed, effective_batch, repeats=repeats, warmup=warmup, threads=threads, large_batch=large_batch,
                     on_row=on_row)
    os.makedirs(out, exist_ok=True)
    save_probe(dataclasses.replace(probed, command=command), path_in(out, PLAN_JSON))
    write_table(out, THROUGHPUT, measured.to_records())
    return measured, write_report(out).files
