"""The training report's own parts: its title, the training section (gaplan's claim checked, peaks, tokens/s).

A folder with a ``train_log.csv`` is a training run: its report is titled as one and leads with the training
(:func:`gaplan.report.sections.report_blocks`). Older folders still read: their log has no ``step_peak_bytes`` or
``padded_tokens_per_s`` and no ``loss_check.json``, and the section shows what they have.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from gaplan.core.units import format_bytes
from gaplan.report.document import Block, Bullets, Heading, Image, Paragraph, Table
from gaplan.report.formatting import byte_size, integer, loss, rate
from gaplan.report.load import RunData
from gaplan.runs.folder import TRAINING_PNG

# The probe's trial table calls its peak "peak (step)"; training logs and shows the same figure under that name.
STEP_PEAK_LABEL = "peak (step)"
PROCESS_PEAK_LABEL = "whole-process resident peak"
PROCESS_PEAK_WHY = ("It is more than the peak (step) because it also counts the interpreter, the libraries, the "
                    "data and the model code loaded before the baseline the probe's peak and the budget start from.")
TIMED_UNDER_BUDGET = ("**Timing:** under the budget's allocator settings (`--enforce-memory-limit`: glibc's mmap "
                      "threshold pinned, MKL's pool off), which slow large tensors; a run without it is faster")
TIMED_NATIVE = ("**Timing:** with the allocators as a plain loop has them (no budget bound, no mmap-threshold pin; "
                "under `gaplan train`, MKL's pool on)")
MAX_STEP_ROWS = 50  # a longer run's steps are in train_log.csv and the chart


def report_title(run: RunData) -> str:
    return f"gaplan training report: {run.model}" if run.is_training else f"gaplan report: {run.model}"


def loss_check_item(check: dict[str, Any]) -> str:
    """gaplan's claim on this run: step 1 accumulated against the same samples as one batch, or why not checked."""
    name = f"**Accumulated loss vs one large batch (step {integer(check.get('step') or 1)}):**"
    if check.get("skipped"):
        return f"{name} not checked: {check['skipped']}"
    relative = check.get("relative_difference")
    steps = check.get("micro_steps")
    over = f" over {integer(steps)} micro-step{'s' if steps != 1 else ''}" if steps else ""
    return (f"{name} {float(check['accumulated_loss']):.6f} accumulated{over}, "
            f"{float(check['large_batch_loss']):.6f} as one batch of {integer(check.get('samples'))} samples "
            f"(forward only, same weights, loss summed over the step's targets and divided by their number): "
            f"difference {float(check['absolute_difference']):.2e}"
            + ("" if relative is None else f" ({float(relative):.2e} relative)"))


def _column(log: pd.DataFrame, name: str) -> pd.Series:
    """A log column, all NA when an older log lacks it."""
    return log[name] if name in log.columns else pd.Series([pd.NA] * len(log), index=log.index, dtype="Float64")


def _has(values: pd.Series) -> bool:
    return bool(values.notna().any()) and bool((values.fillna(0) > 0).any())


def throughput_item(log: pd.DataFrame) -> str:
    """Median samples/s, real tokens/s (attention mask) and padded tokens/s (positions fed), each labelled."""
    parts = [f"{rate(log['samples_per_s'].median())} samples/s"]
    if _has(log["tokens_per_s"]):
        parts.append(f"{rate(log['tokens_per_s'].median())} real tokens/s (attention-mask tokens, padding excluded)")
    padded = _column(log, "padded_tokens_per_s")
    if _has(padded):
        parts.append(f"{rate(padded.median())} padded tokens/s (token positions fed, padding included, as the "
                     "throughput table counts them)")
    return "**Median throughput:** " + ", ".join(parts)


