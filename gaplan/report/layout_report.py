"""``gaplan plan``'s outputs: the layouts as a table (pandas), a bar chart of the peak per rank, and the report pages.

Written into the plan's folder: ``layouts.csv``, ``layouts.json``, ``layouts.png``, ``report.md`` and a
self-contained ``report.html``. Made from a :class:`gaplan.plan.layouts.LayoutComparison` alone (no torch).
Text is cut to a width only on the terminal (``note_width``); the saved files always hold all of it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from gaplan.core.atomic_write import atomic_write, atomic_write_text
from gaplan.core.units import format_bytes
from gaplan.plan.layouts import (
    MACHINERY_LABELS,
    NEAR_LIMIT,
    Layout,
    LayoutComparison,
    LayoutResult,
    edge_peak,
    format_split,
    near_limit,
    split_sizes,
)
from gaplan.report.charts import DPI, write_charts
from gaplan.report.document import Block, Bullets, Heading, Image, Paragraph, Table, write_pages
from gaplan.runs.folder import LAYOUTS_CSV, LAYOUTS_JSON, LAYOUTS_PNG, REPORT_STEM, path_in

COLUMNS = ("layout", "precision", "fits", "split", "peak per rank", "B*", "peak at B*", "note")
MEASURED_COLUMNS = ("layout", "precision", "fits", "split", "peak per rank", "B*", "peak at B*", "samples/s",
                    "estimated B*", "note")
NUMBER_COLUMNS = frozenset({"split", "peak per rank", "B*", "peak at B*", "samples/s", "estimated B*"})
# layouts.csv columns that hold counts: written as integers (pandas would write 22.0 beside an empty cell).
INTEGER_FIELDS = ("peak_bytes", "edge_peak_bytes", "needed_bytes", "max_micro_batch", "micro_batch",
                  "grad_accum_steps", "world_size")
LOG_SCALE_RATIO = 10.0  # bars (and the usable line) further apart than this are drawn on a log axis


def cut(text: str, width: int | None) -> str:
    """One line of at most ``width`` characters (cut with '...'); the whole text when ``width`` is None."""
    text = " ".join(text.split())
    return text if width is None or len(text) <= width else text[: width - 3] + "..."


def fits_text(result: LayoutResult) -> str:
    return "-" if result.fits is None else ("yes" if result.fits else "no")


def peak_text(result: LayoutResult) -> str:
    """The peak at the plan's micro-batch (fits), or what micro-batch 1 needs (does not fit)."""
    if result.fits:
        return format_bytes(result.peak_bytes or 0)
    if result.fits is False and result.needed_bytes:
        return f"needs {format_bytes(result.needed_bytes)}"
    return "-"


def edge_peak_text(result: LayoutResult) -> str:
    peak = edge_peak(result)
    return format_bytes(peak) if result.fits and peak else "-"


def layouts_frame(comparison: LayoutComparison, note_width: int | None = 90) -> pd.DataFrame:
    """One row per estimated layout, best first (the pick is the first row that fits). Layouts that were
    not estimated are in :func:`not_estimated_lines`. ``note_width=None`` keeps the notes whole (saved files)."""
    rows = []
    for result in comparison.ranked:
        if result.fits is None and not result.extra.get("error"):
            continue
        capped = " (cap)" if result.extra.get("capped") else ""
        estimated = result.extra.get("estimated_max_micro_batch")
        rows.append({
            "layout": result.layout.label, "precision": result.precision_label, "fits": fits_text(result),
            "split": comparison.split(result), "peak per rank": peak_text(result),
            "B*": "-" if result.max_micro_batch is None else f"{result.max_micro_batch}{capped}",
            "peak at B*": edge_peak_text(result),
            "samples/s": "-" if result.samples_per_s is None else f"{result.samples_per_s:.1f}",
            "estimated B*": "-" if estimated is None else str(estimated),
            "note": cut(result.note, note_width) if result.note else "",
        })
    # Measured on the device (plan --measure): B*, peak and split are the probe's, samples/s the timed plan's.
    return pd.DataFrame(rows, columns=list(MEASURED_COLUMNS if comparison.measured_on else COLUMNS))


