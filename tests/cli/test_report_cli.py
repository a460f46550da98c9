"""End-to-end ``gaplan bench`` and ``gaplan report``, and the report part of ``gaplan probe --report``."""

import json
import os
import shutil

import pandas as pd
import pytest
from click.testing import CliRunner

from gaplan.benchmark.splits import PLAN, BenchResult, SplitMeasurement
from gaplan.cli.main import main
from gaplan.runs.probe_result import save_probe
from gaplan.training.breakdown import CATEGORIES
from gaplan.workflows.bench import write_measurements

pytestmark = pytest.mark.slow

GENERATED = ("probe.csv", "report.md", "report.html", "memory.png", "throughput.png", "breakdown.png")


@pytest.fixture(scope="module")
def bench_run(small_probe, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    save_probe(small_probe, str(folder / "probe-plan.json"))
    result = CliRunner().invoke(main, ["bench", "--plan", str(folder / "probe-plan.json"), "--seq-len", "16",
                                       "--effective-batch", "4", "--repeats", "2", "--rounds", "2",
                                       "--max-rounds", "2", "--out", str(folder / "run"), "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    return folder / "run", json.loads(result.stdout)


def test_bench_writes_rows_and_the_report(bench_run):
    run, summary = bench_run
    splits = [(r["kind"], r["micro_batch"], r["grad_accum_steps"]) for r in summary["rows"]]
    assert splits == [("plan", 4, 1), ("split", 2, 2), ("split", 1, 4), ("large-batch", 4, 1)]
    assert all(r["effective_batch"] == 4 for r in summary["rows"])
    table = pd.read_csv(run / "throughput.csv")
    assert list(table["micro_batch"]) == [4, 2, 1, 4] and table["ratio_to_large_batch"].iloc[-1] == 1.0
    for name in ("plan.json", "throughput.csv", "report.md", "report.html", "throughput.png", "memory.png"):
        assert (run / name).is_file(), name


@pytest.mark.heavy  # 29 s; the default run keeps test_bench_writes_rows_and_the_report
def test_bench_json_report_and_csv_say_how_sure_the_ratio_is(small_probe, tmp_path):
    """E = 4 over a pretended B* = 2: the plan accumulates (2 x 2), the large batch runs for reference; the
    verdict, its interval, the rounds and the machine are in --json, bench.json and the report."""
    import dataclasses

    save_probe(dataclasses.replace(small_probe, max_micro_batch=2), str(tmp_path / "plan.json"))
    result = CliRunner().invoke(main, ["bench", "--plan", str(tmp_path / "plan.json"), "--seq-len", "16",
                                       "--effective-batch", "4", "--repeats", "1", "--rounds", "2", "--max-rounds",
                                       "2", "--out", str(tmp_path / "run"), "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    ratio = summary["plan_vs_large_batch"]
    assert ratio["reference"] == "large-batch" and len(ratio["ci"]) == 2
    assert ratio["ci"][0] <= ratio["ratio"] <= ratio["ci"][1]
    # Two rounds: the interval, or "CI too wide" where its ends lie more than 10x apart (the tables' rule)
    assert ratio["verdict"].startswith("the plan runs at") and ("95% CI" in ratio["verdict"]
                                                                 or "CI too wide" in ratio["verdict"])
    assert summary["rounds"] == 2 and "2 rounds" in summary["stopped_because"]
    assert {len(rates) for rates in summary["round_rates"].values()} == {2}
    plan = next(r for r in summary["rows"] if r["kind"] == "plan")
    assert plan["split"] == "2 x 2" and plan["rounds"] == 2 and plan["bounded"] is False
    assert plan["samples_per_s_low"] <= plan["samples_per_s"] <= plan["samples_per_s_high"]
    saved = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert saved["plan_vs_large_batch"] == ratio and "rows" not in saved
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"**Verdict:** {ratio['verdict']}." in report and "samples/s (95% CI)" in report
    assert "Splits were timed as training runs them" in report
    # One peak: the probe's at the split's micro-batch (under the budget), the timing run's labelled beside it.
    assert "| peak (step) | resident peak while timing |" in report.replace("  ", " ").replace("  ", " ")
    trial_peaks = {t.micro_batch: t.peak_bytes for t in small_probe.trials if t.fits}
    if 2 in trial_peaks:
        assert plan["probe_peak_bytes"] == trial_peaks[2]
    assert plan["probe_peak_bytes"] and plan["peak_bytes"]
    text = (tmp_path / "run" / "throughput.csv").read_text()
    header, first = text.splitlines()[:2]
    peak = first.split(",")[header.split(",").index("peak_bytes")]
    assert peak.isdigit(), f"bytes are written as an integer, not {peak!r}"


def test_report_rebuilds_a_copied_folder(bench_run, tmp_path):
    run, _ = bench_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    for name in GENERATED:
        if (copy / name).exists():
            os.remove(copy / name)
    result = CliRunner().invoke(main, ["report", str(copy), "--json"])
    assert result.exit_code == 0, result.output
    assert (copy / "probe.csv").read_text() == (run / "probe.csv").read_text()
    assert (copy / "report.md").read_text() == (run / "report.md").read_text()
    assert "report.html" in json.loads(result.stdout)["files"]


def test_report_on_a_folder_that_is_not_a_run(tmp_path):
    result = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "not a gaplan run folder" in result.output


def test_probe_report_writes_the_breakdown(small_probe, tmp_path):
    save_probe(small_probe, str(tmp_path / "plan.json"))
    measured = BenchResult(256, [SplitMeasurement("32 x 8", PLAN, 32, 8, 256, 3, 2.0, 1.9, 2.1, 128.0, 2048.0, 200 * 2**20,
                                                  True, True)])
    files = write_measurements(str(tmp_path), small_probe, [measured])
    assert {"breakdown.png", "throughput.png", "report.html"} <= set(files)
    breakdown = pd.read_csv(tmp_path / "breakdown.csv")
    sizes = list(breakdown["micro_batch"])
    assert len(sizes) == 4 and sizes[0] == 1 and sizes[-1] == small_probe.max_micro_batch and sizes == sorted(sizes)
    assert (breakdown[list(CATEGORIES)].sum(axis=1) == breakdown["tracked_total"]).all()
    assert breakdown["device_peak_bytes"].notna().all()
