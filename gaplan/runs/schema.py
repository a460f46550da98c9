"""The run folder's file formats: ``plan.json`` and the CSVs, read, checked and written in one place. No torch.

Probe, bench, train and ``gaplan report`` all go through here, so a file one of them writes
is a file every other one reads. Anything unusable is one :class:`GaplanError` line.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from gaplan.core.atomic_write import atomic_write, atomic_write_text
from gaplan.core.constants import BREAKDOWN_CATEGORIES
from gaplan.core.errors import GaplanError, one_line
from gaplan.runs.folder import (
    BENCH_JSON,
    BREAKDOWN_CSV,
    CONFIG_TOML,
    LOSS_CHECK_JSON,
    PROBE_CSV,
    THROUGHPUT_CSV,
    TOKENS_JSON,
    TRAIN_LOG_CSV,
)

# The trial fields plan.json and probe.csv keep (a Trial's timing details stay in the worker).
TRIAL_COLUMNS = ["micro_batch", "fits", "peak_bytes", "micro_steps_peak_bytes", "seconds", "completed_steps", "error"]


@dataclass(frozen=True)
class TableSchema:
    """A CSV's columns: required ones must be there; optional ones are NA when a partial or older writer left them out."""

    name: str
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    text: frozenset[str] = frozenset()
    boolean: frozenset[str] = frozenset()

    @property
    def columns(self) -> list[str]:
        return [*self.required, *self.optional]


THROUGHPUT = TableSchema(
    THROUGHPUT_CSV,
    required=("split", "kind", "micro_batch", "grad_accum_steps", "effective_batch", "samples_per_s"),
    optional=("repeats", "step_seconds_median", "step_seconds_min", "step_seconds_max", "tokens_per_s", "peak_bytes",
              "fits_budget", "bounded", "ratio_to_large_batch", "note",
              # bench in rounds: the 95% intervals, the rounds each split ran, CPU seconds per wall second
              "rounds", "samples_per_s_low", "samples_per_s_high", "ratio_low", "ratio_high", "cpu_per_wall",
              "probe_peak_bytes",
              # bench --batch-by tokens (absent from older files and from other benches: NA)
              "batch_by", "token_budget", "micro_steps_mean", "padding_fraction", "tokens_ratio"),
    text=frozenset({"split", "kind", "note", "batch_by"}), boolean=frozenset({"fits_budget", "bounded"}))
BREAKDOWN = TableSchema(BREAKDOWN_CSV, required=("micro_batch", *BREAKDOWN_CATEGORIES),
                        optional=("tracked_total", "device_peak_bytes"))
TRAIN_LOG = TableSchema(TRAIN_LOG_CSV, required=("step", "loss", "samples_per_s"),
                        optional=("lr", "tokens_per_s", "peak_bytes", "micro_batch", "grad_accum_steps", "seconds",
                                  # later columns, NA in older logs (gaplan.training.train_log says what each is)
                                  "step_peak_bytes", "padded_tokens_per_s", "noise_scale", "grad_sq", "grad_var",
                                  "noise_scale_items", "effective_batch", "step_grad_sq", "step_grad_var",
                                  "items_per_sample"))


# ---------------------------------------------------------------------------------------------------------------------
# plan.json


