"""``gaplan probe --report`` and ``gaplan train --compare`` end to end: they say what the timing will cost before it
starts, time in rounds, and end with the verdict and its interval."""

import json

import pytest
from click.testing import CliRunner

from gaplan.cli.main import main

pytestmark = pytest.mark.slow

TINY = ["--seq-len", "16", "--threads", "1", "--device", "cpu"]


@pytest.mark.heavy
def test_probe_report_forecasts_the_timing_and_ends_with_the_verdict(tmp_path):
    result = CliRunner().invoke(main, ["probe", *TINY, "--memory-limit", "256MiB", "--effective-batch", "8",
                                       "--search-cap", "4", "--report", "--repeats", "1", "--rounds", "2",
                                       "--max-rounds", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    err = result.stderr
    assert "time splits in interleaved rounds" in err.split("micro-batch")[0], "said before the probe starts"
    forecast = next(line for line in err.splitlines() if line.startswith("timing ") and "rounds" in line)
    assert "in 2 interleaved rounds: about" in forecast and "at most" in forecast
    assert err.index(forecast) < err.index("round 1 ")  # before the first timed run
    assert "round 1 took" in err  # the forecast again, from the first round's own time
    verdict = next(line for line in result.stdout.splitlines() if line.startswith("throughput: "))
    assert ("95% CI" in verdict or "CI too wide" in verdict) and "a true large batch" in verdict  # 2 rounds
    assert f"**Verdict:** {verdict.removeprefix('throughput: ')}." in (tmp_path / "report.md").read_text()
    # what the timings say about the machine, as gaplan bench says it (it was in report.md only)
    machine = next(line for line in result.stdout.splitlines() if line.startswith("machine: "))
    assert json.loads((tmp_path / "bench.json").read_text())["contention"] in machine


@pytest.mark.heavy
def test_train_compare_closes_the_training_bar_then_times_and_gives_the_verdict(tmp_path):
    result = CliRunner().invoke(main, ["train", *TINY, "--micro-batch", "2", "--effective-batch", "4", "--steps", "1",
                                       "--compare", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert any(line.startswith("timing ") and "interleaved rounds" in line for line in result.stderr.splitlines())
    assert "throughput: the plan runs at" in result.stdout and ("95% CI" in result.stdout
                                                                 or "CI too wide" in result.stdout)
    summary = json.loads((tmp_path / "bench.json").read_text())
    assert summary["rounds"] >= 3 and summary["plan_vs_large_batch"]["ci"] is not None
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# gaplan training report") and "**Verdict:**" in report
    assert report.index("## Training") < report.index("## Throughput")
