"""``gaplan plan``'s outputs: the layouts as a table (pandas), a bar chart of the peak per rank, and the report pages.

Written into the plan's folder: ``layouts.csv``, ``layouts.json``, ``layouts.png``, ``report.md`` and a
self-contained ``report.html``. Made from a :class:`gaplan.plan.layouts.LayoutComparison` alone (no torch).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from gaplan.core.atomic_write import atomic_write, atomic_write_text
from gaplan.core.units import format_bytes
from gaplan.plan.layouts import MACHINERY_LABELS, LayoutComparison, LayoutResult
from gaplan.report.charts import DPI, write_charts
from gaplan.report.document import Block, Bullets, Heading, Image, Paragraph, Table, write_pages
from gaplan.report.formatting import axis_unit, shorten
from gaplan.runs.folder import path_in

LAYOUTS_CSV = "layouts.csv"
LAYOUTS_JSON = "layouts.json"
LAYOUTS_PNG = "layouts.png"
LAYOUTS_STEM = "report"
COLUMNS = ("layout", "precision", "fits", "peak per rank", "B*", "split", "note")
MEASURED_COLUMNS = ("layout", "precision", "fits", "peak per rank", "B*", "split", "samples/s", "estimated B*", "note")


def fits_text(result: LayoutResult) -> str:
    return "-" if result.fits is None else ("yes" if result.fits else "no")


def peak_text(result: LayoutResult) -> str:
    if result.fits:
        return format_bytes(result.peak_bytes or 0)
    if result.fits is False and result.needed_bytes:
        return f"needs {format_bytes(result.needed_bytes)}"
    return "-"


def split_text(result: LayoutResult) -> str:
    """``4 x 2 x 64``: micro-batch x accumulation steps x world size."""
    if not result.fits:
        return "-"
    return f"{result.micro_batch} x {result.grad_accum_steps} x {result.world_size}"


def layouts_frame(comparison: LayoutComparison, note_width: int = 90) -> pd.DataFrame:
    """One row per estimated layout, best first (the pick is the first row that fits). Layouts that were
    not estimated are in :func:`not_estimated_lines`."""
    rows = []
    for result in comparison.ranked:
        if result.fits is None and not result.extra.get("error"):
            continue
        capped = " (cap)" if result.extra.get("capped") else ""
        estimated = result.extra.get("estimated_max_micro_batch")
        rows.append({
            "layout": result.layout.label, "precision": result.precision_label, "fits": fits_text(result),
            "peak per rank": peak_text(result),
            "B*": "-" if result.max_micro_batch is None else f"{result.max_micro_batch}{capped}",
            "split": split_text(result),
            "samples/s": "-" if result.samples_per_s is None else f"{result.samples_per_s:.1f}",
            "estimated B*": "-" if estimated is None else str(estimated),
            "note": shorten(result.note, note_width) if result.note else "",
        })
    # Measured on the device (plan --measure): B*, peak and split are the probe's, samples/s the timed plan's.
    return pd.DataFrame(rows, columns=list(MEASURED_COLUMNS if comparison.measured_on else COLUMNS))


def table_text(frame: pd.DataFrame) -> str:
    """The frame as aligned text, words left-aligned and numbers right-aligned."""
    right = {"peak per rank", "B*", "split", "samples/s", "estimated B*"}
    widths = {c: max([len(c), *(len(str(v)) for v in frame[c])]) for c in frame.columns}

    def cell(column: str, value: object) -> str:
        text = str(value)
        return text.rjust(widths[column]) if column in right else text.ljust(widths[column])

    lines = ["  ".join(cell(c, c) for c in frame.columns).rstrip()]
    lines += ["  ".join(cell(c, row[c]) for c in frame.columns).rstrip() for _, row in frame.iterrows()]
    return "\n".join(lines)


def not_estimated_lines(comparison: LayoutComparison) -> list[str]:
    """One line per reason a layout was not estimated, naming the layouts it applies to."""
    by_note: dict[str, list[str]] = {}
    for result in comparison.results:
        if result.fits is None and not result.extra.get("error"):
            by_note.setdefault(result.note, []).append(f"{result.layout.label} with {result.precision_label}")
    lines = []
    for note, names in by_note.items():
        precisions = {name.split(" with ", 1)[1] for name in names}
        if len(precisions) == 1 and len(names) > 1:
            what = f"{precisions.pop()} ({', '.join(name.split(' with ')[0] for name in names)})"
        else:
            what = "; ".join(names)
        lines.append(f"not estimated: {what}: {note}")
    return lines


def layouts_records(comparison: LayoutComparison) -> list[dict]:
    """The layouts as flat records, numbers as numbers (layouts.csv)."""
    records = []
    for result in comparison.ranked:
        layout = result.layout
        records.append({
            "machinery": layout.machinery, "label": layout.label, "precision": layout.precision,
            "weights_dtype": layout.weights_dtype, "dtype": layout.dtype, "parallel": layout.parallel,
            "grad_checkpointing": layout.grad_checkpointing, "cpu_offload": layout.cpu_offload,
            "grad_sync": layout.grad_sync, "fits": result.fits, "peak_bytes": result.peak_bytes,
            "needed_bytes": result.needed_bytes, "max_micro_batch": result.max_micro_batch,
            "micro_batch": result.micro_batch, "grad_accum_steps": result.grad_accum_steps,
            "world_size": result.world_size, "samples_per_s": result.samples_per_s, "note": result.note,
            "command": result.command,
        })
    return records


def header_line(comparison: LayoutComparison) -> str:
    where = comparison.target or ("a CPU process" if comparison.device_kind == "cpu" else "the given limit")
    ranks = f"{comparison.world_size} x {where}" if comparison.world_size > 1 else where
    nodes = f" on {comparison.nodes} nodes" if comparison.nodes > 1 else ""
    params = f"{comparison.param_count / 1e6:.1f}M parameters, " if comparison.param_count else ""
    return (f"{comparison.model} ({params}seq len {comparison.seq_len}) on {ranks}{nodes}: "
            f"{format_bytes(comparison.usable_bytes)} usable per rank, effective batch {comparison.effective_batch}")


def pick_line(comparison: LayoutComparison) -> str:
    chosen = comparison.pick
    if chosen is None:
        return "pick: none of the layouts fits; more ranks (--world-size, --nodes) or a larger GPU would"
    layout = chosen.layout
    sync = (f", gradients reduce-scattered on {'every' if layout.grad_sync == 'every' else 'the last'} micro-step"
            if layout.parallel == "fsdp" else "")
    speed = f", {chosen.samples_per_s:.1f} samples/s measured: the fastest" if chosen.samples_per_s else ""
    return (f"pick: {MACHINERY_LABELS[layout.machinery]} with {chosen.precision_label}{sync}: micro-batch "
            f"{chosen.micro_batch} x {chosen.grad_accum_steps} accumulation steps x world size {chosen.world_size} "
            f"(B* {chosen.max_micro_batch}, peak {format_bytes(chosen.peak_bytes or 0)} per rank{speed})")


_SHORT = {"ddp": "DDP", "fsdp": "FSDP", "fsdp+ckpt": "FSDP+ckpt", "fsdp+offload": "FSDP+offload"}


def short_label(result: LayoutResult) -> str:
    """``FSDP+ckpt`` over ``fp32 master`` (or ``pure bf16``), for a chart's axis."""
    layout = result.layout
    sync = "\nsync every" if layout.parallel == "fsdp" and layout.grad_sync == "every" else ""
    precision = f"pure {layout.dtype}" if layout.weights_dtype == layout.dtype else f"{layout.weights_dtype} master"
    return f"{_SHORT[layout.machinery]}\n{precision}{sync}"


