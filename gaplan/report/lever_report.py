"""The lever table of ``gaplan plan`` on one device: as text, levers.csv, levers.json and levers.md/html."""

from __future__ import annotations

import json

import pandas as pd

from gaplan.core.atomic_write import atomic_write, atomic_write_text
from gaplan.core.units import format_bytes
from gaplan.plan.lever_pick import MODEL_TIE, LeverComparison, LeverResult
from gaplan.plan.levers import Base
from gaplan.plan.split import split_evenly, split_text
from gaplan.report.document import Bullets, Heading, Paragraph, Table, write_pages
from gaplan.runs.folder import LEVERS_CSV, LEVERS_JSON, LEVERS_STEM, path_in

COLUMNS = ("levers", "fits", "B*", "split", "steps", "peak", "time (model)", "samples/s", "note")
NUMBER_COLUMNS = frozenset({"B*", "steps", "peak", "time (model)", "samples/s"})
COST_MODEL = ("time (model): one optimizer step's modelled time over the base row's: forward + backward + recompute "
              "(one more forward of the checkpointed blocks, of the LM head for the chunked loss) at {source}, plus "
              "each micro-step's weight and gradient traffic, the optimizer's passes over its states and, offloading, "
              "the saved tensors' trips to the host and back (gaplan.plan.lever_cost; docs/levers.md)")


def base_text(base: Base) -> str:
    """The base row's settings in words."""
    return (f"--optimizer {base.optimizer}, --loss {base.loss}, checkpointing "
            f"{'on' if base.grad_checkpointing else 'off'}" + (", activations offloaded" if base.offload_activations
                                                                else "") + (", compiled" if base.compile else ""))


def split_of(comparison: LeverComparison, result: LeverResult) -> str:
    """The row's split of E (``5,5,5 x 1`` style, as the layouts write it), ``-`` when it does not fit."""
    if not result.fits or not result.grad_accum_steps:
        return "-"
    return split_text(split_evenly(comparison.effective_batch, result.grad_accum_steps))


def measured_text(result: LeverResult) -> str:
    if result.samples_per_s is None:
        return "-"
    if result.samples_per_s_low is None:
        return f"{result.samples_per_s:.1f}"
    return f"{result.samples_per_s:.1f} [{result.samples_per_s_low:.1f}-{result.samples_per_s_high:.1f}]"


def lever_records(comparison: LeverComparison) -> list[dict]:
    """One dict a row, by :data:`COLUMNS`."""
    records = []
    for result in comparison.results:
        relative = comparison.relative_time(result)
        records.append({
            "levers": result.label,
            "fits": {True: "yes", False: "no", None: "not estimated"}[result.fits],
            "B*": (f"{result.max_micro_batch} (cap)" if result.extra.get("capped") else result.max_micro_batch)
            if result.fits else "-",
            "split": split_of(comparison, result),
            "steps": result.grad_accum_steps if result.fits else "-",
            "peak": format_bytes(result.peak_bytes) if result.fits and result.peak_bytes else "-",
            "time (model)": f"{relative:.2f}x" if relative is not None else "-",
            "samples/s": measured_text(result),
            "note": result.note,
        })
    return records


def table_text(comparison: LeverComparison) -> str:
    """The table as aligned text, numbers right-aligned."""
    records = lever_records(comparison)
    widths = {c: max([len(c), *(len(str(r[c])) for r in records)]) for c in COLUMNS}

    def cell(column: str, value: object) -> str:
        text = str(value)
        return text.rjust(widths[column]) if column in NUMBER_COLUMNS else text.ljust(widths[column])

    lines = ["  ".join(cell(c, c) for c in COLUMNS).rstrip()]
    lines += ["  ".join(cell(c, r[c]) for c in COLUMNS).rstrip() for r in records]
    return "\n".join(lines)


def header_line(comparison: LeverComparison) -> str:
    where = comparison.target or comparison.device_kind
    return (f"levers for {comparison.model} on one device ({where}, {format_bytes(comparison.usable_bytes)} for "
            f"tensors), E = {comparison.effective_batch}; base: {base_text(comparison.base)}")


def pick_lines(comparison: LeverComparison) -> list[str]:
    """The pick, why, and what it trades; or why there is none."""
    chosen = comparison.pick
    if chosen is None:
        return ["lever pick: none of the rows fits"]
    least = min((r.model_seconds for r in comparison.results if r.fits and r.model_seconds is not None), default=None)
    how = ("the fastest measured" if chosen.samples_per_s is not None else
           "the least modelled time" if chosen.model_seconds is None or chosen.model_seconds == least else
           f"within {MODEL_TIE:.0%} of the least modelled time, with fewer levers")
    lines = [f"lever pick: {chosen.label} ({how}): B* {chosen.max_micro_batch}, {chosen.grad_accum_steps} "
             f"accumulation step(s) for E = {comparison.effective_batch}, peak {format_bytes(chosen.peak_bytes or 0)}"]
    lines += [f"  trade-off: {line}" for line in comparison.tradeoffs(chosen)]
    near = comparison.within_interval()
    if near:
        lines.append("  within the bench's 95% interval of the pick (no faster, no slower, as measured): "
                     + ", ".join(r.label for r in near))
    return lines


def not_compared_lines(comparison: LeverComparison) -> list[str]:
    lines = [f"not compared: {name}: {why}" for name, why in comparison.not_compared]
    if any(r.fits and r.extra.get("capped") for r in comparison.results):
        lines.append("(cap): B* reached the effective batch; a larger micro-batch may fit but is never used")
    return lines


def cost_line(comparison: LeverComparison) -> str:
    return COST_MODEL.format(source=comparison.cost_source)


def report_dict(comparison: LeverComparison) -> dict:
    return comparison.to_dict() | {"cost_model": cost_line(comparison)}


def write_lever_report(out_dir: str, comparison: LeverComparison) -> list[str]:
    """levers.csv, levers.json, levers.md and levers.html in ``out_dir``; returns their names."""
    import os

    os.makedirs(out_dir, exist_ok=True)
    records = lever_records(comparison)
    atomic_write(path_in(out_dir, LEVERS_CSV), lambda path: pd.DataFrame(records, columns=list(COLUMNS)).to_csv(
        path, index=False))
    atomic_write_text(path_in(out_dir, LEVERS_JSON), json.dumps(report_dict(comparison), indent=2))
    right = frozenset(i for i, c in enumerate(COLUMNS) if c in NUMBER_COLUMNS)
    blocks = [Heading(1, f"gaplan plan: the levers of {comparison.model}"), Paragraph(header_line(comparison)),
              Table(list(COLUMNS), [[str(r[c]) for c in COLUMNS] for r in records], right),
              Bullets(pick_lines(comparison) + not_compared_lines(comparison) + [cost_line(comparison)])]
    written = [LEVERS_CSV, LEVERS_JSON]
    written += write_pages(out_dir, blocks, f"gaplan plan levers: {comparison.model}", {}, LEVERS_STEM)
    return sorted(written)
