"""The report's charts as matplotlib figures (memory, breakdown, throughput, training), and saving them as PNGs.

Figures are made with ``matplotlib.figure.Figure`` directly, not pyplot: no global state, no
GUI backend, safe to call from any thread or a headless machine.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from gaplan.core.atomic_write import atomic_write
from gaplan.core.constants import BREAKDOWN_CATEGORIES, LARGE_BATCH_KIND, TOKEN_PLAN_KIND
from gaplan.core.lines import interval_text
from gaplan.core.units import format_bytes
from gaplan.report.formatting import CATEGORY_LABELS, axis_unit, integer, is_false, missing, rate
from gaplan.report.load import RunData, measured, memory_fit, ratio, reference_label, reference_row
from gaplan.runs.folder import path_in

FIG_SIZE = (10, 6)  # inches; at 100 dpi a 1000 x 600 px image
DPI = 100


def write_charts(run_dir: str, charts: Sequence[tuple[str, Figure]]) -> dict[str, bytes]:
    """Save each ``(file name, figure)`` as a PNG in ``run_dir``; returns their bytes, for pages to inline."""
    images: dict[str, bytes] = {}
    for name, figure in charts:
        path = path_in(run_dir, name)
        atomic_write(path, lambda temp, figure=figure: figure.savefig(temp, format="png", dpi=DPI))
        with open(path, "rb") as handle:
            images[name] = handle.read()
    return images


def _new_axes(title: str) -> tuple[Figure, Any]:
    figure = Figure(figsize=FIG_SIZE, dpi=DPI, layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    return figure, axes


def _distinct(values: Sequence[float]) -> list[float]:
    return sorted({float(v) for v in values if not missing(v) and np.isfinite(float(v))})


def avoid_one_point(axes: Any, values: Sequence[float], which: str = "y") -> None:
    """Give an axis a band around its value when all ``values`` are equal (one step, a flat loss).

    Left alone, matplotlib would be asked for identical limits and warn; the band is 10% of
    the value either side (at least 1). Axes with a spread keep their automatic limits.
    """
    distinct = _distinct(values)
    if len(distinct) == 1:
        pad = max(abs(distinct[0]) * 0.1, 1.0)
        (axes.set_ylim if which == "y" else axes.set_xlim)(distinct[0] - pad, distinct[0] + pad)


def memory_figure(run: RunData) -> Figure:
    """Peak memory by micro-batch: trials, OOMs at the budget, the linear fit, the budget and B*. Needs a probe."""
    plan, trials = run.plan, run.trials
    budget, limit = run.budget, run.memory_limit
    best = int(plan["max_micro_batch"])
    fitting = trials[trials["fits"]]
    failed = trials[~trials["fits"]]
    largest = max([budget or 0, limit or 0, *fitting["peak_bytes"].dropna().tolist(),
                   *fitting["micro_steps_peak_bytes"].dropna().tolist(), 1])
    scale, unit = axis_unit(largest)

    figure, axes = _new_axes(f"Peak memory by micro-batch: {run.model} on {plan['device']}")
    axes.set_xlabel("micro-batch (samples)")
    axes.set_ylabel(f"peak memory ({unit})")
    x_right = max([best, *trials["micro_batch"].tolist()]) * 1.08 + 1

    fit = memory_fit(trials)
    if fit is not None:
        xs = np.linspace(0, x_right, 100)
        axes.plot(xs, (fit.fixed_bytes + fit.bytes_per_sample * xs) / scale, color="tab:gray", linewidth=1.2,
                  label=f"linear fit: {format_bytes(fit.fixed_bytes)} + {format_bytes(fit.bytes_per_sample)} per sample")
    # Where forward/backward set the whole step's peak (the usual case) the two are one point: drawn once, so
    # neither marker hides the other; drawn apart only where the optimizer step's temporaries set the peak.
    both = fitting[fitting["peak_bytes"].notna() & fitting["micro_steps_peak_bytes"].notna()]
    same = both[both["peak_bytes"] == both["micro_steps_peak_bytes"]]
    step_peaks = fitting[fitting["peak_bytes"].notna() & ~fitting.index.isin(same.index)]
    micro_peaks = fitting[fitting["micro_steps_peak_bytes"].notna() & ~fitting.index.isin(same.index)]
    if not same.empty:
        axes.plot(same["micro_batch"], same["peak_bytes"].astype("float64") / scale, "o", color="tab:blue",
                  markersize=7, markeredgecolor="tab:cyan", markeredgewidth=1.5,
                  label="fits: peak of the step, set in forward/backward")
    if not step_peaks.empty:
        axes.plot(step_peaks["micro_batch"], step_peaks["peak_bytes"].astype("float64") / scale, "o",
                  color="tab:blue", markersize=7, label="fits: peak of the whole step")
    if not micro_peaks.empty:
        axes.plot(micro_peaks["micro_batch"], micro_peaks["micro_steps_peak_bytes"].astype("float64") / scale, "s",
                  markerfacecolor="none", color="tab:cyan", markersize=8, label="fits: peak of forward/backward")
    if budget is not None:
        if not failed.empty:
            # An OOM has no peak to show; it failed at the budget, so that is where it is drawn.
            axes.plot(failed["micro_batch"], [budget / scale] * len(failed), "x", color="tab:red", markersize=10,
                      markeredgewidth=2.5, label="out of memory (drawn at the budget)")
        axes.axhline(budget / scale, color="tab:red", linestyle="--", linewidth=1.2,
                     label=f"budget {format_bytes(budget)}" + (" (probe limit)" if budget != limit else ""))
    if limit is not None and budget != limit:
        axes.axhline(limit / scale, color="tab:red", linestyle=":", linewidth=1, label=f"memory limit {format_bytes(limit)}")
    axes.axvline(best, color="tab:green", linestyle=":", linewidth=1.5, label=f"B* = {best}")
    planned = plan.get("plan") or {}
    micro = planned.get("micro_batch")
    if micro is not None and int(micro) != best:  # an even split of E below B*, or the tuner's pick
        axes.axvline(int(micro), color="tab:orange", linestyle="-.", linewidth=1.5,
                     label=f"planned micro-batch = {int(micro)} ({int(micro)} x {int(planned.get('grad_accum_steps', 1))})")
    near_right = best > 0.8 * x_right  # keep the label inside the axes
    axes.annotate(f"B* = {best}", xy=(best, 0.03), xycoords=("data", "axes fraction"), xytext=(-4 if near_right else 4, 0),
                  textcoords="offset points", ha="right" if near_right else "left", color="tab:green", fontweight="bold")
    axes.set_xlim(0, x_right)
    axes.set_ylim(0, largest / scale * 1.12)
    axes.legend(loc="upper left")
    return figure


def breakdown_figure(run: RunData) -> Figure:
    """Stacked bars of tracked memory by category per micro-batch, with the device peak beside each bar."""
    frame = run.breakdown
    assert frame is not None
    categories = list(BREAKDOWN_CATEGORIES)
    totals = frame[categories].fillna(0).sum(axis=1)
    largest = max([*totals.tolist(), *frame["device_peak_bytes"].dropna().tolist(), 1.0])
    scale, unit = axis_unit(largest)

    figure, axes = _new_axes(f"Memory by category: {run.model}")
    axes.set_xlabel("micro-batch (samples)")
    axes.set_ylabel(f"memory ({unit})")
    positions = np.arange(len(frame))
    bottom = np.zeros(len(frame))
    for category in categories:
        values = frame[category].fillna(0).to_numpy(dtype="float64") / scale
        axes.bar(positions, values, width=0.55, bottom=bottom, label=CATEGORY_LABELS[category])
        bottom += values
    peaks = frame["device_peak_bytes"]
    if peaks.notna().any():
        axes.plot(positions[peaks.notna().to_numpy()] + 0.36, peaks.dropna().to_numpy(dtype="float64") / scale, "D",
                  color="black", markersize=8, label="device peak")
    budget = run.budget
    if budget is not None and budget <= largest * 4:  # a far-away budget would squash the bars to nothing
        axes.axhline(budget / scale, color="tab:red", linestyle="--", linewidth=1.2, label=f"budget {format_bytes(budget)}")
        largest = max(largest, budget)
    axes.set_xticks(positions, [integer(b) for b in frame["micro_batch"]])
    axes.set_xlim(-0.6, len(frame) - 0.4)
    axes.set_ylim(0, largest / scale * 1.1)
    axes.legend(loc="upper left")
    return figure


def _split_label(row: Any) -> str:
    shape = f"{integer(row['micro_batch'])} x {integer(row['grad_accum_steps'])}"
    split = str(row["split"])
    return split if split.startswith(shape) else f"{split}\n{shape}"  # gaplan's own labels already read "32 x 8"


def throughput_figure(run: RunData) -> Figure:
    """Samples/s per split with their 95% intervals, the plan highlighted, the large batch as a reference line (its
    interval as a band), ratios with their intervals on the bars."""
    frame = run.throughput
    assert frame is not None
    reference = reference_row(frame)
    bars = frame[frame["kind"] != LARGE_BATCH_KIND].reset_index(drop=True)

    ratios = [ratio(row, reference) for _, row in bars.iterrows()]
    caption = "bar labels: samples/s" + ("" if all(r is None for r in ratios) else " and ratio to the reference")
    if bars["samples_per_s_low"].notna().any():
        caption += "; whiskers and band: 95% intervals"
    figure, axes = _new_axes(f"Training throughput by split: {run.model}\n{caption}")
    axes.set_xlabel("split (micro-batch x accumulation steps)")
    axes.set_ylabel("throughput (samples/s)")
    positions = np.arange(len(bars))
    speeds = bars["samples_per_s"].fillna(0).to_numpy(dtype="float64")
    plan_rows = bars["kind"].isin(["plan", TOKEN_PLAN_KIND]).to_numpy(dtype=bool)
    misfits = np.array([is_false(value) for value in bars["fits_budget"]], dtype=bool)
    colors = ["tab:orange" if is_plan else "tab:blue" for is_plan in plan_rows]
    low = bars["samples_per_s_low"].astype("float64").to_numpy()
    high = bars["samples_per_s_high"].astype("float64").to_numpy()
    known = ~np.isnan(low) & ~np.isnan(high) & (speeds > 0)
    whiskers = np.vstack([np.where(known, speeds - low, 0.0), np.where(known, high - speeds, 0.0)])
    drawn = axes.bar(positions, speeds, width=0.6, color=colors, edgecolor="black", linewidth=0.6,
                     yerr=whiskers if known.any() else None, capsize=4, error_kw={"elinewidth": 1.0})
    for patch, misfit in zip(drawn.patches, misfits, strict=True):
        if misfit:
            patch.set_hatch("//")
            patch.set_alpha(0.6)
    tops = np.where(known, high, speeds)  # labels sit above the whiskers
    top = max([*tops.tolist(), 1e-9])
    for position, (_, row), row_ratio in zip(positions, bars.iterrows(), ratios, strict=True):
        if measured(row):
            text = rate(row["samples_per_s"]) + ("" if row_ratio is None else f"\n{row_ratio:.2f}x")
            if row_ratio is not None and not missing(row["ratio_low"]) and not missing(row["ratio_high"]):
                text += interval_text(float(row["ratio_low"]), float(row["ratio_high"]), "{:.2f}")  # the table's rule
        else:
            text = "OOM" if is_false(row["fits_budget"]) else "not measured"
        axes.annotate(text, xy=(position, float(tops[position])), xytext=(0, 3), textcoords="offset points",
                      ha="center", va="bottom", fontsize=9,
                      bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})

    handles: list[Any] = []
    by_tokens = bool((bars["kind"] == TOKEN_PLAN_KIND).any())  # bench --batch-by tokens: the two plans
    if plan_rows.any():
        handles.append(Patch(facecolor="tab:orange", edgecolor="black", label="token plan" if by_tokens else "plan"))
    if not plan_rows.all():
        handles.append(Patch(facecolor="tab:blue", edgecolor="black",
                             label="samples plan" if by_tokens else "other split"))
    if misfits.any():
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="does not fit the budget"))
    if reference is not None:
        speed = float(reference["samples_per_s"])
        axes.axhline(speed, color="tab:red", linestyle="--", linewidth=1.3)
        if not missing(reference["samples_per_s_low"]) and not missing(reference["samples_per_s_high"]):
            axes.axhspan(float(reference["samples_per_s_low"]), float(reference["samples_per_s_high"]),
                         color="tab:red", alpha=0.12, linewidth=0)
            top = max(top, float(reference["samples_per_s_high"]))
        name = reference_label(reference, run.probed)
        label = f"{name}: {integer(reference['effective_batch'])} samples in one step" \
            if reference["kind"] == LARGE_BATCH_KIND else f"{name}: {reference['split']}"
        handles.append(Line2D([], [], color="tab:red", linestyle="--", label=f"{label}, {speed:,.1f} samples/s"))
        top = max(top, speed)
    axes.set_xticks(positions, [_split_label(row) for _, row in bars.iterrows()])
    axes.set_xlim(-0.7, max(len(bars), 1) - 0.3)
    axes.set_ylim(0, top * 1.15)  # room for the labels above the bars
    # Below the axes, so the legend never hides a bar label.
    figure.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 2))
    return figure


def training_figure(run: RunData) -> Figure:
    """Loss, samples/s and (when logged) peak memory over optimizer steps, in panels sharing a whole-number step
    axis."""
    log = run.train_log
    assert log is not None
    peaks = [c for c in ("step_peak_bytes", "peak_bytes") if c in log.columns and log[c].notna().any()]
    noise = "noise_scale" in log.columns and log["noise_scale"].notna().any()
    count = 2 + bool(peaks) + noise
    figure = Figure(figsize=(FIG_SIZE[0], FIG_SIZE[1] * (1 + 0.4 * (count - 2))), dpi=DPI, layout="constrained")
    panels = figure.subplots(count, 1, sharex=True)
    loss_axes, speed_axes = panels[0], panels[1]
    figure.suptitle(f"Training: {run.model}")
    marker = "o" if len(log) <= 60 else None
    loss_axes.plot(log["step"], log["loss"], marker=marker, markersize=4, color="tab:blue", label="loss")
    loss_axes.set_ylabel("loss")
    avoid_one_point(loss_axes, log["loss"].tolist())
    speed_axes.plot(log["step"], log["samples_per_s"], marker=marker, markersize=4, color="tab:green", label="samples/s")
    speed_axes.set_ylabel("throughput (samples/s)")
    panels[-1].set_xlabel("optimizer step")
    fastest = log["samples_per_s"].max()
    speed_axes.set_ylim(0, (float(fastest) if not missing(fastest) and fastest > 0 else 1.0) * 1.15)
    avoid_one_point(speed_axes, log["step"].tolist(), which="x")
    speed_axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    # Loss mostly falls and throughput sits near its top: these corners are usually empty.
    loss_axes.legend(loc="upper right")
    speed_axes.legend(loc="lower right")
    if peaks:
        _memory_over_steps(panels[2], run, peaks)
    if noise:
        _noise_over_steps(panels[-1], run)
    for axes in panels:
        axes.grid(True, alpha=0.3)
    return figure


def _memory_over_steps(axes: Any, run: RunData, columns: Sequence[str]) -> None:
    """Each step's peak: the probe's (above the baseline) and the whole process's resident peak, and the budget."""
    log = run.train_log
    assert log is not None
    budget = run.budget
    largest = max([*(float(log[c].max()) for c in columns), float(budget or 0), 1.0])
    scale, unit = axis_unit(largest)
    styles = {"step_peak_bytes": ("peak (step), as the probe measures it", "tab:purple", "-"),
              "peak_bytes": ("whole-process resident peak", "tab:gray", "--")}
    for column in columns:
        label, color, style = styles[column]
        axes.plot(log["step"], log[column].astype("float64") / scale, marker="o" if len(log) <= 60 else None,
                  markersize=4, color=color, linestyle=style, label=label)
    if budget is not None:
        axes.axhline(budget / scale, color="tab:red", linestyle=":", linewidth=1.2, label=f"budget {format_bytes(budget)}")
    axes.set_ylim(0, largest / scale * 1.15)
    axes.set_ylabel(f"peak memory ({unit})")
    axes.legend(loc="lower right")


