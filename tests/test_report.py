"""The run-folder report: built from hand-written CSV/JSON files, no model and no device."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pandas as pd
import pytest

from gaplan.errors import GaplanError
from gaplan.report import ReportFiles, load_run, reference_row, write_report

MIB = 2**20
BUDGET = 2**30
STATIC = 88_301_568
PER_SAMPLE = 53 * MIB // 2  # 26.5 MiB a sample: B* = 35 under 1 GiB (36 does not fit)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def micro_peak(micro_batch: int) -> int:
    return STATIC + PER_SAMPLE * micro_batch


def trial(micro_batch: int, fits: bool) -> dict:
    if not fits:
        return {"micro_batch": micro_batch, "fits": False, "peak_bytes": None, "seconds": 3.9,
                "error": "DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes", "completed_steps": 0,
                "micro_steps_peak_bytes": None}
    # The optimizer step adds a little on top of the forward/backward peak.
    return {"micro_batch": micro_batch, "fits": True, "peak_bytes": micro_peak(micro_batch) + 4 * MIB, "seconds": 0.7,
            "error": None, "completed_steps": 2, "micro_steps_peak_bytes": micro_peak(micro_batch)}


TRIALS = [trial(1, True), trial(4, True), trial(16, True), trial(64, False), trial(32, True), trial(36, False), trial(35, True)]


def plan_json(trials: list[dict]) -> dict:
    return {
        "gaplan_version": "0.1.0", "torch_version": "2.13.0+cpu", "created": "2026-11-29T08:22:21+00:00",
        "workload": {"model": "tiny-gpt2", "task": None, "seq_len": None, "dtype": "fp32", "optimizer": "adamw",
                     "lr": 0.0001, "grad_checkpointing": False},
        "device": "cpu", "memory_limit_bytes": BUDGET, "margin": 0.0, "probe_limit_bytes": BUDGET, "budget_is_default": True,
        "max_micro_batch": 35, "capped": False, "trials": trials,
        "plan": {"effective_batch": 256, "micro_batch": 32, "grad_accum_steps": 8, "micro_batch_sizes": [32] * 8,
                 "world_size": 1, "max_micro_batch": 35},
        "param_count": 5_518_848, "static_bytes": STATIC, "task": "causal-lm", "seq_len": 128, "wall_seconds": 39.2,
        "tuner": {"objective": "throughput", "micro_batch": 16, "grad_checkpointing": False,
                  "reason": "16 x 16 measured 18.2 samples/s, 4% above the largest micro-batch"},
    }


def throughput_rows() -> list[dict]:
    large = 15.0

    def row(split: str, kind: str, micro: int, steps: int, speed: float, bounded: bool = True, note: str = "") -> dict:
        fits = bounded
        peak = micro_peak(micro) + 4 * MIB
        return {"split": split, "kind": kind, "micro_batch": micro, "grad_accum_steps": steps, "effective_batch": micro * steps,
                "repeats": 3, "step_seconds_median": micro * steps / speed, "step_seconds_min": micro * steps / speed * 0.98,
                "step_seconds_max": micro * steps / speed * 1.03, "samples_per_s": speed, "tokens_per_s": speed * 128,
                "peak_bytes": peak, "fits_budget": fits, "bounded": bounded, "ratio_to_large_batch": speed / large,
                "note": note}

    return [row("plan", "plan", 32, 8, 17.5), row("16x16", "split", 16, 16, 18.2, note="tuner pick"),
            row("8x32", "split", 8, 32, 14.1), row("256x1", "large-batch", 256, 1, 15.0, bounded=False,
                                                   note="measured without the budget")]


def breakdown_rows() -> list[dict]:
    rows = []
    for micro in (1, 16, 32):
        parts = {"parameters": 22_075_392, "gradients": 22_075_392, "optimizer_states": 44_150_784,
                 "activations": 26 * MIB * micro, "other": 3 * MIB}
        tracked = sum(parts.values())
        rows.append({"micro_batch": micro, **parts, "tracked_total": tracked, "device_peak_bytes": tracked + 6 * MIB})
    return rows


def train_log_rows() -> list[dict]:
    losses = [10.9, 9.8, 8.7, 7.9, 7.2, 6.8]
    return [{"step": step, "loss": loss, "lr": 1e-4, "samples_per_s": 17.0 + step * 0.1,
             "tokens_per_s": (17.0 + step * 0.1) * 128, "peak_bytes": micro_peak(32) + 4 * MIB if step > 1 else None,
             "micro_batch": 32, "grad_accum_steps": 8,
             "seconds": 14.6} for step, loss in enumerate(losses, start=1)]


def make_run(directory: Path, full: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "plan.json").write_text(json.dumps(plan_json(TRIALS), indent=2))
    if full:
        pd.DataFrame(throughput_rows()).to_csv(directory / "throughput.csv", index=False)
        pd.DataFrame(breakdown_rows()).to_csv(directory / "breakdown.csv", index=False)
        pd.DataFrame(train_log_rows()).to_csv(directory / "train_log.csv", index=False)
    return directory


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", f"{path.name} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


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


def test_markdown_content(full_run: tuple[Path, ReportFiles]) -> None:
    text = (full_run[0] / "report.md").read_text(encoding="utf-8")
    for expected in ("# gaplan report: tiny-gpt2", "5.5M parameters", "causal-lm", "sequence length 128", "fp32", "adamw",
                     "1.00 GiB (the device default)", "torch 2.13.0+cpu", "2026-11-29T08:22:21+00:00",
                     "effective batch 256 = 32 (micro-batch) x 8 (accumulation steps) x 1 (world size)", "32 x8",
                     "## Tuner decision", "4% above", "## Probe trials", "## Throughput", "## Memory breakdown",
                     "## Training", "true large batch (unbounded, does not fit)", "![", "(memory.png)", "(training.png)",
                     "1.17x", "10.9 at the first step, 6.8 at the last"):
        assert expected in text, expected
    probe_section = text.split("## Probe trials")[1].split("\n## ")[0]
    table_rows = [line for line in probe_section.splitlines() if line.startswith("|")]
    assert len(table_rows) == 2 + len(TRIALS)  # header, rule, one row per trial
    assert sum(" OOM " in line for line in table_rows) == sum(not t["fits"] for t in TRIALS)


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


def test_load_run_parses_inputs(full_run: tuple[Path, ReportFiles]) -> None:
    run = load_run(str(full_run[0]))
    assert run.plan["max_micro_batch"] == 35
    assert run.trials["micro_batch"].tolist() == [t["micro_batch"] for t in TRIALS]
    assert run.throughput is not None and run.throughput["bounded"].tolist() == [True, True, True, False]
    assert run.breakdown is not None and len(run.breakdown) == 3
    assert run.train_log is not None and run.train_log["peak_bytes"].isna().sum() == 1


def assert_one_line_error(directory: Path, *fragments: str) -> None:
    with pytest.raises(GaplanError) as caught:
        write_report(str(directory))
    message = str(caught.value)
    assert message and "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_folder_without_plan_json(tmp_path: Path) -> None:
    assert_one_line_error(tmp_path, f"{tmp_path} is not a gaplan run folder: no plan.json")
    assert_one_line_error(tmp_path / "absent", "no plan.json")


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


def test_minimal_folder(tmp_path: Path) -> None:
    make_run(tmp_path, full=False)
    written = write_report(str(tmp_path))
    assert written.files == sorted(["memory.png", "probe.csv", "report.md", "report.html"])
    assert not any((tmp_path / name).exists() for name in ("breakdown.png", "throughput.png", "training.png"))
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "## Throughput" not in text and "## Training" not in text and "## Memory breakdown" not in text
    assert (tmp_path / "report.html").read_text(encoding="utf-8").count("data:image/png;base64,") == 1


def test_plan_without_trials_or_optional_fields(tmp_path: Path) -> None:
    data = plan_json([])
    for key in ("torch_version", "tuner", "probe_limit_bytes"):
        del data[key]
    data.update(param_count=0, static_bytes=0)
    (tmp_path / "plan.json").write_text(json.dumps(data))
    written = write_report(str(tmp_path))
    assert "memory.png" in written.files
    assert pd.read_csv(tmp_path / "probe.csv").empty
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "without probing" in text and "torch version not recorded" in text and "## Tuner decision" not in text


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
