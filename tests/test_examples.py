"""The examples run as written (each as its own process, as a user would) and print their key lines."""

import json
import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(name, *args, timeout=300):
    result = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "examples", name), *args], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.mark.heavy
@pytest.mark.slow
def test_plain_pytorch_example():
    out = run_example("plain_pytorch.py")
    assert "plan: 24 samples per step as micro-batches 5,5,5,5,4" in out
    exact = next(line for line in out.splitlines() if line.startswith("accumulated vs one-batch gradient"))
    assert float(exact.split("max difference ")[1].split()[0]) < 1e-6, exact
    assert "step 8: loss" in out and "final loss:" in out


@pytest.mark.heavy
@pytest.mark.slow
def test_hf_trainer_example():
    pytest.importorskip("accelerate")  # transformers.Trainer needs it
    out = run_example("hf_trainer.py", "--max-micro-batch", "5")
    assert "note: gaplan's plan splits 24 samples per device as 5,5,5,5,4" in out
    assert "Trainer: 4 per device x 6 accumulation steps x 1 device(s)" in out
    assert "per_device_train_batch_size=4," in out
    assert "step 5: loss" in out and "final loss:" in out


@pytest.mark.heavy
@pytest.mark.slow
def test_trainer_mode_next_to_auto_find_batch_size():
    """The benchmark's table: gaplan keeps the effective batch and its largest batch trains at steady state."""
    pytest.importorskip("accelerate")
    out = run_example("trainer_probe_vs_auto_find.py", timeout=600)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in out.splitlines() if line.startswith("| transformers") or line.startswith("| gaplan")}
    auto, ours = rows["transformers auto_find_batch_size"], rows["gaplan Trainer mode"]
    assert ours[2] == "64" and ours[4] == "yes", ours  # the effective batch asked, and B* trains past step 1
    assert int(auto[2]) < 64 and int(auto[0]) <= int(ours[0]), (auto, ours)  # auto_find shrinks the step


@pytest.mark.heavy
@pytest.mark.slow
def test_gaplan_batch_size_next_to_lightnings_batch_size_finder():
    """The benchmark's table: both finders' answers, whether a fresh fit trains at each, and the wall-time ratio."""
    pytest.importorskip("pytorch_lightning")
    out = run_example("lightning_batch_size.py", timeout=600)
    rows = {line[:30].strip(): line[30:].split() for line in out.splitlines() if "Size" in line[:30]}
    lightning, ours = rows["Lightning BatchSizeFinder"], rows["gaplan GaplanBatchSize"]
    assert ours[2] == "trains" and int(ours[1]) >= 1, ours
    assert lightning[0].endswith("s") and ours[0].endswith("s")
    assert "gaplan / Lightning wall time:" in out


@pytest.mark.heavy
@pytest.mark.slow
def test_lora_estimate_next_to_its_probe_and_lora_fits_more_than_full_fine_tuning():
    """docs/lora.md's table: each B* probed and estimated, and LoRA's probed B* above full fine-tuning's."""
    pytest.importorskip("peft")
    out = run_example("lora_estimate_vs_probe.py", timeout=600)
    edges = {line.split(":")[0]: [int(w.strip(",")) for w in line.split() if w.strip(",").isdigit()]
             for line in out.splitlines() if line.startswith(("LoRA:", "full:"))}
    assert edges["LoRA"][0] > edges["full"][0], out
    assert abs(edges["LoRA"][0] - edges["LoRA"][1]) <= 1, out  # the estimate's B* within 1 of the probe's


@pytest.mark.heavy
@pytest.mark.slow
def test_the_batch_goodput_chooses_reaches_the_asked_for_loss_sooner():
    """docs/noise-scale.md: on tiny-gpt2 the goodput tuner chooses a smaller effective batch than the 64 asked for
    (noise scale ~16), and that batch reaches the same smoothed loss in less wall time."""
    out = run_example("noise_scale_time_to_loss.py", timeout=900)
    line = next(line for line in out.splitlines() if line.startswith("chosen:"))
    assert "reaches it at step" in line, out
    share = int(line.split("% of the time")[0].rsplit(" ", 1)[-1])
    assert share < 100, out