def peak_items(run: RunData, log: pd.DataFrame) -> list[str]:
    """The probe's peak of the steps and, where it differs, the whole process's, each named as such."""
    items = []
    step_peaks, process_peaks = _column(log, "step_peak_bytes"), _column(log, "peak_bytes")
    budget = run.budget
    if step_peaks.notna().any():
        peak = int(step_peaks.max())
        if run.enforced_budget is False:
            # Nothing bound the run: glibc kept freed memory resident, so the same measure reads higher than the
            # probe's trials (which pin the allocator as the budget needs).
            items.append(f"**Peak (step):** {byte_size(peak)}, the largest over the steps: the probe's measure (above "
                         "the baseline), taken with no budget bound and the allocators as a plain loop has them, so "
                         "freed memory stayed resident and it reads above the probe's peak at this micro-batch (the "
                         "plan section gives that one; `--enforce-memory-limit` trains as the probe measures)")
        else:
            share = f" of the {format_bytes(budget)} budget ({peak / budget:.0%})" if budget else ""
            items.append(f"**Peak (step):** {byte_size(peak)}{share}, the largest over the steps, measured as the "
                         "probe measures its trials (above the baseline taken when the budget was set)")
    differs = (process_peaks.astype("Float64").fillna(-1) != step_peaks.astype("Float64").fillna(-1)).any()
    if process_peaks.notna().any() and differs:  # on CUDA both are the allocator's peak: one line is enough
        items.append(f"**Whole-process resident peak:** {byte_size(process_peaks.max())}. {PROCESS_PEAK_WHY}")
    return items


def noise_item(run: RunData, log: pd.DataFrame) -> str | None:
    """The last step's smoothed gradient noise scale, and what it says of the effective batch."""
    from gaplan.plan.goodput import noise_scale_summary

    values = _column(log, "noise_scale").dropna()
    plan = run.plan.get("plan") or {}
    # The batch the last measured step trained (a schedule's, a token-counted step's samples), else the plan's
    trained = _column(log, "effective_batch")[values.index].dropna() if not values.empty else values
    effective = trained.iloc[-1] if not trained.empty else plan.get("effective_batch")
    if values.empty or not effective:
        return None
    summary = noise_scale_summary(int(effective), float(values.iloc[-1]), int(plan.get("world_size") or 1))
    return f"**Gradient noise scale:** {summary} (measured on {len(values)} steps; docs/noise-scale.md)"


def steps_table(log: pd.DataFrame) -> Table:
    """One row per step: loss, speeds and both peaks (the memory over the steps)."""
    headers = ["step", "loss", "samples/s", "real tokens/s", "padded tokens/s", STEP_PEAK_LABEL, PROCESS_PEAK_LABEL]
    padded, step_peaks = _column(log, "padded_tokens_per_s"), _column(log, "step_peak_bytes")
    rows = [[integer(row["step"]), loss(row["loss"]), rate(row["samples_per_s"]), rate(row["tokens_per_s"]),
             rate(padded[index]), byte_size(step_peaks[index]), byte_size(row["peak_bytes"])]
            for index, row in log.iterrows()]
    return Table(headers, rows, frozenset(range(len(headers))))


def training_section(run: RunData, images: Sequence[str]) -> list[Block]:
    log = run.train_log
    assert log is not None
    if log.empty:  # stopped before its first step ended: the log has its header only
        return [Heading(2, "Training"), Paragraph("No step logged: the run stopped before its first step ended.")]
    first, last = log.iloc[0], log.iloc[-1]
    unfinished = run.steps_total is not None and int(last["step"]) < run.steps_total
    items = [f"**Steps:** {len(log)} logged (steps {integer(first['step'])} to {integer(last['step'])})"
             + (f" of {run.steps_total}: the run stopped there (`gaplan train --resume {run.directory}` goes on)"
                if unfinished else ""),
             f"**Loss:** {loss(first['loss'])} at the first step, {loss(last['loss'])} at the last"]
    if run.loss_check is not None:
        items.append(loss_check_item(run.loss_check))
    items.append(throughput_item(log))
    if run.enforced_budget is not None:
        items.append(TIMED_UNDER_BUDGET if run.enforced_budget else TIMED_NATIVE)
    items += peak_items(run, log)
    noise = noise_item(run, log)
    if noise:
        items.append(noise)
    micro = log["micro_batch"].dropna().astype("int64").tolist()
    changes = [m for i, m in enumerate(micro) if i == 0 or m != micro[i - 1]]
    if len(changes) > 1:  # the training loop halves the micro-batch after an OOM
        items.append(f"**Micro-batch changed during training:** {' -> '.join(map(str, changes))}")
    blocks: list[Block] = [Heading(2, "Training")]
    if TRAINING_PNG in images:
        blocks.append(Image(TRAINING_PNG, "Loss, throughput, peak memory and the gradient noise scale over steps"))
    blocks.append(Bullets(items))
    if len(log) <= MAX_STEP_ROWS:
        blocks += [Paragraph("Each step, as in `train_log.csv`:"), steps_table(log)]
    return blocks