def layouts_figure(comparison: LayoutComparison) -> Figure:
    """Peak per rank by layout: bars at B* (fits) or at micro-batch 1 (does not fit, hatched), the usable line."""
    shown = [r for r in comparison.results if r.fits is not None]  # in layout order: the machinery, then precision
    chosen = comparison.pick
    peaks = [(r.peak_bytes if r.fits else r.needed_bytes) or 0 for r in shown]
    usable = comparison.usable_bytes
    top = usable * 1.6  # a layout that needs 10x the card would squash the others: clip it, its label says how much
    scale, unit = axis_unit(max([usable, *[min(p, top) for p in peaks], 1]))
    figure = Figure(figsize=(10, 6), dpi=DPI, layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(f"Peak memory per rank by layout: {comparison.model}, world size {comparison.world_size}")
    axes.grid(True, axis="y", alpha=0.3)
    positions = np.arange(len(shown))
    values = [min(p, top) / scale for p in peaks]
    colors = ["tab:orange" if r is chosen else ("tab:blue" if r.fits else "white") for r in shown]
    bars = axes.bar(positions, values, width=0.6, color=colors, edgecolor="black", linewidth=0.6)
    for bar, result, peak in zip(bars, shown, peaks, strict=True):
        if not result.fits:
            bar.set_hatch("//")
        label = f"B* {result.max_micro_batch}" if result.fits else f"needs\n{format_bytes(peak)}"
        axes.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), xytext=(0, 3),
                      textcoords="offset points", ha="center", fontsize=8)
    axes.axhline(usable / scale, color="tab:red", linestyle="--", linewidth=1.2)
    axes.set_xticks(positions, [short_label(r) for r in shown], fontsize=8)
    axes.set_ylabel(f"peak per rank ({unit})")
    axes.set_ylim(0, max([*values, usable / scale]) * 1.2)
    handles = []
    if chosen is not None:
        handles.append(Patch(facecolor="tab:orange", edgecolor="black", label="pick"))
    if any(r.fits and r is not chosen for r in shown):
        handles.append(Patch(facecolor="tab:blue", edgecolor="black", label="fits (peak at B*)"))
    if any(not r.fits for r in shown):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="does not fit (peak at micro-batch 1)"))
    handles.append(Line2D([], [], color="tab:red", linestyle="--", label=f"usable per rank {format_bytes(usable)}"))
    figure.legend(handles=handles, loc="outside lower center", ncols=2)
    return figure