def run_script(name, *args):
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    result = subprocess.run(["bash", os.path.join(REPO_ROOT, "examples", name), *args], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_ddp_torchrun_example(tmp_path):
    import json

    out = run_script("ddp_torchrun.sh", str(tmp_path))
    summary = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert summary["steps"] == 3 and summary["plan"]["world_size"] == 2 and summary["plan"]["grad_accum_steps"] == 2


@pytest.mark.heavy
@pytest.mark.slow
def test_plan_for_h100_example():
    out = run_script("plan_for_h100.sh", "h100-80gb", "256")  # a short sequence keeps the trace quick
    assert "largest micro-batch predicted to fit:" in out
    assert "does not fit in 79.08 GiB" in out  # AdamW's 16 bytes per parameter alone exceed the card


@pytest.mark.heavy
@pytest.mark.slow
def test_compare_with_peers_example(tmp_path):
    """The quick comparison: gaplan's answer is the edge checked in fresh processes; its gradient is the large batch's."""
    import json

    pytest.importorskip("pytorch_lightning")
    out = run_example("compare_with_peers.py", "--quick", "--out", str(tmp_path), timeout=900)
    assert "| gaplan " in out and "## Loss correctness" in out
    for name in ("peers.md", "peers.html", "peers.png", "peers.json", "batch_size.csv", "loop.csv", "loss.csv"):
        assert (tmp_path / name).stat().st_size > 0, name
    data = json.loads((tmp_path / "peers.json").read_text())
    assert set(data["versions"]) >= {"torch", "transformers", "accelerate", "pytorch-lightning"}
    finders = {row["tool"]: row for row in data["batch_size"]}
    assert len(finders) == 4 and not any(row["error"] for row in finders.values()), finders
    # The CPU edge moves by one sample with the address layout (README, "The CPU budget"): gaplan's worker and
    # the fresh processes that check it may sit on either side of that sample.
    gaplan_row = finders["gaplan"]
    assert abs(gaplan_row["found"] - data["true_edge"]) <= 1, (gaplan_row, data["true_edge"])
    assert gaplan_row["survives_step_2"] is (gaplan_row["found"] <= data["true_edge"])
    for row in finders.values():
        assert row["found"] >= 1 and row["trials"] >= 1 and row["wall_s"] > 0 and row["survives_step_2"] is not None
    loops = {row["loop"]: row for row in data["loop"]}
    assert all(row["median_samples_per_s"] > 0 for row in loops.values()), loops
    losses = {row["tool"]: row["max_relative_difference"] for row in data["loss"]}
    assert losses["gaplan"] < 1e-5 and losses["HF Trainer + gaplan (GaplanTrainer)"] < 1e-5
    assert losses["hand-written loop"] > 1e-2  # dividing each micro-batch's mean by the steps is wrong on padded data


@pytest.mark.heavy
@pytest.mark.slow
def test_profile_probe_example():
    """The probe's profile: every trial's parts are measured inside the time the worker and the caller saw."""
    import json

    out = run_example("profile_probe.py", "--seq-len", "8", "--memory-limit", "160MiB", "--threads", "1", "--json")
    profile = json.loads(out)
    worker = profile["worker"]
    assert 0 < worker["imports (torch, transformers, the model's code)"] <= worker["start to ready"]
    assert profile["edge"] >= 1 and profile["trials"]
    for row in profile["trials"]:
        parts = [row[name] for name in ("fork", "budget", "model build", "optimizer states", "step 1", "step 2")]
        assert all(part is None or part >= 0 for part in parts) and row["fork"] is not None, row
        assert sum(part or 0 for part in parts) <= row["in the worker"] <= row["round trip"] + 0.05, row
        assert (row["step 2"] is not None) == (row["fits"] and row["steps"] == 2), row
    assert profile["probe wall"] <= profile["process wall"]


@pytest.mark.heavy
@pytest.mark.slow
def test_train_speed_example_puts_three_loops_side_by_side():
    pytest.importorskip("accelerate")  # transformers.Trainer needs it
    out = run_example("train_speed.py", "--quick", "--rounds", "2", "--warmup", "1", "--steps", "2", timeout=600)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in out.splitlines() if line.startswith("| ") and not line.startswith("| loop")}
    assert set(rows) == {"gaplan train", "plain loop", "HF Trainer"}, out
    assert rows["plain loop"][2] == "1.00x (1.00-1.00)"
    for name, (step, rounds, versus) in rows.items():
        assert float(step) > 0 and rounds == "2" and versus.endswith(")"), (name, versus)


