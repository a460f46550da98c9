"""A run folder read into :class:`RunData`, and the facts the report derives from it (budget, memory line, reference).

Reading and checking the files is :mod:`gaplan.runs.schema`'s job; this module only gathers them
and answers questions every section and chart asks the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pandas as pd

from gaplan.core.constants import LARGE_BATCH_KIND, LARGEST_FIT_KIND
from gaplan.core.errors import GaplanError
from gaplan.plan.search import fit_memory_line
from gaplan.report.formatting import is_false, missing
from gaplan.runs.folder import BENCH_JSON, LAYOUTS_JSON, LOSS_CHECK_JSON, PLAN_JSON, TOKENS_JSON, TRAIN_JSON, path_in
from gaplan.runs.schema import (
    BREAKDOWN,
    THROUGHPUT,
    TRAIN_LOG,
    read_bench_json,
    read_loss_check_json,
    read_plan_json,
    read_table,
    read_tokens_json,
    trials_frame,
    was_probed,
)


@dataclass(frozen=True, eq=False)
class RunData:
    """The parsed inputs of a run folder; the CSV frames are None when the file is absent."""

    directory: str
    plan: dict[str, Any]  # plan.json as read, checked
    trials: pd.DataFrame  # one row per probe trial, columns schema.TRIAL_COLUMNS, in probe order
    throughput: pd.DataFrame | None
    breakdown: pd.DataFrame | None
    train_log: pd.DataFrame | None
    tokens: dict[str, Any] | None = None  # tokens.json (probe/bench --batch-by tokens): length profile and T*
    loss_check: dict[str, Any] | None = None  # loss_check.json (train): step 1 against the same samples as one batch
    bench: dict[str, Any] | None = None  # bench.json: the rounds, the plan's ratio with its interval, contention
    enforced_budget: bool | None = None  # train.json: trained under --enforce-memory-limit (None: not a training run)
    commands: list[str] | None = None  # train.json: the command lines that made the run (its start, its resumes)
    steps_total: int | None = None  # train.json: the steps the run was to train (more than logged: it stopped)

    @property
    def is_training(self) -> bool:
        """A folder of ``gaplan train`` (a log, even one stopped before its first step): its report leads with the
        training."""
        return self.train_log is not None

    @property
    def model(self) -> str:
        return str(self.plan["workload"]["model"])

    @property
    def probed(self) -> bool:
        """Whether a probe ran: False for a plan made with ``--micro-batch``, which has no trials."""
        return was_probed(self.plan) and not self.trials.empty

    @property
    def memory_limit(self) -> int | None:
        """The budget the user set or the device default; None when none was recorded (0 in older files)."""
        return _bytes_or_none(self.plan.get("memory_limit_bytes"))

    @property
    def budget(self) -> int | None:
        """The limit trials ran under: the probe limit (budget less the margin), else the budget; None if neither."""
        return _bytes_or_none(self.plan.get("probe_limit_bytes")) or self.memory_limit


def _bytes_or_none(value: Any) -> int | None:
    # A budget of 0 bytes means none: older plans made without a probe recorded 0 for "unknown".
    return int(value) if not missing(value) and value else None


def load_run(run_dir: str) -> RunData:
    """Read and check a run folder; raise :class:`GaplanError` with one line on anything unusable."""
    plan_path = path_in(run_dir, PLAN_JSON)
    if not os.path.isfile(plan_path):
        if not os.path.isdir(run_dir):
            raise GaplanError(f"{run_dir}: {'not a folder' if os.path.exists(run_dir) else 'no such folder'}")
        if os.path.isfile(path_in(run_dir, LAYOUTS_JSON)):
            raise GaplanError(f"{run_dir} is a gaplan plan folder: gaplan plan writes its report whole (run it again "
                              "to write it anew); gaplan report rebuilds a probe's, bench's or train run's")
        raise GaplanError(f"{run_dir} is not a gaplan run folder: no {PLAN_JSON}")
    plan = read_plan_json(plan_path)
    return RunData(
        directory=run_dir,
        plan=plan,
        trials=trials_frame(plan.get("trials") or []),
        throughput=read_table(run_dir, THROUGHPUT),
        breakdown=read_table(run_dir, BREAKDOWN),
        train_log=_one_run_log(run_dir, read_table(run_dir, TRAIN_LOG)),
        tokens=read_tokens_json(tokens_path) if os.path.isfile(tokens_path := path_in(run_dir, TOKENS_JSON)) else None,
        loss_check=read_loss_check_json(check_path) if os.path.isfile(check_path := path_in(run_dir, LOSS_CHECK_JSON))
        else None,
        bench=read_bench_json(bench_path) if os.path.isfile(bench_path := path_in(run_dir, BENCH_JSON)) else None,
        **_train_record(path_in(run_dir, TRAIN_JSON)),
    )


def _one_run_log(run_dir: str, log: pd.DataFrame | None) -> pd.DataFrame | None:
    """The training log, refused where its steps do not count up (two writers mixed into it). A step skipped is a
    log cut short (a disk that filled, a hand edit) that a resume went on after: its rows are still one run's."""
    if not has_rows(log) or "step" not in log:
        return log
    steps = [int(step) for step in log["step"]]
    for index, (before, after) in enumerate(zip(steps, steps[1:], strict=False)):
        if after <= before:
            raise GaplanError(f"{run_dir}: {TRAIN_LOG.name} is not one run's log: step {after} follows step {before} "
                              f"(line {index + 3}); two runs wrote into the folder")
    return log


