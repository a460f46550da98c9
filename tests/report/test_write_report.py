"""``write_report``: every file of a run folder's report, written atomically and reproducibly."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from gaplan.core.errors import GaplanError
from gaplan.report import ReportFiles, write_report
from tests.report.runs import TRIALS, make_run, plan_json, png_size, unprobed_plan_json


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ReportFiles]:
    directory = make_run(tmp_path_factory.mktemp("report") / "run")
    return directory, write_report(str(directory))


def test_writes_every_file_and_sane_images(full_run: tuple[Path, ReportFiles]) -> None:
    directory, written = full_run
    assert written.directory == str(directory)
    assert written.files == sorted(["probe.csv", "memory.png", "breakdown.png", "throughput.png", "training.png",
                                    "report.md", "report.html"])
    for name in written.files:
        assert (directory / name).stat().st_size > 0
    for name in (n for n in written.files if n.endswith(".png")):
        width, height = png_size(directory / name)
        assert 400 <= width <= 3000 and 400 <= height <= 3000, (name, width, height)
    assert not [n for n in os.listdir(directory) if ".tmp." in n]  # no temp files left behind


def test_html_is_self_contained(full_run: tuple[Path, ReportFiles]) -> None:
    directory, written = full_run
    page = (directory / "report.html").read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == len([n for n in written.files if n.endswith(".png")])
    assert 'src="http' not in page and "href=" not in page and "<script" not in page
    assert "tiny-gpt2" in page and "<table>" in page


def test_probe_csv_matches_plan_trials(full_run: tuple[Path, ReportFiles]) -> None:
    probe = pd.read_csv(full_run[0] / "probe.csv")
    assert list(probe.columns) == ["micro_batch", "fits", "peak_bytes", "micro_steps_peak_bytes", "seconds",
                                   "completed_steps", "error"]
    assert len(probe) == len(TRIALS)
    for row, expected in zip(probe.to_dict("records"), TRIALS, strict=True):
        for column, value in row.items():
            if expected[column] is None:
                assert pd.isna(value), column
            else:
                assert value == expected[column], column
    for name in ("throughput.csv", "breakdown.csv", "train_log.csv"):  # inputs are left as they were
        assert pd.read_csv(full_run[0] / name).shape[0] > 0


def test_rerun_on_a_copy_is_identical(full_run: tuple[Path, ReportFiles], tmp_path: Path) -> None:
    directory, written = full_run
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    for name in written.files:
        (copy / name).unlink()
    again = write_report(str(copy))
    assert again.files == written.files
    assert (copy / "probe.csv").read_bytes() == (directory / "probe.csv").read_bytes()
    assert (copy / "report.md").read_text(encoding="utf-8") == (directory / "report.md").read_text(encoding="utf-8")


def test_minimal_folder(tmp_path: Path) -> None:
    make_run(tmp_path, full=False)
    written = write_report(str(tmp_path))
    assert written.files == sorted(["memory.png", "probe.csv", "report.md", "report.html"])
    assert not any((tmp_path / name).exists() for name in ("breakdown.png", "throughput.png", "training.png"))
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "## Throughput" not in text and "## Training" not in text and "## Memory breakdown" not in text
    assert (tmp_path / "report.html").read_text(encoding="utf-8").count("data:image/png;base64,") == 1


@pytest.mark.parametrize("plan", [unprobed_plan_json(), plan_json([])], ids=["probed-false", "no-trials"])
def test_no_probe_draws_no_memory_chart(tmp_path: Path, plan: dict) -> None:
    make_run(tmp_path, plan=plan)
    written = write_report(str(tmp_path))
    assert "memory.png" not in written.files and not (tmp_path / "memory.png").exists()
    assert {"probe.csv", "throughput.png", "breakdown.png", "training.png", "report.md", "report.html"} <= set(written.files)
    assert pd.read_csv(tmp_path / "probe.csv").empty
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == 3 and "memory.png" not in page


def test_write_error_is_one_line(tmp_path: Path) -> None:
    make_run(tmp_path, full=False)
    (tmp_path / "report.md").mkdir()  # a folder where the page goes: the rename fails
    with pytest.raises(GaplanError) as caught:
        write_report(str(tmp_path))
    assert "cannot write" in str(caught.value) and "report.md" in str(caught.value) and "\n" not in str(caught.value)
    assert not [n for n in os.listdir(tmp_path) if ".tmp." in n]
    assert json.loads((tmp_path / "plan.json").read_text())["max_micro_batch"] == 35  # inputs untouched
