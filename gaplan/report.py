"""A readable report of a saved run folder, from its CSV and JSON files alone.

``write_report(DIR)`` reads ``plan.json`` (and ``throughput.csv``, ``breakdown.csv``,
``train_log.csv`` when present) and writes ``probe.csv``, PNG charts, ``report.md``
and a self-contained ``report.html`` next to them. No model, no device, no torch:
a report can be made on any machine from a copied folder.
"""

from __future__ import annotations

import base64
import html
import itertools
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from gaplan.errors import GaplanError
from gaplan.search import fit_memory_line
from gaplan.units import format_bytes

PLAN_FILE = "plan.json"
THROUGHPUT_FILE = "throughput.csv"
BREAKDOWN_FILE = "breakdown.csv"
TRAIN_LOG_FILE = "train_log.csv"
PROBE_FILE = "probe.csv"
MEMORY_PNG = "memory.png"
BREAKDOWN_PNG = "breakdown.png"
THROUGHPUT_PNG = "throughput.png"
TRAINING_PNG = "training.png"
REPORT_STEM = "report"  # report.md and report.html

LARGE_BATCH_KIND = "large-batch"  # throughput.csv kinds that can serve as the ratios' reference
LARGEST_FIT_KIND = "largest-fit"
TRIAL_COLUMNS = ["micro_batch", "fits", "peak_bytes", "micro_steps_peak_bytes", "seconds", "completed_steps", "error"]
BREAKDOWN_CATEGORIES = ["parameters", "gradients", "optimizer_states", "activations", "other"]

# Required columns must be there; optional ones are filled with NA when an older or partial writer left them out.
_THROUGHPUT_REQUIRED = ["split", "kind", "micro_batch", "grad_accum_steps", "effective_batch", "samples_per_s"]
_THROUGHPUT_OPTIONAL = ["repeats", "step_seconds_median", "step_seconds_min", "step_seconds_max", "tokens_per_s",
                        "peak_bytes", "fits_budget", "bounded", "ratio_to_large_batch", "note"]
_BREAKDOWN_REQUIRED = ["micro_batch", *BREAKDOWN_CATEGORIES]
_BREAKDOWN_OPTIONAL = ["tracked_total", "device_peak_bytes"]
_TRAIN_LOG_REQUIRED = ["step", "loss", "samples_per_s"]
_TRAIN_LOG_OPTIONAL = ["lr", "tokens_per_s", "peak_bytes", "micro_batch", "grad_accum_steps", "seconds"]
_TEXT_COLUMNS = {"split", "kind", "note"}
_BOOL_COLUMNS = {"fits_budget", "bounded"}

_FIG_SIZE = (10, 6)  # inches; at 100 dpi a 1000 x 600 px image
_DPI = 100
_GIB = 2**30
_MIB = 2**20


@dataclass(frozen=True, eq=False)
class RunData:
    """The parsed inputs of a run folder; the CSV frames are None when the file is absent."""

    directory: str
    plan: dict[str, Any]  # plan.json as read, validated
    trials: pd.DataFrame  # one row per probe trial, columns TRIAL_COLUMNS, in probe order
    throughput: pd.DataFrame | None
    breakdown: pd.DataFrame | None
    train_log: pd.DataFrame | None


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`write_report` wrote: the folder and the file names in it, sorted."""

    directory: str
    files: list[str]


# ---------------------------------------------------------------------------------------------------------------------
# Reading


def load_run(run_dir: str) -> RunData:
    """Read and validate a run folder; raise :class:`GaplanError` with one line on anything unusable."""
    plan_path = os.path.join(run_dir, PLAN_FILE)
    if not os.path.isfile(plan_path):
        raise GaplanError(f"{run_dir} is not a gaplan run folder: no {PLAN_FILE}")
    plan = _read_plan_json(plan_path)
    return RunData(
        directory=run_dir,
        plan=plan,
        trials=trials_frame(plan.get("trials") or []),
        throughput=_read_csv(os.path.join(run_dir, THROUGHPUT_FILE), _THROUGHPUT_REQUIRED, _THROUGHPUT_OPTIONAL),
        breakdown=_read_csv(os.path.join(run_dir, BREAKDOWN_FILE), _BREAKDOWN_REQUIRED, _BREAKDOWN_OPTIONAL),
        train_log=_read_csv(os.path.join(run_dir, TRAIN_LOG_FILE), _TRAIN_LOG_REQUIRED, _TRAIN_LOG_OPTIONAL),
    )


def _one_line(text: object) -> str:
    """Errors from json/pandas can span lines; the CLI prints exactly one."""
    return " ".join(str(text).split())


def _read_plan_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GaplanError(_one_line(f"cannot read {path}: {exc}")) from None
    if not isinstance(data, dict):
        raise GaplanError(f"{path} is not a gaplan plan file: expected a JSON object")

    missing = [key for key in ("workload", "device", "memory_limit_bytes", "max_micro_batch", "plan") if key not in data]
    for section, keys in (("workload", ("model",)), ("plan", ("effective_batch", "micro_batch", "grad_accum_steps"))):
        if section in data:
            if not isinstance(data[section], dict):
                raise GaplanError(f"{path}: {section} must be a JSON object")
            missing += [f"{section}.{key}" for key in keys if key not in data[section]]
    if missing:
        raise GaplanError(f"{path} is not a complete gaplan plan file: missing {', '.join(missing)}")

    for key in ("memory_limit_bytes", "probe_limit_bytes", "max_micro_batch", "param_count", "static_bytes"):
        _check_number(path, key, data.get(key))
    for key in ("effective_batch", "micro_batch", "grad_accum_steps", "world_size"):
        _check_number(path, f"plan.{key}", data["plan"].get(key))
    trials = data.get("trials") or []
    if not isinstance(trials, list) or not all(isinstance(t, dict) for t in trials):
        raise GaplanError(f"{path}: trials must be a list of JSON objects")
    for index, trial in enumerate(trials):
        if "micro_batch" not in trial or "fits" not in trial:
            raise GaplanError(f"{path}: trial {index + 1} lacks micro_batch or fits")
        for key in ("micro_batch", "peak_bytes", "micro_steps_peak_bytes", "seconds", "completed_steps"):
            _check_number(path, f"trials[{index}].{key}", trial.get(key))
    return data


def _check_number(path: str, name: str, value: object) -> None:
    # None is allowed: absent optional fields; bools are numbers to Python but never meant here.
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise GaplanError(f"{path}: {name} must be a number (got {value!r})")


def trials_frame(trials: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The probe trials as a frame with stable dtypes (nullable integers, so sizes stay exact in CSV)."""
    frame = pd.DataFrame([{column: trial.get(column) for column in TRIAL_COLUMNS} for trial in trials], columns=TRIAL_COLUMNS)
    return frame.astype({"micro_batch": "int64", "fits": "bool", "peak_bytes": "Int64", "micro_steps_peak_bytes": "Int64",
                         "seconds": "float64", "completed_steps": "Int64", "error": "object"})


