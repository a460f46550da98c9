"""``train_log.csv``: rows appended in the file's own columns, so a log an older gaplan began still reads."""

import csv

import pandas as pd

from gaplan.training.train_log import LOG_FIELDS, StepLog, append_log


def _row(step):
    return StepLog(step, 2.5, 1e-3, 10.0, 100.0, None, 4, 2, 0.5, noise_scale=3.0, grad_sq=1.0, grad_var=3.0,
                   noise_scale_items=30.0)


def test_a_new_log_has_every_column_and_an_older_one_keeps_its_own(tmp_path):
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    append_log(str(fresh), _row(1))
    table = pd.read_csv(fresh / "train_log.csv")
    assert list(table.columns) == LOG_FIELDS and table["noise_scale_items"].tolist() == [30.0]

    older = tmp_path / "older"  # begun before the noise-scale columns, resumed now
    older.mkdir()
    columns = LOG_FIELDS[:LOG_FIELDS.index("noise_scale")]
    with open(older / "train_log.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerow([1, 2.6, 1e-3, 10.0, 100.0, "", 4, 2, 0.5, "", ""])
    append_log(str(older), _row(2))
    table = pd.read_csv(older / "train_log.csv")
    assert list(table.columns) == columns and table["step"].tolist() == [1, 2]


def test_a_damaged_log_a_resume_goes_on_with_keeps_a_header_and_a_cut_short_one_still_reports(tmp_path):
    """An emptied log was appended to without a header (then refused by every report); a log cut short before the
    checkpoint's step got a gap the report blamed on "two runs"."""
    from gaplan.report.load import _one_run_log
    from gaplan.training.train_log import truncate_log

    (tmp_path / "train_log.csv").write_text("")
    truncate_log(str(tmp_path), 6)
    append_log(str(tmp_path), _row(7))
    assert pd.read_csv(tmp_path / "train_log.csv")["step"].tolist() == [7]
    (tmp_path / "train_log.csv").write_text("7,8.3,0.001\n")  # rows without their header
    truncate_log(str(tmp_path), 6)
    append_log(str(tmp_path), _row(7))
    assert list(pd.read_csv(tmp_path / "train_log.csv").columns) == LOG_FIELDS
    for rows, refused in (([1, 2, 7, 8], False), ([1, 2, 2, 3], True), ([1, 3, 2], True)):
        try:
            _one_run_log(str(tmp_path), pd.DataFrame({"step": rows}))
        except Exception as exc:  # noqa: BLE001 - the refusal is the point
            assert refused and "two runs wrote into the folder" in str(exc)
        else:
            assert not refused


def test_a_new_run_in_a_used_folder_starts_its_own_log(tmp_path):
    """Once appended after the old run's rows: two step 1s in one log."""
    from gaplan.plan.split import make_plan
    from gaplan.training.loop import TrainConfig, train
    from gaplan.workload.build import WorkloadSpec, build_workload

    spec = WorkloadSpec(model="tests.training.linear_regression:make", optimizer="sgd", lr=1e-12)
    for _ in range(2):
        train(build_workload(spec, "cpu", seed=0), make_plan(8, 4), None,
              TrainConfig(steps=3, seed=0, run_dir=str(tmp_path)))
    assert pd.read_csv(tmp_path / "train_log.csv")["step"].tolist() == [1, 2, 3]


def test_docs_train_page_names_every_column_of_the_log():
    """docs/train.md lists train_log.csv's columns: a column added without it fails here."""
    import os
    import re

    from tests.conftest import REPO_ROOT

    with open(os.path.join(REPO_ROOT, "docs", "train.md"), encoding="utf-8") as handle:
        text = handle.read()
    paragraph = text[text.index("`train_log.csv` (step, loss"):text.index("and `plan.json` in the run")]
    named = set(re.findall(r"`([a-z_]+)`", paragraph))
    first = {"step", "loss", "lr", "samples_per_s", "tokens_per_s", "peak_bytes", "micro_batch", "grad_accum_steps",
             "seconds"}  # named in words at the start of the list
    assert set(LOG_FIELDS) - first <= named, sorted(set(LOG_FIELDS) - first - named)