def layout_blocks(comparison: LayoutComparison, images: list[str]) -> list[Block]:
    frame = layouts_frame(comparison, note_width=160)
    chosen = comparison.pick
    blocks: list[Block] = [Heading(1, f"gaplan plan: {comparison.model}"), Paragraph(header_line(comparison)),
                           Paragraph(pick_line(comparison))]
    if chosen is not None and chosen.command:
        blocks.append(Paragraph(f"Launch: `{chosen.command}`"))
    blocks += [Heading(2, "Layouts"),
               Table(list(frame.columns), frame.astype(str).values.tolist(), right_aligned=frozenset({3, 4, 5}))]
    skipped = not_estimated_lines(comparison)
    if skipped:
        blocks.append(Bullets(skipped))
    blocks.append(Bullets([
        "Each layout is one `gaplan estimate` (one rank traced on fake tensors); the peak is per rank, at B* "
        "(or at micro-batch 1 when it does not fit).",
        "The effective batch is the same for every layout: only its split (micro-batch x accumulation steps x "
        "world size) changes.",
        "Pick: the fewest accumulation steps (the largest usable micro-batch); on a tie the finer precision (fp32 "
        "master weights), then the least memory-saving machinery (DDP, FSDP, FSDP + checkpointing, FSDP + CPU "
        "offload). A layout timed on real hardware would be ranked by its samples/s first.",
    ]))
    for name in images:
        blocks += [Heading(2, "Peak memory per rank"), Image(name, "peak memory per rank by layout")]
    return blocks


def write_layout_report(out_dir: str, comparison: LayoutComparison) -> list[str]:
    """layouts.csv, layouts.json, layouts.png, report.md and report.html in ``out_dir``; returns their names."""
    import os

    os.makedirs(out_dir, exist_ok=True)
    frame = pd.DataFrame(layouts_records(comparison))
    atomic_write(path_in(out_dir, LAYOUTS_CSV), lambda path: frame.to_csv(path, index=False))
    atomic_write_text(path_in(out_dir, LAYOUTS_JSON), json.dumps(comparison.to_dict(), indent=2))
    written = [LAYOUTS_CSV, LAYOUTS_JSON]
    images = write_charts(out_dir, [(LAYOUTS_PNG, layouts_figure(comparison))]) if any(
        r.fits is not None for r in comparison.results) else {}
    written += list(images)
    written += write_pages(out_dir, layout_blocks(comparison, list(images)), f"gaplan plan: {comparison.model}", images,
                           LAYOUTS_STEM)
    return sorted(written)
