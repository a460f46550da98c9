"""The report's throughput section: each split's rate and ratio with their 95% intervals, the verdict, the noise.

It says how sure the numbers are (intervals, rounds, why timing stopped), what the machine was doing (contention)
and how the splits were timed (as training runs, or under a budget's allocator settings).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from gaplan.core.constants import LARGE_BATCH_KIND
from gaplan.core.lines import interval_text, step_peak
from gaplan.report.document import Block, Heading, Image, Paragraph, Table
from gaplan.report.formatting import byte_size, failure_reason, integer, is_false, missing, rate, yes_no
from gaplan.report.load import RunData, measured, ratio, reference_label, reference_row
from gaplan.runs.folder import THROUGHPUT_PNG

_OOM_NOTE = "out of memory: "  # how bench notes a split that ran out of memory, followed by the allocator's message

NATIVE_TIMING = ("Splits were timed as training runs them: no budget bound and the allocators as a user's own loop "
                 "has them (glibc's mmap threshold free, MKL's memory pool on). Whether a split fits is the probe's "
                 "answer: its micro-batches are at most B\\*.")
BUDGET_TIMING = ("Splits were timed under the budget's allocator settings (glibc's mmap threshold pinned at 64 KiB, "
                 "MKL's memory pool off), as a run with `--enforce-memory-limit` trains: every large tensor is its "
                 "own mapping with fresh page faults, which slows larger micro-batches most.")
PEAK_MEANING = ("**Peak (step)** is the probe's peak at the split's micro-batch, under the budget (its trial's, "
                "else from the memory line): the peak the plan and a budgeted run have. **Resident peak while "
                "timing** is a second figure: the same high-water mark (anonymous resident memory above the "
                "baseline) in the timing run, which ran without the budget's allocator settings, so freed memory "
                "stayed in glibc's heap and it reads above the peak (step), as plain training's does.")


def _note(text: str) -> str:
    if text.startswith(_OOM_NOTE):
        return failure_reason(text[len(_OOM_NOTE):], None)
    return text


def _with_interval(value: object, low: object, high: object, number: str, suffix: str = "") -> str:
    if missing(value):
        return "-"
    return number.format(float(value)) + suffix + interval_text(None if missing(low) else float(low),
                                                                 None if missing(high) else float(high), number)


def _peaks(row: pd.Series) -> list[str]:
    """The probe's peak (step) and the timing run's resident peak; an older file's peak was taken under the budget
    (then it is the peak (step)) or, for a reference run, without it."""
    timed_under_budget = not missing(row["bounded"]) and not is_false(row["bounded"])
    step = step_peak(None if missing(row["probe_peak_bytes"]) else row["probe_peak_bytes"], row["peak_bytes"],
                     timed_under_budget)
    return [byte_size(step), "-" if timed_under_budget else byte_size(row["peak_bytes"])]


def _fits(row: pd.Series, probed: bool) -> str:
    if not probed and row["kind"] == LARGE_BATCH_KIND and measured(row):
        return "unknown (no probe)"
    return yes_no(row["fits_budget"])


def throughput_section(run: RunData, images: Sequence[str]) -> list[Block]:
    frame = run.throughput
    assert frame is not None
    reference = reference_row(frame)
    rows = []
    for _, row in frame.iterrows():
        row_ratio = ratio(row, reference)
        step = "-" if missing(row["step_seconds_median"]) else f"{float(row['step_seconds_median']):.3f}"
        ratio_text = "-" if row_ratio is None else _with_interval(row_ratio, row["ratio_low"], row["ratio_high"],
                                                                  "{:.2f}", "x")
        rows.append([row["split"], row["kind"], f"{integer(row['micro_batch'])} x {integer(row['grad_accum_steps'])}",
                     integer(row["effective_batch"]),
                     _with_interval(row["samples_per_s"], row["samples_per_s_low"], row["samples_per_s_high"],
                                    "{:,.1f}"),
                     ratio_text, rate(row["tokens_per_s"]), step, integer(row["rounds"]), *_peaks(row),
                     _fits(row, run.probed), _note(row["note"])])
    blocks: list[Block] = [Heading(2, "Throughput")]
    summary = run.bench or {}
    if summary.get("verdict"):
        blocks.append(Paragraph(f"**Verdict:** {summary['verdict']}."))
    if THROUGHPUT_PNG in images:
        blocks.append(Image(THROUGHPUT_PNG, "Throughput by split"))
    if reference is not None:
        blocks.append(Paragraph(f"Ratios are samples/s relative to the {reference_label(reference, run.probed)}"
                                f" ({reference['split']}), taken round by round; intervals are 95% confidence "
                                "intervals over the rounds."))
    if summary.get("rounds"):
        blocks.append(Paragraph(f"**Rounds:** {integer(summary['rounds'])}, interleaved (each round times every split "
                                "once, in a fresh process, warm-up steps untimed); timing stopped at "
                                f"{summary.get('stopped_because') or 'the last round'}."))
    if summary.get("contention"):
        label = "**Contention:**" if summary.get("contended") else "**Machine:**"
        blocks.append(Paragraph(f"{label} {summary['contention']}"))
    bounded = [not is_false(value) for value in frame["bounded"] if not missing(value)]
    if bounded and all(bounded):
        blocks.append(Paragraph(BUDGET_TIMING))
    elif bounded and not any(bounded) and summary:
        blocks.append(Paragraph(NATIVE_TIMING))
    blocks.append(Paragraph(PEAK_MEANING + " Tokens/s count every position of the bench's full-length samples "
                            "(padded tokens/s; with no padding, all are real tokens)."))
    blocks.append(Table(["split", "kind", "micro x accum", "effective batch", "samples/s (95% CI)",
                         "ratio (95% CI)", "padded tokens/s", "step s (median)", "rounds", "peak (step)",
                         "resident peak while timing", "fits budget", "note"], rows, frozenset(range(3, 11))))
    return blocks