def _train_record(path: str) -> dict[str, Any]:
    """From a training run's ``train.json``: whether it bound itself to its budget, and the command lines that made
    it (its start and the resumes that changed it; an older file holds the last one only); nothing when unknown."""
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
        options = record.get("options") or {}
        commands = record.get("commands") or [options.get("command")]
    except (OSError, ValueError, AttributeError):
        return {}
    enforced = options.get("enforce_memory_limit") if isinstance(options, dict) else None
    steps = options.get("steps") if isinstance(options, dict) else None
    return {"enforced_budget": enforced if isinstance(enforced, bool) else None,
            "steps_total": steps if isinstance(steps, int) and not isinstance(steps, bool) else None,
            "commands": [c for c in commands if isinstance(c, str)] or None if isinstance(commands, list) else None}


def has_rows(frame: pd.DataFrame | None) -> bool:
    return frame is not None and not frame.empty


# ---------------------------------------------------------------------------------------------------------------------
# The memory line


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
# Throughput: what the ratios compare against


def measured(row: pd.Series) -> bool:
    """Whether a throughput row has a real samples/s (not an OOM or a row that was not run)."""
    return not missing(row["samples_per_s"]) and float(row["samples_per_s"]) > 0


def reference_row(frame: pd.DataFrame) -> pd.Series | None:
    """What the ratios compare against: the large batch in one step, else the largest micro-batch that fits."""
    for kind in (LARGE_BATCH_KIND, LARGEST_FIT_KIND):
        rows = [row for _, row in frame[frame["kind"] == kind].iterrows() if measured(row)]
        if rows:
            return rows[0]
    return None


def reference_label(row: pd.Series, probed: bool = True) -> str:
    """The reference in words; without a probe there is no budget it could be said not to fit."""
    if row["kind"] == LARGEST_FIT_KIND:
        return "largest micro-batch that fits"
    if not probed:
        return "true large batch (no probe: whether it fits is unknown)"
    if is_false(row["fits_budget"]):
        return "true large batch (over the budget: timed for reference, does not fit)"
    return "true large batch"


def ratio(row: pd.Series, reference: pd.Series | None) -> float | None:
    """The row's samples/s over the reference's, as saved, else computed."""
    if not missing(row["ratio_to_large_batch"]):
        return float(row["ratio_to_large_batch"])
    if reference is None or not measured(row):
        return None
    return float(row["samples_per_s"]) / float(reference["samples_per_s"])
