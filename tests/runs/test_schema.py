"""The run folder's file formats: tables and plan.json written and read back, and one checker for every reader."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from gaplan.core.errors import GaplanError
from gaplan.report import write_report
from gaplan.runs.probe_result import ProbeResult, load_probe
from gaplan.runs.schema import BREAKDOWN, THROUGHPUT, TRAIN_LOG, check_plan, read_plan_json, read_table, write_table
from tests.report.runs import TRIALS, breakdown_rows, plan_json, throughput_rows, train_log_rows, unprobed_plan_json


@pytest.mark.parametrize("schema, rows", [(THROUGHPUT, throughput_rows()), (BREAKDOWN, breakdown_rows()),
                                          (TRAIN_LOG, train_log_rows())], ids=["throughput", "breakdown", "train-log"])
def test_table_round_trip(tmp_path: Path, schema, rows: list[dict]) -> None:
    shuffled = [dict(reversed(list(row.items()))) for row in rows]  # the writer orders the columns, not the caller
    write_table(str(tmp_path), schema, shuffled)
    assert list(pd.read_csv(tmp_path / schema.name).columns) == [c for c in schema.columns if c in rows[0]]
    frame = read_table(str(tmp_path), schema)
    assert frame is not None and len(frame) == len(rows)
    for read, written in zip(frame.to_dict("records"), rows, strict=True):
        for column, value in written.items():
            if value is None:
                assert pd.isna(read[column]), column
            elif isinstance(value, str):
                assert read[column] == value, column
            else:
                assert read[column] == pytest.approx(value), column


def test_a_table_read_fills_optional_columns_and_an_absent_one_is_none(tmp_path: Path) -> None:
    assert read_table(str(tmp_path), THROUGHPUT) is None
    write_table(str(tmp_path), TRAIN_LOG, [{"step": 1, "loss": 2.5, "samples_per_s": 10.0}])
    frame = read_table(str(tmp_path), TRAIN_LOG)
    assert frame is not None and list(frame.columns) == TRAIN_LOG.columns and frame["peak_bytes"].isna().all()


def test_a_writer_that_forgets_a_required_column_is_a_bug(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="samples_per_s"):
        write_table(str(tmp_path), TRAIN_LOG, [{"step": 1, "loss": 2.5}])
    assert not (tmp_path / TRAIN_LOG.name).exists()


@pytest.mark.parametrize("data", [plan_json(TRIALS), unprobed_plan_json(), unprobed_plan_json(2**30)],
                         ids=["probed", "micro-batch", "micro-batch-with-budget"])
def test_plan_round_trip_through_probe_result(tmp_path: Path, data: dict) -> None:
    result = ProbeResult.from_dict(data)
    again = result.to_dict()
    check_plan(again, "again")
    for key in ("probed", "memory_limit_bytes", "probe_limit_bytes", "max_micro_batch", "param_count", "static_bytes",
                "task", "tuner"):
        assert again[key] == data.get(key, True if key == "probed" else None), key
    for key in ("effective_batch", "micro_batch", "grad_accum_steps", "micro_batch_sizes", "world_size"):
        assert again["plan"][key] == data["plan"][key], key
    assert again["trials"] == data["trials"]


def broken_plans() -> list[tuple[str, dict]]:
    no_device = plan_json(TRIALS)
    del no_device["device"]
    no_micro = plan_json(TRIALS)
    del no_micro["plan"]["micro_batch"]
    text_budget = {**plan_json(TRIALS), "memory_limit_bytes": "1GB"}
    bad_trial = plan_json([{"micro_batch": 4}])
    # Hand-edited numbers: Infinity was an OverflowError traceback, 2.5 was cut to 2, -1 taken as a budget.
    infinite = {**plan_json(TRIALS), "max_micro_batch": float("inf")}
    fraction = {**plan_json(TRIALS), "max_micro_batch": 2.5}
    negative = {**plan_json(TRIALS), "memory_limit_bytes": -1}
    no_edge = {**plan_json(TRIALS), "max_micro_batch": None}
    no_model = {**plan_json(TRIALS), "workload": {**plan_json(TRIALS)["workload"], "model": None}}
    return [("device", no_device), ("plan.micro_batch", no_micro), ("memory_limit_bytes must be a number", text_budget),
            ("trial 1 lacks micro_batch or fits", bad_trial),
            ("max_micro_batch must be a whole number, 0 or more (got inf)", infinite),
            ("max_micro_batch must be a whole number, 0 or more (got 2.5)", fraction),
            ("memory_limit_bytes must be a whole number, 0 or more (got -1)", negative),
            ("max_micro_batch is null; a plan file holds it", no_edge),
            ("workload.model is null; a plan file holds it", no_model)]


@pytest.mark.parametrize("fragment, data", broken_plans(), ids=[f for f, _ in broken_plans()])
def test_probe_result_and_report_reject_a_broken_plan_alike(tmp_path: Path, fragment: str, data: dict) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    messages = []
    for read in (lambda: load_probe(str(path)), lambda: ProbeResult.from_dict(data, str(path)),
                 lambda: read_plan_json(str(path)), lambda: write_report(str(tmp_path))):
        with pytest.raises(GaplanError) as caught:
            read()
        messages.append(str(caught.value))
    assert len(set(messages)) == 1, messages
    message = messages[0]
    assert fragment in message and str(path) in message and "\n" not in message

    from gaplan.cli.main import main  # the command line prints the same line

    result = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert result.exit_code == 2 and result.output == f"gaplan: {message}\n"


def test_a_table_cut_off_mid_row_is_refused_and_a_logs_cut_last_step_is_dropped(tmp_path: Path) -> None:
    """A truncated throughput.csv rendered as an empty row under an unchanged verdict (sweep 19); a log's last row cut
    by a crash is the one step not whole."""
    import shutil

    from gaplan.cli.main import main

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[2] / "reports" / "probe-tiny-gpt2-default", run)
    whole = (run / "throughput.csv").read_bytes()
    (run / "throughput.csv").write_bytes(whole[:300])
    with pytest.raises(GaplanError, match="throughput.csv ends mid-row"):
        read_table(str(run), THROUGHPUT)
    result = CliRunner().invoke(main, ["report", str(run)])
    assert result.exit_code == 2 and "ends mid-row (cut off while it was written)" in result.output
    (run / "train_log.csv").write_text("step,loss,samples_per_s\n1,2.5,10.0\n2,2.4,10.0\n3,2.")
    assert read_table(str(run), TRAIN_LOG)["step"].tolist() == [1.0, 2.0]