def table_text(frame: pd.DataFrame) -> str:
    """The frame as aligned text, words left-aligned and numbers right-aligned."""
    widths = {c: max([len(c), *(len(str(v)) for v in frame[c])]) for c in frame.columns}

    def cell(column: str, value: object) -> str:
        text = str(value)
        return text.rjust(widths[column]) if column in NUMBER_COLUMNS else text.ljust(widths[column])

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
            "grad_sync": layout.grad_sync, "fits": result.fits, "split": comparison.split(result),
            "micro_batch_sizes": ",".join(str(s) for s in comparison.sizes(result)),
            "peak_bytes": result.peak_bytes, "edge_peak_bytes": edge_peak(result),
            "needed_bytes": result.needed_bytes, "max_micro_batch": result.max_micro_batch,
            "micro_batch": result.micro_batch, "grad_accum_steps": result.grad_accum_steps,
            "world_size": result.world_size, "samples_per_s": result.samples_per_s, "note": result.note,
            "command": result.command, "check_command": result.check_command,
        })
    return records


def records_frame(comparison: LayoutComparison) -> pd.DataFrame:
    """:func:`layouts_records` as a frame whose count columns stay integers beside missing values."""
    frame = pd.DataFrame(layouts_records(comparison))
    return frame.astype({name: "Int64" for name in INTEGER_FIELDS if name in frame.columns})


def header_line(comparison: LayoutComparison) -> str:
    where = comparison.target or ("a CPU process" if comparison.device_kind == "cpu" else "the given limit")
    ranks = f"{comparison.world_size} x {where}" if comparison.world_size > 1 else where
    nodes = f" on {comparison.nodes} nodes" if comparison.nodes > 1 else ""
    params = f"{comparison.param_count / 1e6:.1f}M parameters, " if comparison.param_count else ""
    margin = f" ({comparison.margin:.0%} of the limit kept free: --margin)" if comparison.margin else ""
    return (f"{comparison.model} ({params}seq len {comparison.seq_len}) on {ranks}{nodes}: "
            f"{format_bytes(comparison.usable_bytes)} usable per rank{margin}, effective batch "
            f"{comparison.effective_batch}")


def split_words(comparison: LayoutComparison, result: LayoutResult) -> str:
    """``split 22,21,21 x 8 = 512 (3 accumulation steps of micro-batches 22, 21, 21 on each of 8 ranks)``."""
    sizes = comparison.sizes(result)
    if len(set(sizes)) == 1:
        how = (f"micro-batch {sizes[0]} x {len(sizes)} accumulation steps x world size {result.world_size}")
    else:
        how = (f"{len(sizes)} accumulation steps of micro-batches {', '.join(str(s) for s in sizes)} on each of "
               f"{result.world_size} rank(s)")
    return f"split {comparison.split(result)} = {comparison.effective_batch} ({how})"


def pick_line(comparison: LayoutComparison) -> str:
    chosen = comparison.pick
    if chosen is None:
        return "pick: none of the layouts fits; more ranks (--world-size, --nodes) or a larger GPU would"
    layout = chosen.layout
    sync = (f", gradients reduce-scattered on {'every' if layout.grad_sync == 'every' else 'the last'} micro-step"
            if layout.parallel == "fsdp" else "")
    speed = f", {chosen.samples_per_s:.1f} samples/s measured: the fastest" if chosen.samples_per_s else ""
    at_edge = edge_peak(chosen)
    if chosen.micro_batch == chosen.max_micro_batch or not at_edge:
        edge = f"B* {chosen.max_micro_batch}"
    else:
        edge = f"B* {chosen.max_micro_batch} peaks at {format_bytes(at_edge)}"
    return (f"pick: {MACHINERY_LABELS[layout.machinery]} with {chosen.precision_label}{sync}: "
            f"{split_words(comparison, chosen)}; peak {format_bytes(chosen.peak_bytes or 0)} per rank at micro-batch "
            f"{chosen.micro_batch} ({edge}{speed})")