def _read_json(path: str, what: str) -> Any:
    """A JSON file's content; a missing or unreadable file is one line naming ``what`` it should have been."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise GaplanError(f"{what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GaplanError(one_line(f"cannot read {what} {path}: {exc}")) from None


def read_plan_json(path: str) -> dict[str, Any]:
    """Read and check a ``plan.json``; the dict as written (see :func:`check_plan`)."""
    return check_plan(_read_json(path, "plan file"), path)


def check_plan(data: object, path: str) -> dict[str, Any]:
    """Check that ``data`` is a complete plan file: the fields every reader needs, numbers where numbers go.

    A plan made without a probe (``probed`` false) has no trials and may have no budget
    (``memory_limit_bytes`` null).
    """
    if not isinstance(data, dict):
        raise GaplanError(f"{path} is not a gaplan plan file: expected a JSON object")
    missing = [key for key in ("workload", "device", "memory_limit_bytes", "max_micro_batch", "plan") if key not in data]
    for section, keys in (("workload", ("model",)), ("plan", ("effective_batch", "micro_batch", "grad_accum_steps"))):
        if section in data:
            if not isinstance(data[section], dict):
                raise GaplanError(f"{path}: {section} must be a JSON object")
            missing += [f"{section}.{key}" for key in keys if key not in data[section]]
    if missing:
        raise GaplanError(f"{path} is not a gaplan plan file: missing {', '.join(missing)}")
    for key, value in (("max_micro_batch", data["max_micro_batch"]), ("workload.model", data["workload"]["model"]),
                       *((f"plan.{key}", data["plan"][key]) for key in ("effective_batch", "micro_batch",
                                                                         "grad_accum_steps"))):
        if value is None:  # what every reader needs: null read as Python's own words ("int() argument must be ...")
            raise GaplanError(f"{path}: {key} is null; a plan file holds it")
    for key in ("memory_limit_bytes", "probe_limit_bytes", "max_micro_batch", "param_count", "static_bytes",
                "world_size", "trial_ranks", "token_budget"):
        _check_number(path, key, data.get(key), whole=True)
    for key in ("effective_batch", "micro_batch", "grad_accum_steps", "world_size"):
        _check_number(path, f"plan.{key}", data["plan"].get(key), whole=True)
    trials = data.get("trials") or []
    if not isinstance(trials, list) or not all(isinstance(t, dict) for t in trials):
        raise GaplanError(f"{path}: trials must be a list of JSON objects")
    for index, trial in enumerate(trials):
        if "micro_batch" not in trial or "fits" not in trial:
            raise GaplanError(f"{path}: trial {index + 1} lacks micro_batch or fits")
        for key in ("micro_batch", "peak_bytes", "micro_steps_peak_bytes", "completed_steps"):
            _check_number(path, f"trials[{index}].{key}", trial.get(key), whole=True)
        _check_number(path, f"trials[{index}].seconds", trial.get("seconds"))
    return data


def write_plan_json(path: str, data: dict[str, Any]) -> None:
    """Write a plan file atomically (a reader never sees half of it)."""
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def was_probed(plan: dict[str, Any]) -> bool:
    """False for a plan made with ``--micro-batch``: no probe ran, so no trials, budget edge or static bytes."""
    return bool(plan.get("probed", True))


def _check_number(path: str, name: str, value: object, whole: bool = False) -> None:
    # None is allowed: absent optional fields; bools are numbers to Python but never meant here. A count or a size
    # (``whole``) is a whole number, 0 or more: a hand-edited Infinity, 2.5 or -1 is one line, not a traceback.
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise GaplanError(f"{path}: {name} must be a number (got {value!r})")
    if whole and value is not None and not (math.isfinite(value) and float(value).is_integer() and value >= 0):
        raise GaplanError(f"{path}: {name} must be a whole number, 0 or more (got {value!r})")


# ---------------------------------------------------------------------------------------------------------------------
# tokens.json (probe/bench --batch-by tokens): the data's length profile and the token budget T*

_PROFILE_NUMBERS = ("count", "shortest", "longest", "median", "p90", "p99", "mean")
_BUDGET_NUMBERS = ("token_budget", "granule", "shortest", "longest", "short_edge", "long_edge")


def read_tokens_json(path: str) -> dict[str, Any]:
    """Read and check a ``tokens.json``; the dict as written (see :func:`check_tokens`)."""
    return check_tokens(_read_json(path, "token plan"), path)


def check_tokens(data: object, path: str = TOKENS_JSON) -> dict[str, Any]:
    """Check that ``data`` is a complete token plan: the workload, the length profile and T* with its edges."""
    if not isinstance(data, dict):
        raise GaplanError(f"{path} is not a gaplan token plan: expected a JSON object")
    missing = [key for key in ("workload", "profile", "token_budget") if not isinstance(data.get(key), dict)]
    if missing:
        raise GaplanError(f"{path} is not a gaplan token plan: missing {', '.join(missing)}")
    missing = [f"profile.{k}" for k in _PROFILE_NUMBERS if k not in data["profile"]]
    missing += [f"token_budget.{k}" for k in _BUDGET_NUMBERS if k not in data["token_budget"]]
    missing += [] if "model" in data["workload"] else ["workload.model"]
    if missing:
        raise GaplanError(f"{path} is not a gaplan token plan: missing {', '.join(missing)}")
    for section, keys in (("profile", _PROFILE_NUMBERS), ("token_budget", _BUDGET_NUMBERS)):
        for key in keys:
            _check_number(path, f"{section}.{key}", data[section][key])
    _check_number(path, "memory_limit_bytes", data.get("memory_limit_bytes"))
    for key in ("histogram", "length_counts"):
        rows = data["profile"].get(key) if key == "histogram" else data.get(key)
        if rows is None:
            continue
        if not isinstance(rows, list) or not all(isinstance(row, list) and all(
                isinstance(v, int) and not isinstance(v, bool) for v in row) for row in rows):
            raise GaplanError(f"{path}: {key} must be a list of lists of integers")
    return data


def write_tokens_json(path: str, data: dict[str, Any]) -> None:
    """Write a token plan atomically (checked first: a writer's bug must not leave a file no reader takes)."""
    atomic_write_text(path, json.dumps(check_tokens(data, path), indent=2) + "\n")


# ---------------------------------------------------------------------------------------------------------------------
# loss_check.json (train): step 1's accumulated loss against the same samples as one batch, or why it was skipped

_LOSS_CHECK_NUMBERS = ("accumulated_loss", "large_batch_loss", "absolute_difference", "relative_difference")


def read_loss_check_json(path: str) -> dict[str, Any]:
    """Read and check a ``loss_check.json``; the dict as written."""
    return check_loss_check(_read_json(path, "loss check"), path)


def check_loss_check(data: object, path: str = LOSS_CHECK_JSON) -> dict[str, Any]:
    """Both losses (and their differences) as numbers, or a one-line ``skipped`` reason."""
    if not isinstance(data, dict):
        raise GaplanError(f"{path} is not a gaplan loss check: expected a JSON object")
    if data.get("skipped") is not None:
        if not isinstance(data["skipped"], str):
            raise GaplanError(f"{path}: skipped must be a line of text")
        return data
    for key in _LOSS_CHECK_NUMBERS:
        # The relative difference is None when the one-batch loss is 0; the losses themselves are always there.
        if data.get(key) is None and key != "relative_difference":
            raise GaplanError(f"{path} is not a gaplan loss check: missing {key}")
        _check_number(path, key, data.get(key))
    return data


def write_loss_check_json(path: str, data: dict[str, Any]) -> None:
    """Write a loss check atomically (checked first, as every file of the folder)."""
    atomic_write_text(path, json.dumps(check_loss_check(data, path), indent=2) + "\n")


# ---------------------------------------------------------------------------------------------------------------------
# bench.json: how a bench's rounds ended, the plan's ratio with its interval, what the timings say about the machine


def read_bench_json(path: str) -> dict[str, Any]:
    """Read and check a ``bench.json``; the dict as written."""
    return check_bench(_read_json(path, "bench summary"), path)


def check_bench(data: object, path: str = BENCH_JSON) -> dict[str, Any]:
    """The rounds as a number, the texts as text, the plan's ratio (when there is one) as numbers."""
    if not isinstance(data, dict):
        raise GaplanError(f"{path} is not a gaplan bench summary: expected a JSON object")
    _check_number(path, "rounds", data.get("rounds"))
    for key in ("verdict", "contention", "stopped_because"):
        if not isinstance(data.get(key, ""), str):
            raise GaplanError(f"{path}: {key} must be a line of text")
    ratio = data.get("plan_vs_large_batch")
    if ratio is not None:
        if not isinstance(ratio, dict):
            raise GaplanError(f"{path}: plan_vs_large_batch must be a JSON object")
        _check_number(path, "plan_vs_large_batch.ratio", ratio.get("ratio"))
        interval = ratio.get("ci")
        if interval is not None and (not isinstance(interval, list) or len(interval) != 2):
            raise GaplanError(f"{path}: plan_vs_large_batch.ci must be [low, high]")
        for value in interval or []:
            _check_number(path, "plan_vs_large_batch.ci", value)
    return data


def write_bench_json(path: str, data: dict[str, Any]) -> None:
    """Write a bench summary atomically (checked first)."""
    atomic_write_text(path, json.dumps(check_bench(data, path), indent=2) + "\n")


# ---------------------------------------------------------------------------------------------------------------------
# CSVs


def trials_frame(trials: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The probe trials as a frame with stable dtypes (nullable integers, so sizes stay exact in CSV)."""
    frame = pd.DataFrame([{column: trial.get(column) for column in TRIAL_COLUMNS} for trial in trials], columns=TRIAL_COLUMNS)
    return frame.astype({"micro_batch": "int64", "fits": "bool", "peak_bytes": "Int64", "micro_steps_peak_bytes": "Int64",
                         "seconds": "float64", "completed_steps": "Int64", "error": "object"})


def write_trials_csv(run_dir: str, trials: Sequence[dict[str, Any]]) -> None:
    """``probe.csv``: one row per trial, in the order they ran."""
    frame = trials_frame(trials)
    atomic_write(os.path.join(run_dir, PROBE_CSV), lambda path: frame.to_csv(path, index=False))


def write_table(run_dir: str, schema: TableSchema, rows: Sequence[dict[str, Any]]) -> None:
    """A measurement table (``throughput.csv``, ``breakdown.csv``) written atomically; the required columns first."""
    missing = {column for row in rows for column in schema.required if column not in row}
    if missing:
        raise ValueError(f"{schema.name} rows lack {', '.join(sorted(missing))}")  # a bug in the writer, not the user's
    frame = pd.DataFrame(list(rows)) if rows else pd.DataFrame(columns=schema.columns)  # a header even when empty
    for column in frame.columns:
        values = [row[column] for row in rows if row.get(column) is not None]  # as given: pandas made them floats
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            frame[column] = frame[column].astype("Int64")  # 926351360, not 926351360.0, where some rows have none
    ordered = [c for c in schema.columns if c in frame.columns] + [c for c in frame.columns if c not in schema.columns]
    atomic_write(os.path.join(run_dir, schema.name), lambda path: frame[ordered].to_csv(path, index=False))


def read_table(run_dir: str, schema: TableSchema) -> pd.DataFrame | None:
    """A run folder's CSV with its columns checked and typed; None when the file is absent."""
    path = os.path.join(run_dir, schema.name)
    if not os.path.exists(path):
        return None
    try:
        frame = pd.read_csv(path, keep_default_na=True)
    except pd.errors.EmptyDataError:
        raise GaplanError(f"{path} is empty: expected a header with columns {', '.join(schema.required)}") from None
    except (OSError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise GaplanError(one_line(f"cannot read {path}: {exc}")) from None
    missing = [column for column in schema.required if column not in frame.columns]
    if missing:
        raise GaplanError(f"{path} is missing columns: {', '.join(missing)}")
    if len(frame) and _ends_mid_row(path):  # a write cut off (a full disk, a kill): its last row is not whole
        if schema.name != TRAIN_LOG_CSV:  # a row of results read as NaN would be drawn and judged: refused
            raise GaplanError(f"{path} ends mid-row (cut off while it was written): rebuild it with the command "
                              "that made it")
        frame = frame.iloc[:-1]  # a log's last step cut off by a crash: the steps before it are whole
    for column in schema.optional:
        if column not in frame.columns:
            frame[column] = pd.NA
    for column in schema.columns:
        if column in schema.text:
            frame[column] = frame[column].map(lambda value: "" if pd.isna(value) else str(value))
        elif column in schema.boolean:
            frame[column] = _bool_column(path, column, frame[column])
        else:
            frame[column] = _number_column(path, column, frame[column])
    return frame


def _ends_mid_row(path: str) -> bool:
    """gaplan's CSV writers end every row with a newline: a file that does not was cut off mid-row."""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() == 0:
            return False
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) not in (b"\n", b"\r")


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


def save_run_config(run_dir: str, text: str | None) -> None:
    """The command's options as ``--config`` reads them, as the run folder's ``config.toml`` (None: nothing)."""
    if text is not None:
        atomic_write_text(os.path.join(run_dir, CONFIG_TOML), text)
