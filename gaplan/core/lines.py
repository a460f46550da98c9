"""One-line renderings of a trial and of a throughput row, shared by the CLI's output and progress. No torch."""

from __future__ import annotations

from typing import Any

from gaplan.core.trial import Trial
from gaplan.core.units import format_bytes


def trial_line(trial: Trial) -> str:
    """``micro-batch 35  fits  peak 1014.30 MiB  13.25 s`` (an OOM says at which optimizer step)."""
    verdict = "fits" if trial.fits else "OOM "
    where = f"  (out of memory at optimizer step {trial.completed_steps + 1})" if not trial.fits else ""
    if trial.fits and trial.completed_steps == 1:
        where = "  (1 optimizer step)"  # in a probe of two-step trials: a sketch that only draws the memory line
    return (f"  micro-batch {trial.micro_batch:>6}  {verdict}  peak {format_bytes(trial.peak_bytes):>10}  "
            f"{trial.seconds:7.2f} s{where}")


THROUGHPUT_HEADER = (f"  {'split':>18}  {'samples/s (95% CI)':<24}  {'x large batch (95% CI)':<22}  "
                     f"{'peak (step)':>11}")


def throughput_line(row: Any) -> str:
    """A bench row (:class:`gaplan.benchmark.splits.SplitMeasurement`) under :data:`THROUGHPUT_HEADER`: split,
    samples/s and ratio with their 95% intervals, peak, note."""
    speed = f"{row.samples_per_s:8.1f}{interval_text(row.samples_per_s_low, row.samples_per_s_high, '{:.1f}')}" \
        if row.samples_per_s else f"{'-':>8}{'':<16}"
    ratio = (f"x{row.ratio_to_large_batch:5.2f}{interval_text(row.ratio_low, row.ratio_high, '{:.2f}')}"
             if row.ratio_to_large_batch else f"{'':<22}")
    note = f"  {row.note}" if row.note else ""
    peak = step_peak(getattr(row, "probe_peak_bytes", None), row.peak_bytes, row.bounded)
    return f"  {row.split:>18}  {speed:<24}  {ratio:<22}  {format_bytes(peak):>11}{note}"


def step_peak(probe_peak: int | None, timing_peak: int | None, timed_under_budget: bool) -> int | None:
    """A bench row's peak (step): the probe's at its micro-batch (its trial's, else its memory line's); else the
    timing run's, where it ran under the budget (then it is one); else none (a resident peak timed without the
    budget is another measure: the report shows it in its own column)."""
    return probe_peak if probe_peak is not None else (timing_peak if timed_under_budget else None)


# An interval wider than this factor says nothing (two rounds: one degree of freedom, t = 12.7): not printed as
# numbers such as (0.0-11349543758.0).
WIDE_INTERVAL = 10.0
TOO_WIDE = " (CI too wide)"  # fits the column; docs/bench-and-reports.md says why: time more rounds


def interval_text(low: float | None, high: float | None, number: str) -> str:
    """`` (low-high)`` in ``number``'s format; nothing where either end is missing (None, NaN), :data:`TOO_WIDE`
    where it spans more than :data:`WIDE_INTERVAL` times."""
    if low is None or high is None or low != low or high != high:
        return ""
    if _too_wide(low, high):
        return TOO_WIDE
    return f" ({number.format(low)}-{number.format(high)})"


def ci_words(low: float, high: float) -> str:
    """``95% CI 0.61-1.86``, or ``CI too wide`` where the interval spans more than :data:`WIDE_INTERVAL` times (the
    rule :func:`interval_text` keeps in the tables, for the sentences: a verdict, the fastest split)."""
    return "CI too wide" if _too_wide(low, high) else f"95% CI {low:.2f}-{high:.2f}"


def _too_wide(low: float, high: float) -> bool:
    """An interval that says nothing: its ends more than :data:`WIDE_INTERVAL` times apart (or one at 0)."""
    return low <= 0 or high > WIDE_INTERVAL * low


def histogram_lines(histogram: Any, width: int = 40) -> list[str]:
    """A text histogram of ``(from, to, samples)`` rows: ``    4-29   ########  1719``."""
    rows = [tuple(int(v) for v in row) for row in histogram]
    most = max((n for _, _, n in rows), default=0) or 1
    label = max(len(f"{low}-{high}") for low, high, _ in rows) if rows else 0
    return [f"  {f'{low}-{high}':>{label}}  {'#' * (max(1, round(n / most * width)) if n else 0):<{width}}  {n}"
            for low, high, n in rows]


def token_bench_lines(rows: Any) -> list[str]:
    """bench --batch-by tokens: a plan a line (samples/s, real tokens/s, padding, micro-steps, peak, ratio)."""
    header = (f"  {'plan':<20}  {'samples/s':>10}  {'real tokens/s':>13}  {'padding':>8}  {'micro-steps':>11}  "
              f"{'process peak':>12}  {'tokens/s ratio':>14}")
    lines = [header]
    for row in rows:
        lines.append(f"  {row['split']:<20}  {_number(row, 'samples_per_s', '{:.1f}'):>10}  "
                     f"{_number(row, 'tokens_per_s', '{:,.0f}'):>13}  {_number(row, 'padding_fraction', '{:.1%}'):>8}  "
                     f"{_number(row, 'micro_steps_mean', '{:.1f}'):>11}  {format_bytes(row.get('peak_bytes')):>12}  "
                     f"{_number(row, 'tokens_ratio', '{:.2f}x'):>14}")
    return lines


def _number(row: dict, key: str, text: str) -> str:
    return "-" if row.get(key) is None else text.format(row[key])