def caveat_lines(comparison: LayoutComparison) -> list[str]:
    """For an estimated pick that peaks within :data:`NEAR_LIMIT` of the usable memory: what it risks, the
    ``--margin`` that keeps headroom, and the ``gaplan probe`` that checks it on the hardware."""
    chosen = comparison.pick
    if chosen is None or comparison.margin >= NEAR_LIMIT or not near_limit(chosen, comparison.usable_bytes):
        return _bf16_caveat(comparison)
    share = (chosen.peak_bytes or 0) / comparison.usable_bytes
    lines = [f"caveat: the pick's peak, {format_bytes(chosen.peak_bytes)} per rank, is {share:.1%} of the "
             f"{format_bytes(comparison.usable_bytes)} usable: within {NEAR_LIMIT:.0%} of the limit, from an "
             f"estimate (not measured). Keep headroom: run this gaplan plan again with --margin {NEAR_LIMIT:g} "
             f"(plans against {1 - NEAR_LIMIT:.0%} of the limit)."]
    if chosen.check_command:
        lines.append(f"check on the hardware: {chosen.check_command}")
    return lines + _bf16_caveat(comparison)


def _bf16_caveat(comparison: LayoutComparison) -> list[str]:
    from gaplan.estimate.targets import bf16_caveat

    caveat = comparison.device_kind == "cuda" and comparison.target and bf16_caveat(comparison.target, comparison.dtype)
    return [caveat] if caveat else []


def _saving(comparison: LayoutComparison, chosen: LayoutResult, keep: Callable[[Layout], bool], instead: str) -> str:
    """What the pick gains over the best fitting layout ``keep`` takes, the one ``instead`` of the trade-off
    ("without checkpointing", "with fp32 master weights"); said when none fits, or none was compared (--layouts)."""
    other = next((r for r in comparison.ranked if r.fits and r is not chosen and keep(r.layout)), None)
    if other is None:
        compared = any(keep(r.layout) and r.fits is not None for r in comparison.results)
        return f"{instead} no layout fits" if compared else f"no layout {instead} was compared (--layouts)"
    saved = (other.grad_accum_steps or 0) - (chosen.grad_accum_steps or 0)
    what = f"{other.layout.label} with {other.precision_label}: {comparison.split(other)}"
    if saved > 0:
        return f"to save {saved} accumulation step(s) (best {instead}: {what})"
    if chosen.samples_per_s is not None:  # timed (plan --measure): the faster won
        return f"measured faster than the best {instead} ({what})"
    # estimated only: the same steps, the tie broken by the finer precision (pick's rule); nothing was timed
    return f"the same accumulation steps as the best {instead} ({what}), kept for its finer precision " \
           f"({chosen.precision_label})"


def tradeoff_lines(comparison: LayoutComparison) -> list[str]:
    """The costs the pick pays -- communication, recomputation, host transfers, precision -- and what each buys."""
    chosen = comparison.pick
    if chosen is None:
        return []
    layout, steps = chosen.layout, chosen.grad_accum_steps or 1
    lines = []
    if layout.parallel == "fsdp":
        lines.append("FSDP: each block's parameters are all-gathered in the forward and again in the backward of "
                     "every micro-step (DDP all-reduces the gradients once per step); "
                     + _saving(comparison, chosen, lambda lay: lay.parallel == "ddp", "without FSDP"))
    if layout.parallel == "fsdp" and layout.grad_sync == "every":
        other = chosen.extra.get("other_grad_sync") or {}
        if other.get("fits") and other.get("grad_accum_steps"):
            sizes = split_sizes(comparison.effective_batch, chosen.world_size, other["grad_accum_steps"])
            gain = (f"to save {other['grad_accum_steps'] - steps} accumulation step(s) (--grad-sync last: B* "
                    f"{other['max_micro_batch']}, {format_split(sizes, chosen.world_size)})")
        else:
            gain = "without it (--grad-sync last) the layout does not fit"
        lines.append(f"--grad-sync every: gradients are reduce-scattered on every micro-step, {steps}x the gradient "
                     f"communication of once per step ({steps} accumulation steps); {gain}")
    if layout.grad_checkpointing:
        lines.append("--grad-checkpointing on: each block's forward is recomputed in the backward (about a third "
                     "more compute per micro-step); "
                     + _saving(comparison, chosen, lambda lay: not lay.grad_checkpointing, "without checkpointing"))
    if layout.cpu_offload:
        host = chosen.extra.get("host_bytes")
        held = f" ({format_bytes(host)} per rank)" if host else ""
        lines.append(f"--cpu-offload: parameters, gradients and optimizer states live in host memory{held}, copied "
                     "to the GPU and back every micro-step, and the optimizer step runs on the CPU; "
                     + _saving(comparison, chosen, lambda lay: not lay.cpu_offload, "without CPU offload"))
    if layout.weights_dtype == layout.dtype != "fp32":
        lines.append(f"pure {layout.dtype} weights and optimizer states: AdamW updates smaller than "
                     f"{layout.dtype}'s precision are lost; "
                     + _saving(comparison, chosen, lambda lay: lay.precision == "fp32-master", "with fp32 master weights"))
    return [f"trade-off: {line}" for line in lines]


