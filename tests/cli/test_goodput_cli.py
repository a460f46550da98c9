"""End-to-end: ``gaplan probe --objective goodput`` (probe, measuring run, one bench over the range, the choice) and
``gaplan train --plan ... --lr-scaling``; and their bad input, one line each."""

import csv
import json

import pytest
from click.testing import CliRunner

from gaplan.cli.main import main
from gaplan.plan.goodput import statistical_efficiency

SMALL = ["--model", "tiny-gpt2", "--seq-len", "16", "--memory-limit", "200MiB", "--device", "cpu", "--threads", "1"]


def invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


@pytest.mark.heavy
@pytest.mark.slow
def test_goodput_measures_times_every_candidate_and_plans_the_best_and_train_scales_the_lr_only_when_asked(tmp_path):
    out = tmp_path / "probe"
    result = invoke(["probe", *SMALL, "--objective", "goodput", "--effective-batch", "8", "--batch-range", "2:16",
                     "--measure-steps", "4", "--rounds", "2", "--max-rounds", "2", "--quiet", "--json",
                     "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    tuner = data["tuner"]
    goodput = tuner["goodput"]
    assert tuner["objective"] == "goodput" and goodput["reference_batch"] == 8
    rows = goodput["rows"]
    assert sorted(r["effective_batch"] for r in rows) == [2, 4, 8, 16]  # every candidate timed
    # The noise scale is the measuring run's own: its train_log's last step (a different writer than plan.json).
    with open(out / "goodput-measure" / "train_log.csv") as handle:
        log = list(csv.DictReader(handle))
    assert len(log) == 4 and float(log[-1]["noise_scale"]) == pytest.approx(goodput["noise_scale"], rel=1e-6)
    noise = goodput["noise_scale"]
    for row in rows:
        assert row["efficiency"] == pytest.approx(statistical_efficiency(row["effective_batch"], noise, 8))
        assert row["goodput"] == pytest.approx(row["samples_per_s"] * row["efficiency"])
    best = max(rows, key=lambda r: (r["goodput"], -r["effective_batch"]))
    plan = data["plan"]
    assert plan["effective_batch"] == best["effective_batch"] and sum(plan["micro_batch_sizes"]) == plan["effective_batch"]
    assert plan["micro_batch"] <= data["max_micro_batch"]
    assert json.loads((out / "plan.json").read_text())["plan"] == plan

    def trained_lr(name, *extra):
        run = tmp_path / name
        done = invoke(["train", *SMALL, "--plan", str(out / "plan.json"), "--steps", "1", "--quiet", "--out", str(run),
                       *extra])
        assert done.exit_code == 0, done.output
        return json.loads((run / "train.json").read_text())["workload"]["lr"]

    chosen = plan["effective_batch"]
    assert trained_lr("kept") in (None, 1e-3)  # not rescaled silently
    assert trained_lr("linear", "--lr-scaling", "linear") == pytest.approx(1e-3 * chosen / 8)
    assert trained_lr("sqrt", "--lr-scaling", "sqrt") == pytest.approx(1e-3 * (chosen / 8) ** 0.5)


BAD_INPUT = [
    (["probe", "--objective", "goodput", "--batch-range", "8:2"], "--batch-range must be LOW:HIGH"),
    (["probe", "--objective", "goodput", "--batch-range", "abc"], "--batch-range must be LOW:HIGH"),
    (["probe", "--objective", "goodput", "--batch-range", "0:8"], "--batch-range must be LOW:HIGH"),
    (["probe", "--objective", "goodput", "--measure-steps", "1"], "--measure-steps must be at least 2"),
    (["probe", "--batch-range", "4:64"], "--batch-range applies to --objective goodput"),
    (["probe", "--measure-steps", "10"], "--measure-steps applies to --objective goodput"),
    (["probe", "--objective", "goodput", "--report"], "gaplan bench --plan OUT/plan.json"),
    (["probe", "--objective", "goodput", "--world-size", "2"], "use --world-size 1"),
    (["train", "--lr-scaling", "linear"], "--lr-scaling scales the learning rate"),
]


@pytest.mark.parametrize("args, message", BAD_INPUT)
def test_bad_input_is_one_line_exit_2(tmp_path, args, message):
    result = CliRunner().invoke(main, [*args, "--quiet", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gaplan: ") and message in lines[0], result.stderr
    assert not (tmp_path / "out").exists(), "nothing may be written on bad input"


def test_lr_scaling_with_a_plan_not_made_by_goodput_is_one_line(tmp_path):
    probed = invoke(["probe", *SMALL, "--effective-batch", "8", "--search-cap", "4", "--quiet", "--out",
                     str(tmp_path / "probe")])
    assert probed.exit_code == 0, probed.output
    result = CliRunner().invoke(main, ["train", *SMALL, "--plan", str(tmp_path / "probe" / "plan.json"),
                                       "--lr-scaling", "sqrt", "--steps", "1", "--quiet", "--out", str(tmp_path / "t")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "needs a plan from gaplan probe --objective goodput" in lines[0], result.stderr
    assert not (tmp_path / "t").exists()