def _noise_over_steps(axes: Any, run: RunData) -> None:
    """The smoothed gradient noise scale over the steps, against the effective batch: each step's where the log has
    it (a batch schedule changes it), else the plan's."""
    log = run.train_log
    assert log is not None
    values = log["noise_scale"].astype("float64")
    axes.plot(log["step"], values, marker="o" if len(log) <= 60 else None, markersize=4, color="tab:orange",
              label="gradient noise scale (samples)")
    effective = (run.plan.get("plan") or {}).get("effective_batch")
    steps = log["effective_batch"].astype("float64") if "effective_batch" in log.columns else None
    if steps is not None and steps.notna().any() and steps.nunique() > 1:
        axes.step(log["step"], steps, where="post", color="tab:blue", linestyle="--", linewidth=1.2,
                  label="effective batch (schedule)")
        effective = float(steps.max())
    elif effective:
        axes.axhline(effective, color="tab:blue", linestyle=":", linewidth=1.2, label=f"effective batch {effective}")
    top = max(float(values.max()) if values.notna().any() else 1.0, float(effective or 0), 1.0)
    axes.set_ylim(0, top * 1.15)
    axes.set_ylabel("samples")
    axes.legend(loc="upper right")


def lengths_figure(tokens: dict[str, Any], model: str | None = None) -> Figure:
    """The histogram of the data's sample lengths (tokens.json), its percentiles, and what T* packs at each end."""
    profile, budget = tokens["profile"], tokens["token_budget"]
    shortest, longest = int(profile["shortest"]), int(profile["longest"])
    counts = tokens.get("length_counts")
    if counts:  # the whole distribution: up to 60 bins of equal width
        width = max(1, -(-(longest - shortest + 1) // 60))
        binned: dict[int, int] = {}
        for length, samples in counts:
            start = shortest + (int(length) - shortest) // width * width
            binned[start] = binned.get(start, 0) + int(samples)
        starts, heights = list(binned), list(binned.values())
    else:  # older or hand-made files: the profile's own bins
        starts = [int(row[0]) for row in profile["histogram"]]
        heights = [int(row[2]) for row in profile["histogram"]]
        width = max(1, int(profile["histogram"][0][1]) - int(profile["histogram"][0][0]) + 1)
    data = tokens.get("data") or {}
    source = f" of {os.path.basename(str(data['path']))}" if data.get("path") else ""
    figure, axes = _new_axes(f"Sample lengths{source}: {integer(profile['count'])} samples, {shortest} to {longest} "
                             f"tokens" + (f" ({model})" if model else ""))
    axes.bar(starts, heights, width=width * 0.92, align="edge", color="tab:blue", edgecolor="black", linewidth=0.4,
             label="samples")
    axes.set_xlabel("sample length (tokens" + (f", tokenizer {data['tokenizer']}" if data.get("tokenizer") else "")
                    + ")")
    axes.set_ylabel("samples")
    for name, color, style in (("median", "tab:green", "-"), ("p90", "tab:orange", "--"), ("p99", "tab:red", "--")):
        value = float(profile[name])
        axes.axvline(value, color=color, linestyle=style, linewidth=1.5, label=f"{name} {value:g}")
    axes.axvline(longest, color="black", linestyle=":", linewidth=1.2, label=f"longest {longest}")
    t_star = int(budget["token_budget"])
    axes.annotate(f"T* = {t_star:,} tokens per micro-batch (granule {int(budget['granule'])}):\n"
                  f"{t_star // longest} x {longest} tokens (B* {int(budget['long_edge'])} at the longest)\n"
                  f"{t_star // shortest} x {shortest} tokens (B* {int(budget['short_edge'])} at the shortest)",
                  xy=(0.98, 0.55), xycoords="axes fraction", ha="right", va="center", fontsize=10,
                  bbox={"boxstyle": "round,pad=0.4", "facecolor": "white", "edgecolor": "tab:gray", "alpha": 0.9})
    axes.set_xlim(min(starts) - width, longest + width * 1.5)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.legend(loc="upper right")
    return figure