def _read_csv(path: str, required: list[str], optional: list[str]) -> pd.DataFrame | None:
    """A present CSV with its columns checked and typed; None when the file is absent."""
    if not os.path.exists(path):
        return None
    try:
        frame = pd.read_csv(path, keep_default_na=True)
    except pd.errors.EmptyDataError:
        raise GaplanError(f"{path} is empty: expected a header with columns {', '.join(required)}") from None
    except (OSError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise GaplanError(_one_line(f"cannot read {path}: {exc}")) from None
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise GaplanError(f"{path} is missing columns: {', '.join(missing)}")
    for column in optional:
        if column not in frame.columns:
            frame[column] = pd.NA
    for column in [*required, *optional]:
        if column in _TEXT_COLUMNS:
            frame[column] = frame[column].map(lambda value: "" if pd.isna(value) else str(value))
        elif column in _BOOL_COLUMNS:
            frame[column] = _bool_column(path, column, frame[column])
        else:
            frame[column] = _number_column(path, column, frame[column])
    return frame


def _number_column(path: str, column: str, values: pd.Series) -> pd.Series:
    numbers = pd.to_numeric(values, errors="coerce")
    bad = numbers.isna() & values.notna()
    if bad.any():
        raise GaplanError(f"{path}: column {column} has a value that is not a number: {values[bad].iloc[0]!r}")
    return numbers.astype("float64")


def _bool_column(path: str, column: str, values: pd.Series) -> pd.Series:
    words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}

    def parse(value: Any) -> bool | None:
        if value is None or (not isinstance(value, str) and pd.isna(value)):
            return None
        word = str(value).strip().lower()
        if word in ("1.0", "0.0"):
            word = word[0]
        if word not in words:
            raise GaplanError(f"{path}: column {column} must hold true/false (got {value!r})")
        return words[word]

    return values.map(parse).astype("boolean")


# ---------------------------------------------------------------------------------------------------------------------
# Writing


def write_report(run_dir: str) -> ReportFiles:
    """Read ``run_dir`` and write probe.csv, the charts, report.md and report.html into it."""
    run = load_run(run_dir)
    written: list[str] = []

    _write_file(run_dir, PROBE_FILE, lambda path: run.trials.to_csv(path, index=False))
    written.append(PROBE_FILE)

    charts: list[tuple[str, Figure]] = [(MEMORY_PNG, memory_figure(run))]
    if _has_rows(run.breakdown):
        charts.append((BREAKDOWN_PNG, breakdown_figure(run)))
    if _has_rows(run.throughput):
        charts.append((THROUGHPUT_PNG, throughput_figure(run)))
    if _has_rows(run.train_log):
        charts.append((TRAINING_PNG, training_figure(run)))
    images = write_charts(run_dir, charts)
    written += list(images)
    blocks = report_blocks(run, images=list(images))
    written += write_pages(run_dir, blocks, f"gaplan report: {run.plan['workload']['model']}", images, REPORT_STEM)
    return ReportFiles(directory=run_dir, files=sorted(written))


