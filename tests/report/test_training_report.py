"""The training report: its title and order, gaplan's claim checked, one named peak, labelled tokens/s, the cache."""

import json
from pathlib import Path

import pandas as pd

from gaplan.report.charts import training_figure
from gaplan.report.load import load_run
from gaplan.report.write import write_report
from tests.report.runs import MIB, TRIALS, make_run, plan_json, train_log_rows

CHECK = {"step": 1, "samples": 256, "micro_steps": 8, "accumulated_loss": 10.912345, "large_batch_loss": 10.912344,
         "skipped": None, "absolute_difference": 1e-6, "relative_difference": 9.2e-8}


def new_log_rows() -> list[dict]:
    """A log as training writes it now: the probe's peak and padded tokens/s beside the older columns."""
    return [{**row, "step_peak_bytes": 900 * MIB + row["step"] * MIB, "peak_bytes": 1200 * MIB,
             "padded_tokens_per_s": row["samples_per_s"] * 128} for row in train_log_rows()]


def training_run(directory: Path, rows: list[dict] | None = None, check: dict | None = CHECK,
                 plan: dict | None = None) -> Path:
    make_run(directory, full=False, plan=plan)
    pd.DataFrame(rows or new_log_rows()).to_csv(directory / "train_log.csv", index=False)
    if check is not None:
        (directory / "loss_check.json").write_text(json.dumps(check))
    return directory


def report(directory: Path) -> str:
    write_report(str(directory))
    return (directory / "report.md").read_text()


def training_part(text: str) -> str:
    return text.split("## Training", 1)[1].split("\n## ", 1)[0]


def test_a_training_folder_has_its_own_title_and_leads_with_training(tmp_path):
    text = report(training_run(tmp_path / "train"))
    assert text.startswith("# gaplan training report: tiny-gpt2")
    assert text.index("## Training") < text.index("## Plan") < text.index("## Probe trials")
    assert "<title>gaplan training report: tiny-gpt2</title>" in (tmp_path / "train" / "report.html").read_text()


def test_a_training_folder_stopped_before_its_first_step_says_so(tmp_path):
    run = make_run(tmp_path / "train", full=False)
    pd.DataFrame(columns=list(new_log_rows()[0])).to_csv(run / "train_log.csv", index=False)  # the header only
    text = report(run)
    assert text.startswith("# gaplan training report: tiny-gpt2")
    assert "No step logged: the run stopped before its first step ended." in training_part(text)
    assert not (run / "training.png").exists()


def test_a_probe_folder_keeps_its_title_and_order(tmp_path):
    text = report(make_run(tmp_path / "probe", full=False))
    assert text.startswith("# gaplan report: tiny-gpt2") and "## Training" not in text
    assert text.index("## Plan") < text.index("## Probe trials")


def test_the_claim_is_shown_with_both_losses_and_their_difference(tmp_path):
    part = training_part(report(training_run(tmp_path / "run")))
    assert ("**Accumulated loss vs one large batch (step 1):** 10.912345 accumulated over 8 micro-steps, 10.912344 "
            "as one batch of 256 samples") in part
    assert "difference 1.00e-06 (9.20e-08 relative)" in part


def test_a_skipped_check_says_why(tmp_path):
    reason = "one batch of the step's 256 samples is 8x the micro-batch (32); the check runs up to 2x"
    part = training_part(report(training_run(tmp_path / "run", check={"step": 1, "samples": 256, "skipped": reason})))
    assert f"**Accumulated loss vs one large batch (step 1):** not checked: {reason}" in part


def test_the_peak_is_the_probes_and_the_process_figure_is_named_and_explained(tmp_path):
    part = training_part(report(training_run(tmp_path / "run")))
    assert "**Peak (step):** 906.00 MiB of the 1.00 GiB budget (88%)" in part
    assert "as the probe measures its trials" in part
    assert "**Whole-process resident peak:** 1.17 GiB. It is more than the peak (step) because it also counts the " \
           "interpreter, the libraries, the data and the model code" in part
    assert "Peak memory:" not in part
    header = next(line for line in part.splitlines() if line.startswith("| step"))
    assert "peak (step)" in header and "whole-process resident peak" in header  # the memory over the steps


def test_an_older_log_still_reads_and_its_peak_is_called_whole_process(tmp_path):
    part = training_part(report(training_run(tmp_path / "old", rows=train_log_rows(), check=None)))
    assert "**Whole-process resident peak:**" in part and "**Peak (step):**" not in part
    assert "Accumulated loss vs one large batch" not in part and "padded tokens/s (" not in part
    assert "real tokens/s (attention-mask tokens, padding excluded)" in part


def test_both_tokens_per_second_are_labelled(tmp_path):
    part = training_part(report(training_run(tmp_path / "run")))
    line = next(line for line in part.splitlines() if line.startswith("- **Median throughput:**"))
    assert "real tokens/s (attention-mask tokens, padding excluded)" in line
    assert "padded tokens/s (token positions fed, padding included" in line


def test_a_reused_cached_probe_is_named_with_its_date_and_key(tmp_path):
    plan = {**plan_json(TRIALS), "reused_probe": {"path": "/cache/plans/0123abcd4567ef89.json",
                                                  "key": "0123abcd4567ef89", "created": "2026-11-20T10:00:00+00:00"}}
    text = report(training_run(tmp_path / "run", plan=plan))
    assert ("**Probe reused from the cache:** probed 2026-11-20T10:00:00+00:00, cache key `0123abcd4567ef89` "
            "(`/cache/plans/0123abcd4567ef89.json`)") in text
    assert "Probe reused" not in report(training_run(tmp_path / "fresh"))


def test_the_training_chart_draws_the_memory_over_the_steps(tmp_path):
    figure = training_figure(load_run(str(training_run(tmp_path / "run"))))
    memory = figure.axes[2]
    labels = [line.get_label() for line in memory.get_lines()]
    assert labels[:2] == ["peak (step), as the probe measures it", "whole-process resident peak"]
    rows = [{**row, "peak_bytes": None} for row in train_log_rows()]
    assert len(training_figure(load_run(str(training_run(tmp_path / "none", rows=rows)))).axes) == 2
