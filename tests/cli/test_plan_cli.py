"""``gaplan plan`` (the layout chooser) and ``gaplan estimate --parallel fsdp`` end to end, and their bad input."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from gaplan.cli.main import main


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


BAD_ESTIMATE_SHARDING = [
    (["--parallel", "fsdp"], "--parallel fsdp shards the model over ranks: give --world-size 2 or more"),
    (["--cpu-offload"], "--cpu-offload needs --parallel fsdp"),
    (["--grad-sync", "every"], "--grad-sync every needs --parallel fsdp"),
    (["--parallel", "fsdp", "--world-size", "12", "--nodes", "8"], "does not split evenly over --nodes 8"),
    (["--world-size", "16", "--nodes", "2", "--gpus-per-node", "4"], "is not --nodes 2 x --gpus-per-node 4"),
    (["--world-size", "0"], "--world-size must be a positive integer"),
    (["--parallel", "fsdp", "--world-size", "3", "--effective-batch", "64"], "not divisible by the world size 3"),
]


@pytest.mark.parametrize(("args", "message"), BAD_ESTIMATE_SHARDING)
def test_estimate_bad_sharding_input_is_one_line_exit_2(args, message):
    result = CliRunner().invoke(main, ["estimate", "--quiet", *args])
    assert message in one_error_line(result)


def test_estimate_fsdp_refusal_comes_before_the_progress_line():
    result = CliRunner().invoke(main, ["estimate", "--parallel", "fsdp"])
    assert "--world-size 2 or more" in one_error_line(result)


BAD_PLAN_INPUT = [
    (["--layouts", "zero3"], "unknown layout 'zero3'"),
    (["--world-size", "0"], "--world-size must be a positive integer"),
    (["--world-size", "3", "--effective-batch", "64"], "not divisible by the world size 3"),
    (["--device", "cpu", "--target", "h100-80gb"], "does not go with --device cpu"),
    (["--target", "gtx-480"], "unknown target 'gtx-480'"),
    (["--seq-len", "1"], "--seq-len must be an integer of at least 2 (got 1)"),
    (["--measure", "--target", "h100-80gb"], "--measure probes this machine's device"),
    (["--measure", "--nodes", "2"], "--measure runs every rank on this machine"),
    (["--measure", "--repeats", "0"], "--repeats must be a positive integer"),
    (["--margin", "1"], "--margin must be a fraction in [0, 1)"),
    (["--margin", "-0.1"], "--margin must be a fraction in [0, 1)"),
    (["--levers", "ckpt,every:0"], "--levers: unknown lever 'every:0'; choose from adamw,"),
    (["--levers", "ckpt", "--world-size", "2"], "--levers compares the levers on one device"),
    (["--optimizer", "adam"], "unknown --optimizer 'adam'; choose one of adamw, adamw-fused, adamw-forloop, adamw-8bit"),
    (["--loss", "chunked:0"], "unknown --loss 'chunked:0'"),
    (["--measure", "--device", "cuda"], "--device cuda: no CUDA device is available"),  # before any estimate
    (["--device", "cpu", "--threads", "100000"], "--threads 100000 is more than 4 per core"),  # as probe's, train's
]


@pytest.mark.parametrize(("args", "message"), BAD_PLAN_INPUT)
def test_plan_bad_input_is_one_line_exit_2(tmp_path, args, message):
    if "cuda" in args:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    result = CliRunner().invoke(main, ["plan", "--quiet", "--out", str(tmp_path / "out"), *args])
    assert message in one_error_line(result)


@pytest.mark.slow
@pytest.mark.heavy
def test_estimate_fsdp_on_cpu_prints_the_sharded_categories_and_the_torchrun_command():
    result = CliRunner().invoke(main, ["estimate", "--device", "cpu", "--parallel", "fsdp", "--world-size", "2",
                                       "--model", "tiny-gpt2", "--seq-len", "16", "--memory-limit", "120MiB",
                                       "--effective-batch", "64", "--threads", "1", "--quiet"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in ("ranks      2 (1 node x 2), FSDP2", "sh.params", "gathered", "full grads", "all-gather", "red-scat",
                 "per rank", "world size 2", "launch: torchrun --nproc-per-node 2 -m gaplan train --model tiny-gpt2"):
        assert text in out, text
    data = json.loads(CliRunner().invoke(main, [
        "estimate", "--device", "cpu", "--parallel", "fsdp", "--world-size", "2", "--model", "tiny-gpt2", "--seq-len",
        "16", "--memory-limit", "120MiB", "--effective-batch", "64", "--threads", "1", "--quiet", "--json"]).stdout)
    assert data["world_size"] == 2 and data["launch_command"].startswith("torchrun --nproc-per-node 2")
    assert data["rows"][-1]["detail"]["sharded_parameters"] > 0


@pytest.mark.heavy
@pytest.mark.slow
def test_plan_on_cpu_compares_layouts_picks_one_and_writes_the_report(tmp_path):
    out = tmp_path / "plan"
    result = CliRunner().invoke(main, ["plan", "--model", "tiny-gpt2", "--seq-len", "16", "--device", "cpu",
                                       "--memory-limit", "120MiB", "--world-size", "2", "--effective-batch", "64",
                                       "--layouts", "ddp,fsdp", "--grad-sync", "last", "--threads", "1",
                                       "--out", str(out), "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    rows = {(r["layout"]["machinery"], r["layout"]["precision"]): r for r in data["results"]}
    assert set(rows) == {(m, p) for m in ("ddp", "fsdp") for p in ("fp32-master", "low-weights-fp32-optimizer",
                                                                    "pure-low")}
    assert rows[("ddp", "low-weights-fp32-optimizer")]["fits"] is None
    # fp32 weights under DDP do not fit 120 MiB per rank (weights, gradients, AdamW states and DDP's buckets).
    assert rows[("ddp", "fp32-master")]["fits"] is False
    assert rows[("fsdp", "fp32-master")]["fits"] is True
    pick = data["pick"]
    assert pick["fits"] and data["command"].startswith("torchrun --nproc-per-node 2 -m gaplan train")
    assert f"--micro-batch {pick['micro_batch']} --effective-batch 64" in data["command"]
    assert pick["micro_batch"] * pick["grad_accum_steps"] * 2 == 64
    # The pick has the fewest accumulation steps of the layouts that fit.
    assert pick["grad_accum_steps"] == min(r["grad_accum_steps"] for r in data["results"] if r["fits"])
    assert sorted(data["files"]) == ["layouts.csv", "layouts.json", "layouts.png", "report.html", "report.md"]
    for name in data["files"]:
        assert os.path.getsize(out / name) > 0
    report = (out / "report.md").read_text()
    assert "## Layouts" in report and "pick:" in report and "torchrun" in report and "layouts.png" in report


@pytest.mark.slow
def test_plan_prints_a_table_and_the_launch_line(tmp_path):
    result = CliRunner().invoke(main, ["plan", "--model", "tiny-gpt2", "--seq-len", "16", "--device", "cpu",
                                       "--memory-limit", "1GiB", "--world-size", "1", "--effective-batch", "8",
                                       "--layouts", "ddp,fsdp", "--levers", "ckpt", "--threads", "1",
                                       "--out", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "layout" in out and "peak per rank" in out and "split" in out
    assert "pick: DDP with fp32 weights" in out and "launch: gaplan train --model tiny-gpt2" in out
    assert "needs --world-size 2 or more" in out  # FSDP over one rank is listed as not estimated, with the reason
    assert "DDP, fp32 weights" in result.stderr  # progress per layout
    # On one device, the lever table: the base (the layouts' DDP pick) and checkpointing, each with B*, its split
    # and a modelled time; everything fits E = 8 at once, so recompute only costs time and the base is picked.
    table = out[out.index("levers for tiny-gpt2 on one device"):]
    assert [line.split()[0] for line in table.splitlines()[3:5]] == ["base", "ckpt"]
    assert "1.00x" in table and "lever pick: base (the least modelled time)" in table
    assert os.path.exists(tmp_path / "p" / "levers.md")


@pytest.mark.slow
def test_a_plans_folder_is_a_run_folder_refused_again_and_replaced_whole_with_overwrite(tmp_path):
    """A second plan into a plan's folder would mix two plans' files (levers.* beside another model's layouts.*)."""
    out = tmp_path / "plan"
    base = ["plan", "--model", "tiny-gpt2", "--seq-len", "16", "--effective-batch", "8", "--layouts", "ddp", "--quiet",
            "--out", str(out)]
    assert CliRunner().invoke(main, [*base, "--levers", "ckpt"]).exit_code == 0
    assert (out / "levers.json").exists() and (out / "layouts.json").exists()
    (out / "notes.txt").write_text("mine")
    again = CliRunner().invoke(main, [*base, "--world-size", "2"])
    assert again.exit_code == 2 and f"--out {out} already holds a run (" in one_error_line(again)
    replaced = CliRunner().invoke(main, [*base, "--world-size", "2", "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert not (out / "levers.json").exists() and (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "layouts.json").read_text())["world_size"] == 2


@pytest.mark.slow
def test_plan_for_a_v100_picks_fp16_and_says_why_bf16_is_a_poor_choice_there(tmp_path):
    """--dtype auto (the default) plans with fp16 on a card without bf16; bf16 given there is kept, with a caveat."""
    base = ["plan", "--model", "tiny-gpt2", "--seq-len", "16", "--target", "v100-16gb", "--effective-batch", "8",
            "--layouts", "ddp", "--levers", "none", "--quiet"]
    auto = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "a")])
    assert auto.exit_code == 0, auto.output
    assert "fp16 compute (autocast)" in auto.stdout and "--dtype fp16" in auto.stdout and "caveat" not in auto.stdout
    given = CliRunner().invoke(main, [*base, "--dtype", "bf16", "--json", "--out", str(tmp_path / "b")])
    assert given.exit_code == 0, given.output
    assert json.loads(given.stdout)["caveats"] == [
        "caveat: v100-16gb (compute capability 7.0) has no bf16: bf16 runs emulated there, far slower than fp16; "
        "--dtype auto (the default) plans with fp16 on this card."]


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_plan_measure_probes_and_times_each_layout_that_fits_and_picks_the_fastest(tmp_path):
    """At 160 MiB per rank the estimate says DDP fits 14 and FSDP 28 (so without --measure FSDP, with fewer
    accumulation steps, would be picked); measured on 2 CPU processes, each layout gets its exact B*, its plan is
    timed over both ranks, and the pick is the faster (measured here: DDP, 98 against 63 samples/s)."""
    out = tmp_path / "plan"
    result = CliRunner().invoke(main, ["plan", "--model", "tiny-gpt2", "--seq-len", "16", "--device", "cpu",
                                       "--memory-limit", "160MiB", "--world-size", "2", "--effective-batch", "64",
                                       "--layouts", "ddp,fsdp", "--dtype", "fp32", "--grad-sync", "last",
                                       "--threads", "1", "--measure", "--repeats", "1", "--out", str(out), "--json",
                                       "--quiet"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["measured_on"] == "cpu"
    fitting = [r for r in data["results"] if r["fits"]]
    assert {r["layout"]["machinery"] for r in fitting} == {"ddp", "fsdp"}
    for row in fitting:
        assert row["extra"]["measured"] and row["samples_per_s"] > 0
        assert row["extra"]["estimated_max_micro_batch"] is not None
        assert row["micro_batch"] <= row["max_micro_batch"] and row["micro_batch"] * row["grad_accum_steps"] * 2 >= 64
    pick = data["pick"]
    assert pick["samples_per_s"] == max(r["samples_per_s"] for r in fitting)
    assert f"--micro-batch {pick['micro_batch']} --effective-batch 64" in data["command"]
    assert "samples/s" in (out / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.heavy
def test_plan_shows_the_peak_at_the_planned_micro_batch_and_keeps_the_margin_free(tmp_path):
    """An effective batch of 61 on one rank splits unevenly; the pick's peak is the step traced at its largest
    micro-batch (below B*), the peak at B* is beside it, and --margin 0.1 plans against 90% of the limit."""
    from gaplan.estimate import predicted_peak
    from gaplan.workload.spec import WorkloadSpec

    args = ["plan", "--model", "tiny-gpt2", "--seq-len", "16", "--device", "cpu", "--memory-limit", "150MiB",
            "--world-size", "1", "--effective-batch", "61", "--dtype", "fp32", "--threads", "1", "--quiet",
            "--levers", "none"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "a"), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    pick = data["pick"]
    assert 1 < pick["grad_accum_steps"] and pick["micro_batch"] < pick["max_micro_batch"]
    sizes = pick["micro_batch_sizes"]
    assert sum(sizes) == 61 and pick["split"] == ",".join(map(str, sizes)) + " x 1"
    spec = WorkloadSpec(model="tiny-gpt2", seq_len=16)
    assert pick["peak_bytes"] == pytest.approx(predicted_peak(spec, pick["micro_batch"], threads=1), rel=0.01)
    assert pick["edge_peak_bytes"] > pick["peak_bytes"]
    assert pick["check_command"] == ("gaplan probe --model tiny-gpt2 --seq-len 16 --device cpu --memory-limit 150MiB "
                                     "--world-size 1 --effective-batch 61")
    text = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b")]).stdout
    assert f"split {pick['split']} = 61" in text and f"at micro-batch {pick['micro_batch']}" in text
    margin = json.loads(CliRunner().invoke(main, [*args, "--out", str(tmp_path / "c"), "--json", "--margin", "0.1"])
                        .stdout)
    assert margin["usable_bytes"] == int(150 * 2**20 * 0.9) and margin["margin"] == 0.1
    assert margin["pick"]["max_micro_batch"] < pick["max_micro_batch"]
    assert margin["pick"]["check_command"].endswith("--margin 0.1")


@pytest.mark.slow
@pytest.mark.heavy
def test_plan_on_one_cpu_shows_the_lever_table_and_its_pick(tmp_path):
    """gaplan plan --device cpu --effective-batch 16 on the default preset: the lever rows (the base, the chunked
    loss, checkpointing, op-level selective checkpointing, every other block checkpointed, the chunked loss with
    checkpointing), offloading listed as not compared (it does nothing on a CPU; compile is not asked for), and a pick that
    is the least modelled time."""
    result = CliRunner().invoke(main, ["plan", "--device", "cpu", "--effective-batch", "16", "--out",
                                       str(tmp_path / "p"), "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    levers = json.loads(result.stdout)["levers"]
    assert [r["label"] for r in levers["results"]] == ["base", "chunked", "ckpt", "ops", "every:2",
                                                          "chunked+ckpt"]
    assert all(r["fits"] and r["max_micro_batch"] >= 1 and r["model_seconds"] > 0 for r in levers["results"])
    assert [row["lever"] for row in levers["not_compared"]] == ["offload"]
    fastest = min(levers["results"], key=lambda r: r["model_seconds"])
    assert levers["pick"]["label"] == fastest["label"]
    peaks = {r["label"]: r["peak_bytes"] for r in levers["results"]}
    assert peaks["chunked+ckpt"] < min(peaks["chunked"], peaks["ckpt"]) < peaks["base"]  # at the same micro-batch 16
    assert peaks["ckpt"] < peaks["every:2"] < peaks["base"]
    assert peaks["ckpt"] < peaks["ops"] < peaks["base"]  # ops keeps the matmuls' outputs, recomputes the rest
    text = CliRunner().invoke(main, ["plan", "--device", "cpu", "--effective-batch", "16", "--out",
                                     str(tmp_path / "q"), "--quiet"]).stdout
    assert "lever pick: " in text and "not compared: offload: on a CPU the host memory is the device's" in text


@pytest.mark.heavy
@pytest.mark.slow
def test_plan_measure_times_each_lever_row_and_picks_the_fastest_measured(tmp_path):
    """With --measure on one CPU, each lever row that fits is probed and timed in two rounds (a 95% interval each);
    the pick is the fastest measured, and no other measured row's interval lies wholly above it."""
    from gaplan.plan.lever_pick import LeverResult, compare_measured

    result = CliRunner().invoke(main, ["plan", "--model", "tiny-gpt2", "--seq-len", "16", "--device", "cpu",
                                       "--memory-limit", "160MiB", "--effective-batch", "16", "--layouts", "ddp",
                                       "--dtype", "fp32", "--levers", "ckpt,sgd", "--threads", "1", "--measure",
                                       "--repeats", "1", "--out", str(tmp_path / "m"), "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    levers = json.loads(result.stdout)["levers"]
    assert levers["measured_on"] == "cpu"
    measured = [r for r in levers["results"] if r["fits"]]
    assert {r["label"] for r in measured} == {"base", "sgd", "ckpt", "sgd+ckpt"}
    for row in measured:
        assert row["extra"]["measured"] and row["samples_per_s"] > 0 and row["extra"]["rounds"] == 2
        assert row["samples_per_s_low"] <= row["samples_per_s"] <= row["samples_per_s_high"]
    pick = levers["pick"]
    assert pick["samples_per_s"] == max(r["samples_per_s"] for r in measured)
    fields = ("samples_per_s", "samples_per_s_low", "samples_per_s_high")
    chosen = LeverResult((), True, **{k: pick[k] for k in fields})
    for row in measured:
        assert compare_measured(chosen, LeverResult((), True, **{k: row[k] for k in fields})) != "faster"
    assert f"--micro-batch {pick['micro_batch']} --effective-batch 16" in (pick["command"] or "")