def write_charts(run_dir: str, charts: Sequence[tuple[str, Figure]]) -> dict[str, bytes]:
    """Save each ``(file name, figure)`` as a PNG; returns their bytes, for pages to inline."""
    images: dict[str, bytes] = {}
    for name, figure in charts:
        _write_file(run_dir, name, lambda path, figure=figure: figure.savefig(path, format="png", dpi=_DPI))
        with open(os.path.join(run_dir, name), "rb") as handle:
            images[name] = handle.read()
    return images


def write_pages(run_dir: str, blocks: Sequence[Block], title: str, images: dict[str, bytes],
                stem: str = "report") -> list[str]:
    """``<stem>.md`` and a self-contained ``<stem>.html`` rendered from the same blocks; returns their names."""
    names = [f"{stem}.md", f"{stem}.html"]
    write_text(run_dir, names[0], render_markdown(blocks))
    write_text(run_dir, names[1], render_html(blocks, title, images))
    return names


def write_text(run_dir: str, name: str, text: str) -> None:
    """A text file (Markdown, HTML, JSON) written the same atomic way."""
    _write_file(run_dir, name, lambda path: _write_text(path, text))


def write_csv(run_dir: str, name: str, rows: list[dict]) -> None:
    """A measurement table (``throughput.csv``, ``breakdown.csv``) written the same atomic way as the report."""
    _write_file(run_dir, name, lambda temp: pd.DataFrame(rows).to_csv(temp, index=False))


def _write_file(run_dir: str, name: str, write: Callable[[str], object]) -> None:
    """Write through a temp file and rename, so a reader never sees half a chart or report."""
    path = os.path.join(run_dir, name)
    temp = os.path.join(run_dir, f".{name}.tmp.{os.getpid()}")
    try:
        write(temp)
        os.replace(temp, path)
    except OSError as exc:
        raise GaplanError(_one_line(f"cannot write {path}: {exc.strerror or exc}")) from None
    finally:
        if os.path.exists(temp):
            os.remove(temp)


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(text)


def _has_rows(frame: pd.DataFrame | None) -> bool:
    return frame is not None and not frame.empty


# ---------------------------------------------------------------------------------------------------------------------
# Numbers for people


def _missing(value: Any) -> bool:
    return value is None or (not isinstance(value, str) and bool(pd.isna(value)))


def _is_false(value: Any) -> bool:
    """False but not missing: a nullable boolean read from a CSV."""
    return not _missing(value) and not bool(value)


def _bytes(value: Any) -> str:
    return "-" if _missing(value) else format_bytes(int(value))


def _count(value: Any) -> str:
    """5518848 -> 5.5M; 0 or missing -> unknown (plans written without probing record no count)."""
    if _missing(value) or not value:
        return "unknown"
    number = float(value)
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if number >= size:
            return f"{number / size:.1f}{suffix}"
    return f"{number:.0f}"


def _rate(value: Any) -> str:
    return "-" if _missing(value) else f"{float(value):,.1f}"


def _integer(value: Any) -> str:
    return "-" if _missing(value) else f"{int(value)}"


def _yes_no(value: Any) -> str:
    return "-" if _missing(value) else ("yes" if value else "no")


def _loss(value: Any) -> str:
    return "-" if _missing(value) else f"{float(value):.4g}"


def _run_lengths(sizes: Sequence[int]) -> str:
    """[32, 32, 32, 31] -> '32 x3, 31 x1': a thousand-step plan stays one short line."""
    return ", ".join(f"{size} x{len(list(group))}" for size, group in itertools.groupby(sizes))


def _axis_unit(largest_bytes: float) -> tuple[float, str]:
    return (_GIB, "GiB") if largest_bytes >= _GIB else (_MIB, "MiB")


def _budget(plan: dict[str, Any]) -> int:
    return int(plan.get("probe_limit_bytes") or plan["memory_limit_bytes"])


@dataclass(frozen=True)
class MemoryFit:
    """Peak of the micro-steps ~= fixed_bytes + bytes_per_sample x micro-batch, over ``points`` trials."""

    fixed_bytes: float
    bytes_per_sample: float
    points: int


def memory_fit(trials: pd.DataFrame) -> MemoryFit | None:
    """Least squares over the fitting trials on the linear part (micro-batch >= 1/4 of the largest that fits).

    Small micro-batches sit above the line (allocator rounding, fixed workspaces), so
    only the upper part is fitted; with fewer than two distinct sizes there is no line.
    """
    fitting = trials[trials["fits"]]
    peaks = fitting["micro_steps_peak_bytes"].fillna(fitting["peak_bytes"])
    points = [(int(b), int(p)) for b, p in zip(fitting["micro_batch"], peaks, strict=True) if pd.notna(p)]
    line = fit_memory_line(points)
    if line is None:
        return None
    intercept, slope = line
    used = max(2, sum(b >= max(b for b, _ in points) / 4 for b, _ in points))
    return MemoryFit(fixed_bytes=float(intercept), bytes_per_sample=float(slope), points=used)


# ---------------------------------------------------------------------------------------------------------------------
# Charts