def report_dict(comparison: LayoutComparison) -> dict:
    """The comparison (:meth:`LayoutComparison.to_dict`) with the pick's caveats and trade-offs, whole."""
    return comparison.to_dict() | {"pick_line": pick_line(comparison), "caveats": caveat_lines(comparison),
                                   "tradeoffs": tradeoff_lines(comparison)}


_SHORT = {"ddp": "DDP", "fsdp": "FSDP", "fsdp+ckpt": "FSDP+ckpt", "fsdp+offload": "FSDP+offload"}


def short_label(result: LayoutResult) -> str:
    """``FSDP+ckpt`` over ``fp32 master`` (or ``pure bf16``), for a chart's axis."""
    layout = result.layout
    sync = "\nsync every" if layout.parallel == "fsdp" and layout.grad_sync == "every" else ""
    precision = f"pure {layout.dtype}" if layout.weights_dtype == layout.dtype else f"{layout.weights_dtype} master"
    return f"{_SHORT[layout.machinery]}\n{precision}{sync}"


LABEL_BAND = 0.09  # a two-line bar label's height, as a fraction of the axes (10 x 6 in figure, 8 pt text)


def layouts_figure(comparison: LayoutComparison) -> Figure:
    """Peak per rank by layout: bars at the plan's micro-batch (fits) or at micro-batch 1 (does not fit, hatched),
    and the usable memory as a line. Nothing is clipped: bars (and the line) further apart than
    :data:`LOG_SCALE_RATIO` are drawn on a log axis, and labels are kept off the line."""
    shown = [r for r in comparison.results if r.fits is not None]  # in layout order: the machinery, then precision
    chosen = comparison.pick
    peaks = [(r.peak_bytes if r.fits else r.needed_bytes) or 0 for r in shown]
    usable = comparison.usable_bytes
    drawn = [p for p in peaks if p > 0]
    scale, unit = (2**30, "GiB") if max([usable, *drawn]) >= 2**30 else (2**20, "MiB")
    low, high = min([usable, *drawn]) / scale, max([usable, *drawn]) / scale
    log = high / low >= LOG_SCALE_RATIO
    figure = Figure(figsize=(10, 6), dpi=DPI, layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(f"Peak memory per rank by layout: {comparison.model}, world size {comparison.world_size}")
    axes.grid(True, axis="y", alpha=0.3, which="both" if log else "major")
    if log:  # a tiny model against a large card, or a layout that needs 10x the card: every bar stays readable
        axes.set_yscale("log")
        bottom, top = low / 2, high * 10 ** (0.25 * math.log10(high / low))
    else:
        bottom, top = 0.0, high * 1.2
    axes.set_ylim(bottom, top)
    positions = np.arange(len(shown))
    values = [p / scale for p in peaks]
    colors = ["tab:orange" if r is chosen else ("tab:blue" if r.fits else "white") for r in shown]
    bars = axes.bar(positions, [max(v - bottom, 0.0) for v in values], bottom=bottom, width=0.6, color=colors,
                    edgecolor="black", linewidth=0.6)
    line = usable / scale
    axes.axhline(line, color="tab:red", linestyle="--", linewidth=1.2)
    to_axes = axes.transData + axes.transAxes.inverted()

    def frac(value: float) -> float:
        return float(to_axes.transform((0.0, value))[1])

    for bar, result, value in zip(bars, shown, values, strict=True):
        if not result.fits:
            bar.set_hatch("//")
        label = (f"mb {result.micro_batch}\nB* {result.max_micro_batch}" if result.fits
                 else f"needs\n{format_bytes(value * scale)}")
        at, line_at = frac(value), frac(line)
        x = bar.get_x() + bar.get_width() / 2
        if not at <= line_at <= at + LABEL_BAND + 0.01:  # above the bar, clear of the line
            axes.annotate(label, (x, value), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
        elif at - LABEL_BAND - 0.01 > frac(bottom) and not at - LABEL_BAND - 0.01 <= line_at <= at:
            axes.annotate(label, (x, value), xytext=(0, -3), textcoords="offset points", ha="center", va="top",
                          fontsize=8, color="black" if not result.fits else "white")
        else:  # the line runs through both places: above the line instead
            axes.annotate(label, (x, line), xytext=(0, 6), textcoords="offset points", ha="center", fontsize=8)
    axes.set_xticks(positions, [short_label(r) for r in shown], fontsize=8)
    axes.set_ylabel(f"peak per rank ({unit}{', log scale' if log else ''})")
    handles = []
    if chosen is not None:
        handles.append(Patch(facecolor="tab:orange", edgecolor="black", label="pick"))
    if any(r.fits and r is not chosen for r in shown):
        handles.append(Patch(facecolor="tab:blue", edgecolor="black",
                             label="fits (peak at the plan's micro-batch mb; B* the largest that fits)"))
    if any(not r.fits for r in shown):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="does not fit (peak at micro-batch 1)"))
    handles.append(Line2D([], [], color="tab:red", linestyle="--", label=f"usable per rank {format_bytes(usable)}"))
    figure.legend(handles=handles, loc="outside lower center", ncols=2)
    return figure


