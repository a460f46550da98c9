"""One-line renderings of a trial and of a throughput row, shared by the CLI's output and progress. No torch."""

from __future__ import annotations

from typing import Any

from gaplan.trial import Trial
from gaplan.units import format_bytes


def trial_line(trial: Trial) -> str:
    """``micro-batch 35  fits  peak 1014.30 MiB  13.25 s`` (an OOM says at which optimizer step)."""
    verdict = "fits" if trial.fits else "OOM "
    where = f"  (out of memory at optimizer step {trial.completed_steps + 1})" if not trial.fits else ""
    return (f"  micro-batch {trial.micro_batch:>6}  {verdict}  peak {format_bytes(trial.peak_bytes):>10}  "
            f"{trial.seconds:7.2f} s{where}")


def throughput_line(row: Any) -> str:
    """A bench row (:class:`gaplan.benchmark.SplitMeasurement`): split, samples/s, peak, ratio, note."""
    speed = f"{row.samples_per_s:8.1f} samples/s" if row.samples_per_s else "       - samples/s"
    ratio = f"  x{row.ratio_to_large_batch:.2f} of the large batch" if row.ratio_to_large_batch else ""
    peak = format_bytes(row.peak_bytes)
    return f"  {row.split:>18}  {speed}  peak {peak:>10}{ratio}{'  ' + row.note if row.note else ''}"