def _new_axes(title: str) -> tuple[Figure, Any]:
    figure = Figure(figsize=_FIG_SIZE, dpi=_DPI, layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    return figure, axes


def memory_figure(run: RunData) -> Figure:
    """Peak memory by micro-batch: trials, OOMs at the budget, the linear fit, the budget and B*."""
    plan, trials = run.plan, run.trials
    budget = _budget(plan)
    best = int(plan["max_micro_batch"])
    fitting = trials[trials["fits"]]
    failed = trials[~trials["fits"]]
    largest = max([budget, int(plan["memory_limit_bytes"]), *fitting["peak_bytes"].dropna().tolist(),
                   *fitting["micro_steps_peak_bytes"].dropna().tolist()])
    scale, unit = _axis_unit(largest)

    figure, axes = _new_axes(f"Peak memory by micro-batch: {plan['workload']['model']} on {plan['device']}")
    axes.set_xlabel("micro-batch (samples)")
    axes.set_ylabel(f"peak memory ({unit})")
    x_right = max([best, *trials["micro_batch"].tolist()]) * 1.08 + 1

    fit = memory_fit(trials)
    if fit is not None:
        xs = np.linspace(0, x_right, 100)
        axes.plot(xs, (fit.fixed_bytes + fit.bytes_per_sample * xs) / scale, color="tab:gray", linewidth=1.2,
                  label=f"linear fit: {format_bytes(fit.fixed_bytes)} + {format_bytes(fit.bytes_per_sample)} per sample")
    step_peaks = fitting[fitting["peak_bytes"].notna()]
    if not step_peaks.empty:
        axes.plot(step_peaks["micro_batch"], step_peaks["peak_bytes"].astype("float64") / scale, "o",
                  color="tab:blue", markersize=7, label="fits: peak of the whole step")
    micro_peaks = fitting[fitting["micro_steps_peak_bytes"].notna()]
    if not micro_peaks.empty:
        axes.plot(micro_peaks["micro_batch"], micro_peaks["micro_steps_peak_bytes"].astype("float64") / scale, "s",
                  markerfacecolor="none", color="tab:cyan", markersize=8, label="fits: peak of forward/backward")
    if not failed.empty:
        # An OOM has no peak to show; it failed at the budget, so that is where it is drawn.
        axes.plot(failed["micro_batch"], [budget / scale] * len(failed), "x", color="tab:red", markersize=10,
                  markeredgewidth=2.5, label="out of memory (drawn at the budget)")
    axes.axhline(budget / scale, color="tab:red", linestyle="--", linewidth=1.2,
                 label=f"budget {format_bytes(budget)}" + (" (probe limit)" if budget != plan["memory_limit_bytes"] else ""))
    if budget != plan["memory_limit_bytes"]:
        axes.axhline(plan["memory_limit_bytes"] / scale, color="tab:red", linestyle=":", linewidth=1,
                     label=f"memory limit {format_bytes(plan['memory_limit_bytes'])}")
    axes.axvline(best, color="tab:green", linestyle=":", linewidth=1.5, label=f"B* = {best}")
    near_right = best > 0.8 * x_right  # keep the label inside the axes
    axes.annotate(f"B* = {best}", xy=(best, 0.03), xycoords=("data", "axes fraction"), xytext=(-4 if near_right else 4, 0),
                  textcoords="offset points", ha="right" if near_right else "left", color="tab:green", fontweight="bold")
    if trials.empty:
        axes.text(0.5, 0.5, "no probe trials: this plan was written without probing", transform=axes.transAxes,
                  ha="center", va="center", color="tab:gray")
    axes.set_xlim(0, x_right)
    axes.set_ylim(0, largest / scale * 1.12)
    axes.legend(loc="upper left")
    return figure


def breakdown_figure(run: RunData) -> Figure:
    """Stacked bars of tracked memory by category per micro-batch, with the device peak beside each bar."""
    frame = run.breakdown
    assert frame is not None
    totals = frame[BREAKDOWN_CATEGORIES].fillna(0).sum(axis=1)
    largest = max([*totals.tolist(), *frame["device_peak_bytes"].dropna().tolist(), 1.0])
    scale, unit = _axis_unit(largest)

    figure, axes = _new_axes(f"Memory by category: {run.plan['workload']['model']}")
    axes.set_xlabel("micro-batch (samples)")
    axes.set_ylabel(f"memory ({unit})")
    positions = np.arange(len(frame))
    bottom = np.zeros(len(frame))
    for category in BREAKDOWN_CATEGORIES:
        values = frame[category].fillna(0).to_numpy(dtype="float64") / scale
        axes.bar(positions, values, width=0.55, bottom=bottom, label=category.replace("_", " "))
        bottom += values
    peaks = frame["device_peak_bytes"]
    if peaks.notna().any():
        axes.plot(positions[peaks.notna().to_numpy()] + 0.36, peaks.dropna().to_numpy(dtype="float64") / scale, "D",
                  color="black", markersize=8, label="device peak")
    budget = _budget(run.plan)
    if budget <= largest * 4:  # a far-away budget would squash the bars to nothing
        axes.axhline(budget / scale, color="tab:red", linestyle="--", linewidth=1.2, label=f"budget {format_bytes(budget)}")
        largest = max(largest, budget)
    axes.set_xticks(positions, [_integer(b) for b in frame["micro_batch"]])
    axes.set_xlim(-0.6, len(frame) - 0.4)
    axes.set_ylim(0, largest / scale * 1.1)
    axes.legend(loc="upper left")
    return figure


def _measured(row: pd.Series) -> bool:
    return not _missing(row["samples_per_s"]) and float(row["samples_per_s"]) > 0


def reference_row(frame: pd.DataFrame) -> pd.Series | None:
    """What the ratios compare against: the large batch in one step, else the largest micro-batch that fits."""
    for kind in (LARGE_BATCH_KIND, LARGEST_FIT_KIND):
        rows = [row for _, row in frame[frame["kind"] == kind].iterrows() if _measured(row)]
        if rows:
            return rows[0]
    return None


def _reference_label(row: pd.Series) -> str:
    if row["kind"] == LARGEST_FIT_KIND:
        return "largest micro-batch that fits"
    if _is_false(row["bounded"]):
        return "true large batch (unbounded, does not fit)"
    return "large batch in one step"


def _ratio(row: pd.Series, reference: pd.Series | None) -> float | None:
    """The row's samples/s over the reference's, as saved, else computed."""
    if not _missing(row["ratio_to_large_batch"]):
        return float(row["ratio_to_large_batch"])
    if reference is None or not _measured(row):
        return None
    return float(row["samples_per_s"]) / float(reference["samples_per_s"])


def _split_label(row: pd.Series) -> str:
    shape = f"{_integer(row['micro_batch'])} x {_integer(row['grad_accum_steps'])}"
    split = str(row["split"])
    return split if split.startswith(shape) else f"{split}\n{shape}"  # gaplan's own labels already read "32 x 8"


def throughput_figure(run: RunData) -> Figure:
    """Samples/s per split, the plan highlighted, the large batch as a reference line, ratios on the bars."""
    frame = run.throughput
    assert frame is not None
    reference = reference_row(frame)
    bars = frame[frame["kind"] != LARGE_BATCH_KIND].reset_index(drop=True)

    ratios = [_ratio(row, reference) for _, row in bars.iterrows()]
    caption = "bar labels: samples/s" + ("" if all(r is None for r in ratios) else " and ratio to the reference")
    figure, axes = _new_axes(f"Training throughput by split: {run.plan['workload']['model']}\n{caption}")
    axes.set_xlabel("split (micro-batch x accumulation steps)")
    axes.set_ylabel("throughput (samples/s)")
    positions = np.arange(len(bars))
    speeds = bars["samples_per_s"].fillna(0).to_numpy(dtype="float64")
    plan_rows = (bars["kind"] == "plan").to_numpy(dtype=bool)
    misfits = np.array([_is_false(value) for value in bars["fits_budget"]], dtype=bool)
    colors = ["tab:orange" if is_plan else "tab:blue" for is_plan in plan_rows]
    drawn = axes.bar(positions, speeds, width=0.6, color=colors, edgecolor="black", linewidth=0.6)
    for patch, misfit in zip(drawn.patches, misfits, strict=True):
        if misfit:
            patch.set_hatch("//")
            patch.set_alpha(0.6)
    top = max([*speeds.tolist(), 1e-9])
    for position, (_, row), ratio in zip(positions, bars.iterrows(), ratios, strict=True):
        if _measured(row):
            text = _rate(row["samples_per_s"]) + ("" if ratio is None else f"\n{ratio:.2f}x")
        else:
            text = "OOM" if _is_false(row["fits_budget"]) else "not measured"
        axes.annotate(text, xy=(position, float(speeds[position])), xytext=(0, 3), textcoords="offset points",
                      ha="center", va="bottom", fontsize=9,
                      bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})

    handles: list[Any] = []
    if plan_rows.any():
        handles.append(Patch(facecolor="tab:orange", edgecolor="black", label="plan"))
    if not plan_rows.all():
        handles.append(Patch(facecolor="tab:blue", edgecolor="black", label="other split"))
    if misfits.any():
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="does not fit the budget"))
    if reference is not None:
        speed = float(reference["samples_per_s"])
        axes.axhline(speed, color="tab:red", linestyle="--", linewidth=1.3)
        label = f"{_reference_label(reference)}: {_integer(reference['effective_batch'])} samples in one step" \
            if reference["kind"] == LARGE_BATCH_KIND else f"{_reference_label(reference)}: {reference['split']}"
        handles.append(Line2D([], [], color="tab:red", linestyle="--", label=f"{label}, {speed:,.1f} samples/s"))
        top = max(top, speed)
    axes.set_xticks(positions, [_split_label(row) for _, row in bars.iterrows()])
    axes.set_xlim(-0.7, max(len(bars), 1) - 0.3)
    axes.set_ylim(0, top * 1.15)  # room for the labels above the bars
    # Below the axes, so the legend never hides a bar label.
    figure.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 2))
    return figure