def layout_blocks(comparison: LayoutComparison, images: list[str]) -> list[Block]:
    frame = layouts_frame(comparison, note_width=None)  # a saved page keeps every note whole
    chosen = comparison.pick
    blocks: list[Block] = [Heading(1, f"gaplan plan: {comparison.model}"), Paragraph(header_line(comparison)),
                           Paragraph(pick_line(comparison))]
    notes = caveat_lines(comparison) + tradeoff_lines(comparison)
    if notes:
        blocks.append(Bullets(notes))
    if chosen is not None and chosen.command:
        blocks.append(Paragraph(f"Launch: `{chosen.command}`"))
    right = frozenset(i for i, column in enumerate(frame.columns) if column in NUMBER_COLUMNS)
    blocks += [Heading(2, "Layouts"), Table(list(frame.columns), frame.astype(str).values.tolist(), right_aligned=right)]
    skipped = not_estimated_lines(comparison)
    if skipped:
        blocks.append(Bullets(skipped))
    blocks.append(Bullets([
        "Each layout is one `gaplan estimate` (one rank traced on fake tensors); the peak per rank is at the plan's "
        "largest micro-batch (what it runs at), the peak at B* beside it, and at micro-batch 1 when it does not fit.",
        "The effective batch is the same for every layout: only its split changes, written as micro-batch x "
        "accumulation steps x world size when the micro-batches are equal, else as one rank's micro-batch sizes x "
        "world size (22,21,21 x 8).",
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
    frame = records_frame(comparison)
    atomic_write(path_in(out_dir, LAYOUTS_CSV), lambda path: frame.to_csv(path, index=False))
    atomic_write_text(path_in(out_dir, LAYOUTS_JSON), json.dumps(report_dict(comparison), indent=2))
    written = [LAYOUTS_CSV, LAYOUTS_JSON]
    images = write_charts(out_dir, [(LAYOUTS_PNG, layouts_figure(comparison))]) if any(
        r.fits is not None for r in comparison.results) else {}
    written += list(images)
    written += write_pages(out_dir, layout_blocks(comparison, list(images)), f"gaplan plan: {comparison.model}", images,
                           REPORT_STEM)
    return sorted(written)