@pytest.mark.heavy
@pytest.mark.slow
def test_adaptive_time_to_loss_prints_each_schedule_to_the_target():
    """One seed, a near target: every schedule reaches it and has its row (samples, steps, seconds)."""
    out = run_example("adaptive_time_to_loss.py", "--seeds", "1", "--target", "7.5", "--max-steps", "40",
                      "--warmup-steps", "6", "--threads", "1", timeout=600)
    assert "target not reached" not in out, out
    rows = {line.split("|")[0].strip(): line for line in out.splitlines() if line.count("|") == 3}
    assert {"fixed", "adaptive", "warmup:6"} <= set(rows), out
    fixed_samples = float(rows["fixed"].split("|")[1])
    assert fixed_samples % 64 == 0, rows["fixed"]  # whole steps of the asked-for batch


@pytest.mark.heavy
@pytest.mark.slow
def test_adaptive_rule_check_prints_its_two_tables(tmp_path):
    """A short run of both parts: the replay's six rows and a rates row per level, and the JSON with the same."""
    out = run_example("adaptive_rule_check.py", "--seeds", "2", "--steps", "30", "--margins", "3", "--json",
                      str(tmp_path / "rule.json"), timeout=600)
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 6 + 2, out
    data = json.loads((tmp_path / "rule.json").read_text())
    assert [row["noise_scale"] for row in data["replay"]] == [3, 17, 23, 3, 17, 23]
    assert all(row["past"] <= row["seeds"] for row in data["replay"]) and len(data["rates"]) == 2


@pytest.mark.heavy
@pytest.mark.slow
def test_noise_scale_overhead_prints_the_step_time_and_peak_ratios():
    """docs/noise-scale.md's overhead: a short run (2 rounds of 3 steps, 2 step pairs) prints every line it reports."""
    out = run_example("noise_scale_overhead.py", "--rounds", "2", "--steps", "3", "--pairs", "2", timeout=900)
    for start in ("gaplan train, step time with / without the measurement:", "one process, 2 step pairs, with / without",
                  "inside the meter's own calls:", "step peak with / without:"):
        line = next((line for line in out.splitlines() if line.startswith(start)), None)
        assert line is not None, (start, out)
    ratio = next(line for line in out.splitlines() if line.startswith("gaplan train, step time"))
    assert float(ratio.split(": ")[1].split("x")[0]) > 0, ratio


@pytest.mark.heavy
@pytest.mark.slow
def test_accelerate_example_trains_the_uneven_plan_at_b_star_as_one_batch():
    """docs/accelerate.md's example: the plan's sizes reach the loop through prepare, uneven, and the first step's
    update is one batch's of its samples."""
    pytest.importorskip("accelerate")
    out = run_example("accelerate_uneven.py", "--steps", "2", timeout=600)
    found = next(line for line in out.splitlines() if line.startswith("B* = "))
    b_star = int(found.split()[2])
    sizes = [int(size) for size in out.split("micro-batches [")[1].split("]")[0].split(", ")]
    assert sum(sizes) == 40 and max(sizes) <= b_star and len(sizes) == -(-40 // b_star), (found, sizes)
    # One optimizer step a step, after its last micro-batch: the epoch's last step too.
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and all(f"optimizer stepped after micro-batch [{len(sizes)}]" in line for line in steps), steps
    exact = next(line for line in out.splitlines() if line.startswith("first step's update"))
    assert float(exact.split("relative difference ")[1].split()[0]) < 1e-5, exact


@pytest.mark.heavy
@pytest.mark.slow
def test_trl_example_trains_sft_at_the_probed_plan():
    """docs/trl.md's example: the SFTTrainer's probed B* and gaplan's plan at it, trained micro-batch for micro-batch."""
    pytest.importorskip("trl")
    out = run_example("trl_sft.py", "--effective-batch", "24", "--steps", "2", timeout=600)
    found = next(line for line in out.splitlines() if line.startswith("B* = "))
    b_star = int(found.split()[2])
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(steps) == 2, out
    for line in steps:
        sizes = [int(size) for size in line.split("micro-batches [")[1].split("]")[0].split(", ")]
        assert sum(sizes) == 24 and max(sizes) <= b_star and len(sizes) == -(-24 // b_star), (found, line)