def training_figure(run: RunData) -> Figure:
    """Loss and samples/s over optimizer steps, in two panels sharing the step axis."""
    log = run.train_log
    assert log is not None
    figure = Figure(figsize=_FIG_SIZE, dpi=_DPI, layout="constrained")
    loss_axes, speed_axes = figure.subplots(2, 1, sharex=True)
    figure.suptitle(f"Training: {run.plan['workload']['model']}")
    marker = "o" if len(log) <= 60 else None
    loss_axes.plot(log["step"], log["loss"], marker=marker, markersize=4, color="tab:blue", label="loss")
    loss_axes.set_ylabel("loss")
    speed_axes.plot(log["step"], log["samples_per_s"], marker=marker, markersize=4, color="tab:green", label="samples/s")
    speed_axes.set_ylabel("throughput (samples/s)")
    speed_axes.set_xlabel("optimizer step")
    fastest = log["samples_per_s"].max()
    speed_axes.set_ylim(0, (float(fastest) if not _missing(fastest) and fastest > 0 else 1.0) * 1.15)
    # Loss mostly falls and throughput sits near its top: these corners are usually empty.
    loss_axes.legend(loc="upper right")
    speed_axes.legend(loc="lower right")
    for axes in (loss_axes, speed_axes):
        axes.grid(True, alpha=0.3)
    return figure


