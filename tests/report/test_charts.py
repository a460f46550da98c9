"""The report's charts: whole-number step ticks, labelled categories, and no matplotlib warnings on edge cases."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd
import pytest

from gaplan.report import load_run, write_report
from gaplan.report.charts import breakdown_figure, training_figure
from tests.report.runs import breakdown_rows, make_run, plan_json, train_log_rows, trial, unprobed_plan_json


def run_with_log(directory: Path, losses: tuple[float, ...], plan: dict | None = None) -> Path:
    make_run(directory, plan=plan)
    pd.DataFrame(train_log_rows(losses)).to_csv(directory / "train_log.csv", index=False)
    return directory


def test_training_steps_are_whole_numbers(tmp_path: Path) -> None:
    figure = training_figure(load_run(str(run_with_log(tmp_path, (3.0, 2.5, 2.0)))))
    for axes in figure.axes:
        ticks = axes.xaxis.get_majorticklocs()
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks


def test_breakdown_legend_says_what_other_holds(tmp_path: Path) -> None:
    figure = breakdown_figure(load_run(str(make_run(tmp_path))))
    labels = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert "other (temporaries: logits, loss buffers, optimizer-step scratch)" in labels
    assert "optimizer states" in labels


@pytest.mark.parametrize("plan, losses", [
    (unprobed_plan_json(), (4.0,)),  # no budget, one step
    ({**plan_json([]), "memory_limit_bytes": 0, "probe_limit_bytes": 0}, (4.0, 4.0)),  # an older file: 0 B, flat loss
    (plan_json([trial(4, True)]), (0.0, 0.0, 0.0)),  # one trial: no memory line; a loss of exactly 0
], ids=["no-budget-one-step", "zero-budget-flat-loss", "one-trial-zero-loss"])
def test_edge_cases_render_without_warnings(tmp_path: Path, plan: dict, losses: tuple[float, ...]) -> None:
    run_with_log(tmp_path, losses, plan)
    pd.DataFrame(breakdown_rows()[:1]).to_csv(tmp_path / "breakdown.csv", index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        written = write_report(str(tmp_path))
    assert "training.png" in written.files and "breakdown.png" in written.files
