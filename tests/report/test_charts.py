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


def _legend(figure) -> list[str]:
    return [text.get_text() for text in figure.axes[0].get_legend().get_texts()]


def test_the_memory_chart_marks_the_planned_micro_batch_beside_b_star(tmp_path: Path) -> None:
    from gaplan.report.charts import memory_figure

    labels = _legend(memory_figure(load_run(str(make_run(tmp_path)))))  # B* 35, the plan 32 x 8
    assert "B* = 35" in labels and "planned micro-batch = 32 (32 x 8)" in labels


def test_equal_step_and_forward_backward_peaks_are_one_marker_not_two_that_hide_each_other(tmp_path: Path) -> None:
    from gaplan.report.charts import memory_figure

    same = [{**t, "peak_bytes": t["micro_steps_peak_bytes"]} if t["fits"] else t
            for t in (trial(1, True), trial(4, True), trial(16, True), trial(35, True), trial(36, False))]
    labels = _legend(memory_figure(load_run(str(make_run(tmp_path, plan=plan_json(same))))))
    assert "fits: peak of the step, set in forward/backward" in labels
    assert "fits: peak of the whole step" not in labels and "fits: peak of forward/backward" not in labels
    apart = _legend(memory_figure(load_run(str(make_run(tmp_path / "apart")))))  # the step adds 4 MiB
    assert {"fits: peak of the whole step", "fits: peak of forward/backward"} <= set(apart)


def test_the_throughput_chart_draws_the_intervals(tmp_path: Path) -> None:
    from gaplan.report.charts import throughput_figure

    make_run(tmp_path)
    rows = pd.read_csv(tmp_path / "throughput.csv")
    rows["samples_per_s_low"], rows["samples_per_s_high"] = rows["samples_per_s"] * 0.9, rows["samples_per_s"] * 1.1
    rows.to_csv(tmp_path / "throughput.csv", index=False)
    axes = throughput_figure(load_run(str(tmp_path))).axes[0]
    assert "95% intervals" in axes.get_title()
    assert axes.containers and any(type(c).__name__ == "ErrorbarContainer" for c in axes.containers)
    assert any(type(p).__name__ == "Rectangle" and p.get_alpha() == 0.12 for p in axes.patches), "the reference band"