# ---------------------------------------------------------------------------------------------------------------------
# The report as blocks, rendered to Markdown and HTML from the same content


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: list[str]


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[str]]
    right_aligned: frozenset[int] = frozenset()  # column indexes of numbers


@dataclass(frozen=True)
class Image:
    file: str
    alt: str


Block = Heading | Paragraph | Bullets | Table | Image


def report_blocks(run: RunData, images: Sequence[str]) -> list[Block]:
    """The whole report; ``images`` names the charts that were written, in order."""
    plan = run.plan
    blocks: list[Block] = [Heading(1, f"gaplan report: {plan['workload']['model']}"), Bullets(_header_items(plan))]
    blocks += _plan_section(run)
    if isinstance(plan.get("tuner"), dict):
        blocks += _tuner_section(plan["tuner"])
    blocks += _probe_section(run, images)
    if _has_rows(run.throughput):
        blocks += _throughput_section(run, images)
    if _has_rows(run.breakdown):
        blocks += _breakdown_section(run, images)
    if _has_rows(run.train_log):
        blocks += _training_section(run, images)
    return blocks


def _header_items(plan: dict[str, Any]) -> list[str]:
    workload = plan["workload"]
    task = plan.get("task") or workload.get("task") or "unknown"
    seq_len = plan.get("seq_len") or workload.get("seq_len")
    checkpointing = "on" if workload.get("grad_checkpointing") else "off"
    budget = f"{format_bytes(plan['memory_limit_bytes'])}"
    budget += " (the device default)" if plan.get("budget_is_default") else " (set by the user)"
    probe_limit = _budget(plan)
    if probe_limit != plan["memory_limit_bytes"]:
        budget += f", probed under {format_bytes(probe_limit)} ({float(plan.get('margin') or 0):.0%} margin)"
    torch_version = plan.get("torch_version")
    versions = f"gaplan {plan.get('gaplan_version', 'unknown')}, " + (f"torch {torch_version}" if torch_version
                                                                      else "torch version not recorded")
    return [
        f"**Model:** {workload['model']}, {_count(plan.get('param_count'))} parameters",
        f"**Task:** {task}, sequence length {seq_len if seq_len else 'unknown'}",
        f"**Training setup:** {workload.get('dtype', '?')}, optimizer {workload.get('optimizer', '?')}"
        f" (lr {workload.get('lr', '?')}), gradient checkpointing {checkpointing}",
        f"**Device:** {plan['device']}",
        f"**Memory budget:** {budget}",
        f"**Versions:** {versions}",
        f"**Created:** {plan.get('created') or 'unknown'}",
        *([f"**Reproduce with:** `{plan['command']}`"] if plan.get("command") else []),
    ]


def _plan_line(plan_part: dict[str, Any]) -> str:
    effective = int(plan_part["effective_batch"])
    micro = int(plan_part["micro_batch"])
    steps = int(plan_part["grad_accum_steps"])
    world = int(plan_part.get("world_size") or 1)
    sizes = [int(s) for s in plan_part.get("micro_batch_sizes") or []]
    if micro * steps * world == effective and all(s == micro for s in sizes):
        return (f"**Plan:** effective batch {effective} = {micro} (micro-batch) x {steps} (accumulation steps)"
                f" x {world} (world size)")
    return (f"**Plan:** effective batch {effective} over {steps} accumulation steps x {world} (world size),"
            f" micro-batches of at most {micro} (uneven split)")


