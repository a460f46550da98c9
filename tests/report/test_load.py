"""Reading a run folder: parsed inputs, one-line errors on anything unusable, and the facts derived from them."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from gaplan.core.errors import GaplanError
from gaplan.report import load_run, memory_fit, reference_row, write_report
from tests.report.runs import (
    BUDGET,
    PER_SAMPLE,
    TRIALS,
    make_run,
    plan_json,
    throughput_rows,
    train_log_rows,
    trial,
    unprobed_plan_json,
)


def test_load_run_parses_inputs(tmp_path: Path) -> None:
    run = load_run(str(make_run(tmp_path)))
    assert run.plan["max_micro_batch"] == 35 and run.model == "tiny-gpt2"
    assert run.trials["micro_batch"].tolist() == [t["micro_batch"] for t in TRIALS]
    assert run.throughput is not None and run.throughput["bounded"].tolist() == [True, True, True, False]
    assert run.breakdown is not None and len(run.breakdown) == 3
    assert run.train_log is not None and run.train_log["peak_bytes"].isna().sum() == 1
    assert run.probed and run.budget == BUDGET and run.memory_limit == BUDGET


@pytest.mark.parametrize("plan, budget", [
    (unprobed_plan_json(), None),
    (unprobed_plan_json(memory_limit=BUDGET), BUDGET),
    ({**plan_json([]), "memory_limit_bytes": 0, "probe_limit_bytes": 0}, None),  # older files: 0 for "none"
])
def test_a_plan_without_a_probe(tmp_path: Path, plan: dict, budget: int | None) -> None:
    run = load_run(str(make_run(tmp_path, full=False, plan=plan)))
    assert not run.probed and run.budget == budget and run.memory_limit == budget


def test_memory_fit_recovers_the_line(tmp_path: Path) -> None:
    fit = memory_fit(load_run(str(make_run(tmp_path, full=False))).trials)
    assert fit is not None and fit.points >= 2
    assert fit.bytes_per_sample == pytest.approx(PER_SAMPLE, rel=1e-6)


def assert_one_line_error(directory: Path, *fragments: str) -> None:
    with pytest.raises(GaplanError) as caught:
        write_report(str(directory))
    message = str(caught.value)
    assert message and "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_folder_without_plan_json(tmp_path: Path) -> None:
    assert_one_line_error(tmp_path, f"{tmp_path} is not a gaplan run folder: no plan.json")
    assert_one_line_error(tmp_path / "absent", f"{tmp_path / 'absent'}: no such folder")
    (tmp_path / "a-file").write_text("x")
    assert_one_line_error(tmp_path / "a-file", f"{tmp_path / 'a-file'}: not a folder")
    (tmp_path / "layouts.json").write_text("{}")  # gaplan plan's folder: its report is plan's own
    assert_one_line_error(tmp_path, f"{tmp_path} is a gaplan plan folder: gaplan plan writes its report whole")


@pytest.mark.parametrize("content, fragment", [
    ("{not json at all", "cannot read"),
    ("[1, 2, 3]", "expected a JSON object"),
    ('{"workload": {"model": "m"}, "device": "cpu"}', "missing memory_limit_bytes, max_micro_batch, plan"),
    ('{"workload": {}, "device": "cpu", "memory_limit_bytes": 1, "max_micro_batch": 1, "plan": {}}', "workload.model"),
])
def test_garbage_plan_json(tmp_path: Path, content: str, fragment: str) -> None:
    (tmp_path / "plan.json").write_text(content)
    assert_one_line_error(tmp_path, "plan.json", fragment)


def test_bad_trial_value(tmp_path: Path) -> None:
    data = plan_json([{**trial(4, True), "peak_bytes": "lots"}])
    (tmp_path / "plan.json").write_text(json.dumps(data))
    assert_one_line_error(tmp_path, "trials[0].peak_bytes must be a number")


def test_throughput_csv_missing_columns(tmp_path: Path) -> None:
    make_run(tmp_path, full=False)
    pd.DataFrame([{"split": "plan", "kind": "plan", "micro_batch": 32}]).to_csv(tmp_path / "throughput.csv", index=False)
    assert_one_line_error(tmp_path, "throughput.csv is missing columns", "samples_per_s", "grad_accum_steps")


def test_csv_with_text_in_a_number_column(tmp_path: Path) -> None:
    make_run(tmp_path, full=False)
    rows = train_log_rows()
    rows[2]["loss"] = "nan-ish"
    pd.DataFrame(rows).to_csv(tmp_path / "train_log.csv", index=False)
    assert_one_line_error(tmp_path, "train_log.csv", "loss", "nan-ish")


def test_reference_falls_back_to_the_largest_fit(tmp_path: Path) -> None:
    make_run(tmp_path, full=False)
    rows = throughput_rows()
    rows[3].update(samples_per_s=None, tokens_per_s=None, ratio_to_large_batch=None, note="not run")  # large batch skipped
    rows.append({**rows[0], "split": "35 x 8", "kind": "largest-fit", "micro_batch": 35, "samples_per_s": 18.5})
    pd.DataFrame(rows).to_csv(tmp_path / "throughput.csv", index=False)
    run = load_run(str(tmp_path))
    assert run.throughput is not None
    reference = reference_row(run.throughput)
    assert reference is not None and reference["kind"] == "largest-fit" and reference["samples_per_s"] == 18.5
