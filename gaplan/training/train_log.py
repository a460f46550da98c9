"""``train_log.csv``: one row per optimizer step, appended as the run goes and cut back on resume.

Columns are only ever added, at the end, so an older folder still reads: ``peak_bytes`` has always been the whole
process's resident peak; ``step_peak_bytes`` (the probe's peak: above the baseline taken when the budget was set)
and ``padded_tokens_per_s`` (token positions fed, padding included) came later and are empty in older logs.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass

from gaplan.core.atomic_write import atomic_write
from gaplan.core.disk import disk_faults_as_one_line
from gaplan.runs.folder import TRAIN_LOG_CSV
from gaplan.runs.schema import TRAIN_LOG

LOG_FIELDS = ["step", "loss", "lr", "samples_per_s", "tokens_per_s", "peak_bytes", "micro_batch",
              "grad_accum_steps", "seconds", "step_peak_bytes", "padded_tokens_per_s", "noise_scale", "grad_sq", "grad_var",
              "noise_scale_items", "effective_batch", "step_grad_sq", "step_grad_var", "items_per_sample"]
assert set(LOG_FIELDS) == set(TRAIN_LOG.columns), "train_log.csv's writer and its schema must agree"


@dataclass
class StepLog:
    step: int
    loss: float
    lr: float
    samples_per_s: float
    tokens_per_s: float  # real tokens (attention mask)
    peak_bytes: int | None  # the whole process's resident peak
    micro_batch: int
    grad_accum_steps: int
    seconds: float
    step_peak_bytes: int | None = None  # above the baseline, as the probe measures its trials
    padded_tokens_per_s: float | None = None  # token positions fed, padding included
    # The gradient noise scale (gaplan.training.noise_scale), smoothed: B_noise in samples; |G|^2 and tr(S) per
    # item (target); B_noise in items, the measured figure (in samples it is divided by the step's mean items per
    # sample: exact only where every sample has as many). Empty where the step could not be measured.
    noise_scale: float | None = None
    grad_sq: float | None = None
    grad_var: float | None = None
    noise_scale_items: float | None = None
    effective_batch: int | None = None  # the step's samples (a batch schedule changes it; by tokens, each step's)
    # The step's own |G|^2 and tr(S) per item, unsmoothed (|G|^2 can be below zero), and its items per sample: what
    # the adaptive schedule decides on (gaplan.plan.growth_test), so its decisions replay from the log.
    step_grad_sq: float | None = None
    step_grad_var: float | None = None
    items_per_sample: float | None = None


def append_log(run_dir: str, log: StepLog) -> None:
    """Append the step's row (a disk fault is a one-line :class:`gaplan.core.disk.WriteFailed`; a row cut off by
    it is removed again by :func:`truncate_log`)."""
    path = os.path.join(run_dir, TRAIN_LOG_CSV)
    new = not os.path.exists(path) or os.path.getsize(path) == 0  # an emptied log gets its header again
    # A log an older gaplan began (a resumed run) keeps its own columns: a row wider than its header would not read.
    fields = LOG_FIELDS if new else _header(path) or LOG_FIELDS
    text = io.StringIO()
    writer = csv.DictWriter(text, fields, extrasaction="ignore")
    if new:
        writer.writeheader()
    writer.writerow({k: getattr(log, k) for k in LOG_FIELDS})
    with disk_faults_as_one_line(path), open(path, "a", newline="") as handle:
        handle.write(text.getvalue())


def remove_log(run_dir: str) -> None:
    """Remove the folder's log (a new run starts there)."""
    path = os.path.join(run_dir, TRAIN_LOG_CSV)
    if os.path.exists(path):
        os.remove(path)


def _header(path: str) -> list[str] | None:
    """The columns of an existing log (None when it has no header line yet)."""
    with open(path, newline="") as handle:
        header = next(csv.reader(handle), None)
    return header if header and set(header) <= set(LOG_FIELDS) and "step" in header else None


def truncate_log(run_dir: str | None, step: int) -> None:
    """Drop log rows past ``step`` (the checkpoint's: steps a resume redoes, or that no checkpoint kept).

    Rows are appended in step order, so this cuts the file at the end of the last row kept: in place, with no
    room needed (the disk may be full), and a partial row a full disk left is cut with the rows after the step.
    A file out of order (edited by hand) is rewritten atomically instead."""
    path = os.path.join(run_dir or ".", TRAIN_LOG_CSV)
    if not os.path.exists(path):
        return
    if os.path.getsize(path) and _header(path) is None:  # no header to read its rows by: a new log, from here on
        _rewrite(path, [])
        return
    with open(path, "rb") as handle:
        lines = handle.read().split(b"\n")
    keep, in_order, previous = 1, True, 0  # the header line is kept
    for index, line in enumerate(lines[1:-1], start=1):  # the last piece has no newline: empty, or a cut-off row
        first = line.split(b",", 1)[0]
        if not first.isdigit():
            continue
        number = int(first)
        in_order &= number > previous
        previous = number
        if number <= step and in_order:
            keep = index + 1
    if in_order:
        size = sum(len(line) + 1 for line in lines[:keep])
        with disk_faults_as_one_line(path):
            os.truncate(path, min(size, os.path.getsize(path)))
        return
    with open(path, newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("step", "").isdigit() and int(row["step"]) <= step]
    _rewrite(path, rows)


def _rewrite(path: str, rows: list[dict]) -> None:
    """The log with a header and ``rows``, atomically: a crash mid-rewrite must not lose the steps before the
    checkpoint."""
    def write(temp: str) -> None:
        with open(temp, "w", newline="") as handle:
            writer = csv.DictWriter(handle, LOG_FIELDS)
            writer.writeheader()
            writer.writerows(rows)

    atomic_write(path, write)