def _plan_section(run: RunData) -> list[Block]:
    plan, trials = run.plan, run.trials
    best = int(plan["max_micro_batch"])
    budget = _budget(plan)
    capped = " (the search stopped at its upper limit: larger micro-batches may fit too)" if plan.get("capped") else ""
    items = [f"**B\\* (largest micro-batch that fits the budget):** {best}{capped}", _plan_line(plan["plan"])]
    sizes = plan["plan"].get("micro_batch_sizes")
    if sizes:
        rank = " on rank 0" if int(plan["plan"].get("world_size") or 1) > 1 else ""
        items.append(f"**Micro-batch sizes{rank}:** {_run_lengths([int(s) for s in sizes])}")
    at_best = trials[(trials["micro_batch"] == best) & trials["fits"] & trials["peak_bytes"].notna()]
    if not at_best.empty:
        peak = int(at_best["peak_bytes"].max())
        limit = "budget" if budget == plan["memory_limit_bytes"] else "probe limit"
        items.append(f"**Peak at B\\*:** {format_bytes(peak)} of {format_bytes(budget)} ({peak / budget:.0%} of the {limit})")
    if plan.get("static_bytes"):
        items.append(f"**Static memory:** {format_bytes(plan['static_bytes'])} for weights, gradients and optimizer states")
    fit = memory_fit(trials)
    if fit is not None:
        items.append(f"**Memory line (fit over {fit.points} trials):** {format_bytes(fit.fixed_bytes)}"
                     f" + {format_bytes(fit.bytes_per_sample)} per sample")
    if trials.empty:
        items.append("**Probe:** none, this plan was written without probing")
    else:
        wall = plan.get("wall_seconds")
        items.append(f"**Probe:** {len(trials)} trials" + (f" in {float(wall):.1f} s" if wall is not None else ""))
    return [Heading(2, "Plan"), Bullets(items)]


def _tuner_section(tuner: dict[str, Any]) -> list[Block]:
    checkpointing = tuner.get("grad_checkpointing")
    choice = f"micro-batch {tuner.get('micro_batch', '?')}"
    if checkpointing is not None:
        choice += f", gradient checkpointing {'on' if checkpointing else 'off'}"
    items = [f"**Objective:** {tuner.get('objective', 'unknown')}", f"**Chosen:** {choice}"]
    if tuner.get("reason"):
        items.append(f"**Why:** {tuner['reason']}")
    return [Heading(2, "Tuner decision"), Bullets(items)]


def _probe_section(run: RunData, images: Sequence[str]) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Probe trials")]
    if MEMORY_PNG in images:
        blocks.append(Image(MEMORY_PNG, "Peak memory by micro-batch"))
    if run.trials.empty:
        return [*blocks, Paragraph("No probe trials: this plan was written without probing.")]
    rows = []
    for number, trial in enumerate(run.trials.itertuples(index=False), start=1):
        error = "" if _missing(trial.error) else str(trial.error)
        rows.append([str(number), str(trial.micro_batch), "fits" if trial.fits else "OOM", _bytes(trial.peak_bytes),
                     _bytes(trial.micro_steps_peak_bytes), _integer(trial.completed_steps),
                     "-" if _missing(trial.seconds) else f"{trial.seconds:.1f}", _shorten(error, 80)])
    blocks.append(Paragraph(f"In the order they ran; results also in `{PROBE_FILE}`."))
    blocks.append(Table(["#", "micro-batch", "result", "peak (step)", "peak (fwd/bwd)", "steps done", "seconds", "error"],
                        rows, frozenset({0, 1, 3, 4, 5, 6})))
    return blocks


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _throughput_section(run: RunData, images: Sequence[str]) -> list[Block]:
    frame = run.throughput
    assert frame is not None
    reference = reference_row(frame)
    rows = []
    for _, row in frame.iterrows():
        ratio = _ratio(row, reference)
        fits = _yes_no(row["fits_budget"])
        if _is_false(row["bounded"]) and _measured(row):
            fits += " (run without the budget)"
        step = "-" if _missing(row["step_seconds_median"]) else f"{float(row['step_seconds_median']):.3f}"
        rows.append([row["split"], row["kind"], f"{_integer(row['micro_batch'])} x {_integer(row['grad_accum_steps'])}",
                     _integer(row["effective_batch"]), _rate(row["samples_per_s"]), _rate(row["tokens_per_s"]), step,
                     _bytes(row["peak_bytes"]), fits, "-" if ratio is None else f"{ratio:.2f}x", row["note"]])
    blocks: list[Block] = [Heading(2, "Throughput")]
    if THROUGHPUT_PNG in images:
        blocks.append(Image(THROUGHPUT_PNG, "Throughput by split"))
    if reference is not None:
        blocks.append(Paragraph(f"Ratios are samples/s relative to the {_reference_label(reference)} ({reference['split']})."))
    blocks.append(Table(["split", "kind", "micro x accum", "effective batch", "samples/s", "tokens/s", "step s (median)",
                         "peak", "fits budget", "ratio", "note"], rows, frozenset({3, 4, 5, 6, 7, 9})))
    return blocks


def _breakdown_section(run: RunData, images: Sequence[str]) -> list[Block]:
    frame = run.breakdown
    assert frame is not None
    rows = []
    for _, row in frame.iterrows():
        total = row["tracked_total"]
        if _missing(total):
            total = sum(0 if _missing(row[c]) else row[c] for c in BREAKDOWN_CATEGORIES)
        rows.append([_integer(row["micro_batch"]), *[_bytes(row[c]) for c in BREAKDOWN_CATEGORIES], _bytes(total),
                     _bytes(row["device_peak_bytes"])])
    blocks: list[Block] = [Heading(2, "Memory breakdown")]
    if BREAKDOWN_PNG in images:
        blocks.append(Image(BREAKDOWN_PNG, "Memory by category"))
    headers = ["micro-batch", *[c.replace("_", " ") for c in BREAKDOWN_CATEGORIES], "tracked total", "device peak"]
    blocks.append(Table(headers, rows, frozenset(range(len(headers)))))
    return blocks


def _training_section(run: RunData, images: Sequence[str]) -> list[Block]:
    log = run.train_log
    assert log is not None
    first, last = log.iloc[0], log.iloc[-1]
    items = [
        f"**Steps:** {len(log)} logged (steps {_integer(first['step'])} to {_integer(last['step'])})",
        f"**Loss:** {_loss(first['loss'])} at the first step, {_loss(last['loss'])} at the last",
        f"**Median throughput:** {_rate(log['samples_per_s'].median())} samples/s"
        + ("" if log["tokens_per_s"].isna().all() else f", {_rate(log['tokens_per_s'].median())} tokens/s"),
    ]
    if log["peak_bytes"].notna().any():
        items.append(f"**Peak memory:** {_bytes(log['peak_bytes'].max())}")
    micro = log["micro_batch"].dropna().astype("int64").tolist()
    changes = [m for i, m in enumerate(micro) if i == 0 or m != micro[i - 1]]
    if len(changes) > 1:  # the training loop halves the micro-batch after an OOM
        items.append(f"**Micro-batch changed during training:** {' -> '.join(map(str, changes))}")
    blocks: list[Block] = [Heading(2, "Training")]
    if TRAINING_PNG in images:
        blocks.append(Image(TRAINING_PNG, "Loss and throughput over steps"))
    return [*blocks, Bullets(items)]


# --- Markdown


def _markdown_cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right_aligned: frozenset[int] = frozenset()) -> str:
    """A padded GitHub-style table (no tabulate dependency); ``right_aligned`` holds number columns."""
    cells = [[_markdown_cell(h) for h in headers], *[[_markdown_cell(c) for c in row] for row in rows]]
    widths = [max(3, *(len(row[i]) for row in cells)) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        padded = [cell.rjust(width) if i in right_aligned else cell.ljust(width)
                  for i, (cell, width) in enumerate(zip(row, widths, strict=True))]
        return "| " + " | ".join(padded) + " |"

    rule = ["-" * (w - 1) + ":" if i in right_aligned else "-" * w for i, w in enumerate(widths)]
    return "\n".join([line(cells[0]), "| " + " | ".join(rule) + " |", *(line(row) for row in cells[1:])])


def render_markdown(blocks: Sequence[Block]) -> str:
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"{'#' * block.level} {block.text}")
        elif isinstance(block, Paragraph):
            parts.append(block.text)
        elif isinstance(block, Bullets):
            parts.append("\n".join(f"- {item}" for item in block.items))
        elif isinstance(block, Table):
            parts.append(markdown_table(block.headers, block.rows, block.right_aligned))
        else:
            parts.append(f"![{block.alt}]({block.file})")
    return "\n\n".join(parts) + "\n"


# --- HTML

_STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #222; margin: 0; background: #fafafa; }
main { max-width: 1100px; margin: 0 auto; padding: 1.5em 2em 3em; background: #fff; }
h1 { border-bottom: 2px solid #ddd; padding-bottom: 0.3em; }
h2 { margin-top: 2em; border-bottom: 1px solid #eee; padding-bottom: 0.2em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.6em; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #fafafa; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
code { background: #f3f3f3; padding: 0 0.2em; }
"""

_BOLD = re.compile(r"\*\*(.+?)\*\*")
_CODE = re.compile(r"`([^`]+)`")


def _inline_html(text: str) -> str:
    """The little Markdown the report uses (bold, code, escaped star) as HTML."""
    escaped = html.escape(text.replace("\\*", "*"), quote=False)
    return _CODE.sub(r"<code>\1</code>", _BOLD.sub(r"<strong>\1</strong>", escaped))


def render_html(blocks: Sequence[Block], title: str, images: dict[str, bytes]) -> str:
    """A self-contained page: inline CSS, charts as data: URLs, nothing fetched from anywhere."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{_inline_html(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            parts.append(f"<p>{_inline_html(block.text)}</p>")
        elif isinstance(block, Bullets):
            parts.append("<ul>\n" + "\n".join(f"<li>{_inline_html(item)}</li>" for item in block.items) + "\n</ul>")
        elif isinstance(block, Table):
            parts.append(_html_table(block))
        elif block.file in images:
            data = base64.b64encode(images[block.file]).decode("ascii")
            parts.append(f'<p><img src="data:image/png;base64,{data}" alt="{html.escape(block.alt)}"></p>')
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{_STYLE}</style>\n</head>\n<body>\n<main>\n{body}\n</main>\n</body>\n</html>\n")


def _html_table(table: Table) -> str:
    head = "".join(f"<th>{_inline_html(h)}</th>" for h in table.headers)
    rows = []
    for row in table.rows:
        cells = "".join(f'<td class="num">{_inline_html(c)}</td>' if i in table.right_aligned else f"<td>{_inline_html(c)}</td>"
                        for i, c in enumerate(row))
        rows.append(f"<tr>{cells}</tr>")
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(rows) + "\n</tbody>\n</table>"

