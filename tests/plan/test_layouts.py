"""gaplan.plan.layouts: the layouts, their ranking, the pick and the launch command (pure, no torch)."""

from __future__ import annotations

import dataclasses
import random
import shlex
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gaplan.core.errors import GaplanError
from gaplan.plan.layouts import (
    MACHINERY,
    PRECISIONS,
    Layout,
    LayoutComparison,
    LayoutResult,
    launch_command,
    layouts_for,
    pick,
    rank,
    resolve_world,
    sort_key,
    workload_flags,
)


def layout(machinery: str = "fsdp", precision: str = "fp32-master", grad_sync: str = "last") -> Layout:
    return Layout(machinery=machinery, precision=precision, parallel="ddp" if machinery == "ddp" else "fsdp",
                  grad_checkpointing=machinery == "fsdp+ckpt", cpu_offload=machinery == "fsdp+offload",
                  weights_dtype="fp32" if precision == "fp32-master" else "bf16", dtype="bf16", grad_sync=grad_sync)


def fitting(machinery: str, micro_batch: int, steps: int, precision: str = "fp32-master", speed: float | None = None,
            grad_sync: str = "last") -> LayoutResult:
    return LayoutResult(layout(machinery, precision, grad_sync), "", fits=True, peak_bytes=1, max_micro_batch=micro_batch,
                        micro_batch=micro_batch, grad_accum_steps=steps, world_size=8, samples_per_s=speed)


def failing(machinery: str, precision: str = "fp32-master") -> LayoutResult:
    return LayoutResult(layout(machinery, precision), "", fits=False, needed_bytes=10, world_size=8)


def skipped(machinery: str) -> LayoutResult:
    return LayoutResult(layout(machinery, "low-weights-fp32-optimizer"), "", fits=None, note="not supported")


def test_the_pure_module_imports_no_torch():
    code = "import sys, gaplan.plan.layouts, gaplan.report.layout_report; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- the layouts ----------------------------------------------------------------------------------------------------


def test_every_machinery_with_every_precision_in_order():
    rows = layouts_for(8, "bf16")
    assert [(lay.machinery, p.name) for lay, p, _ in rows] == [(m, p.name) for m in MACHINERY for p in PRECISIONS]
    notes = {(lay.machinery, p.name): note for lay, p, note in rows}
    assert all("not supported" in notes[(m, "low-weights-fp32-optimizer")] for m in MACHINERY)
    assert not any(notes[(m, p)] for m in MACHINERY for p in ("fp32-master", "pure-low"))
    by = {(lay.machinery, p.name): lay for lay, p, _ in rows}
    assert by[("fsdp+ckpt", "fp32-master")].grad_checkpointing and by[("fsdp+ckpt", "fp32-master")].parallel == "fsdp"
    assert by[("fsdp+offload", "pure-low")].cpu_offload and by[("fsdp+offload", "pure-low")].weights_dtype == "bf16"
    assert by[("ddp", "fp32-master")] == layout("ddp")


def test_one_rank_estimates_ddp_only():
    notes = {(lay.machinery, p.name): note for lay, p, note in layouts_for(1, "bf16")}
    assert notes[("ddp", "fp32-master")] == "" and notes[("ddp", "pure-low")] == ""
    assert all("--world-size 2" in notes[(m, "fp32-master")] for m in MACHINERY[1:])


def test_cpu_offload_is_not_a_layout_on_the_cpu():
    """Its commands were printed for --device cpu, where gaplan train and estimate refuse --cpu-offload."""
    cpu, gpu = ({(lay.machinery, p.name): note for lay, p, note in layouts_for(2, "bf16", device_kind=kind)}
                for kind in ("cpu", "cuda"))
    assert cpu[("fsdp+offload", "fp32-master")].startswith("not on --device cpu")
    assert cpu[("fsdp", "fp32-master")] == "" and gpu[("fsdp+offload", "fp32-master")] == ""


def test_fp16_weights_with_fp16_compute_and_fp32_compute_are_explained():
    notes = {(lay.machinery, p.name): note for lay, p, note in layouts_for(2, "fp16")}
    assert "loss scaler" in notes[("fsdp", "pure-low")] and notes[("fsdp", "fp32-master")] == ""
    notes = {(lay.machinery, p.name): note for lay, p, note in layouts_for(2, "fp32")}
    assert "same as fp32" in notes[("ddp", "pure-low")] and notes[("ddp", "fp32-master")] == ""
    # at fp32 every precision but fp32 master weights is that one (it read "not supported: ... keep their states in the
    # weights' dtype" for fp32 weights and fp32 states), and fp32 compute is no autocast
    assert "same as fp32" in notes[("ddp", "low-weights-fp32-optimizer")]
    labels = {p.name: p.label_for("fp32") for p in PRECISIONS}
    assert labels["fp32-master"] == "fp32 weights, optimizer states and compute"
    assert PRECISIONS[0].label_for("bf16") == "fp32 weights and optimizer states, bf16 compute (autocast)"


@pytest.mark.parametrize(("args", "message"), [
    ((0,), "world_size must be a positive integer"),
    ((2, "int8"), "unknown dtype"),
    ((2, "bf16", ["zero3"]), "unknown layout 'zero3'"),
    ((2, "bf16", []), "unknown layout"),
])
def test_bad_layout_input_is_one_line(args, message):
    with pytest.raises(GaplanError, match=message) as exc:
        layouts_for(*args)
    assert "\n" not in str(exc.value)


# --- ranking and the pick -------------------------------------------------------------------------------------------


def test_the_fewest_accumulation_steps_win():
    results = [fitting("ddp", 2, 32), fitting("fsdp", 4, 16), fitting("fsdp+ckpt", 32, 2), failing("ddp", "pure-low")]
    assert pick(results).layout.machinery == "fsdp+ckpt"


def test_on_a_tie_the_least_machinery_wins():
    results = [fitting("fsdp+offload", 64, 1), fitting("fsdp+ckpt", 64, 1), fitting("fsdp", 64, 1)]
    assert pick(results).layout.machinery == "fsdp"
    assert [r.layout.machinery for r in rank(results)] == ["fsdp", "fsdp+ckpt", "fsdp+offload"]


def test_on_a_tie_fp32_master_weights_beat_pure_bf16_even_with_less_machinery():
    results = [fitting("fsdp", 64, 1, precision="pure-low"), fitting("fsdp+ckpt", 64, 1)]
    chosen = pick(results)
    assert chosen.layout.machinery == "fsdp+ckpt" and chosen.layout.precision == "fp32-master"


def test_the_same_steps_and_a_larger_micro_batch_win():
    # E/W = 63: 2 steps of 32+31 against 2 steps of 32+31 at a larger B* is the same split; the larger split wins.
    results = [fitting("fsdp", 30, 3), fitting("fsdp+ckpt", 32, 2)]
    assert pick(results).layout.machinery == "fsdp+ckpt"


def test_last_micro_step_sync_beats_every_on_a_tie():
    results = [fitting("fsdp", 8, 2, grad_sync="every"), fitting("fsdp", 8, 2, grad_sync="last")]
    assert pick(results).layout.grad_sync == "last"


def test_a_timed_layout_beats_untimed_ones_and_the_fastest_wins():
    results = [fitting("fsdp+ckpt", 64, 1), fitting("fsdp", 8, 8, speed=90.0), fitting("ddp", 4, 16, speed=120.0)]
    assert pick(results).layout.machinery == "ddp"


def test_nothing_fits_picks_nothing_and_not_estimated_rows_come_last():
    results = [skipped("ddp"), failing("fsdp"), failing("ddp")]
    assert pick(results) is None
    assert [r.fits for r in rank(results)] == [False, False, None]
    assert pick([]) is None


_results = st.builds(
    lambda machinery, precision, fits, micro, steps, speed, sync: (
        LayoutResult(layout(machinery, precision, sync), "", fits=fits,
                     max_micro_batch=micro if fits else None, micro_batch=micro if fits else None,
                     grad_accum_steps=steps if fits else None, samples_per_s=speed if fits else None)),
    st.sampled_from(MACHINERY), st.sampled_from(["fp32-master", "pure-low"]), st.sampled_from([True, False, None]),
    st.integers(1, 512), st.integers(1, 64), st.one_of(st.none(), st.floats(0.1, 1e4)),
    st.sampled_from(["last", "every"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(_results, max_size=12), st.randoms())
def test_the_pick_is_the_best_fitting_layout_whatever_the_order(results, rng):
    chosen = pick(results)
    fits = [r for r in results if r.fits]
    if not fits:
        assert chosen is None
        return
    assert chosen.fits and chosen in fits
    assert all(sort_key(chosen) <= sort_key(r) for r in results)
    shuffled = list(results)
    rng.shuffle(shuffled)
    assert sort_key(pick(shuffled)) == sort_key(chosen)
    timed = [r for r in fits if r.samples_per_s is not None]
    if timed:
        assert chosen.samples_per_s == max(r.samples_per_s for r in timed)
    else:
        assert chosen.grad_accum_steps == min(r.grad_accum_steps for r in fits)


def test_a_comparison_serializes_ranked_with_its_pick():
    results = [failing("ddp"), fitting("fsdp", 4, 16), fitting("fsdp+ckpt", 64, 1)]
    results[2].command = "torchrun ..."
    comparison = LayoutComparison(model="m", param_count=10, seq_len=8, device_kind="cuda", target="h100-80gb",
                                  memory_limit_bytes=100, usable_bytes=90, world_size=8, nodes=1, effective_batch=512,
                                  dtype="bf16", results=results)
    data = comparison.to_dict()
    assert data["pick"]["layout"]["machinery"] == "fsdp+ckpt" and data["command"] == "torchrun ..."
    assert [r["layout"]["machinery"] for r in data["results"]] == ["fsdp+ckpt", "fsdp", "ddp"]
    assert data["results"][0]["layout"]["label"] == "FSDP + checkpointing"


# --- the launch command ---------------------------------------------------------------------------------------------

WORKLOAD = {"model": "llama-2-7b", "task": None, "seq_len": 4096, "dtype": "bf16", "optimizer": "adamw", "lr": None,
            "grad_checkpointing": True, "init": "auto", "weights_dtype": "fp32", "trust_remote_code": False,
            "parallel": "fsdp", "cpu_offload": False, "grad_sync": "last"}


def test_one_node_torchrun_command():
    command = launch_command(WORKLOAD, micro_batch=16, effective_batch=512, world_size=8)
    assert command == ("torchrun --nproc-per-node 8 -m gaplan train --model llama-2-7b --seq-len 4096 --dtype bf16 "
                       "--parallel fsdp --grad-checkpointing on --micro-batch 16 --effective-batch 512")


def test_several_nodes_run_the_same_command_on_each():
    command = launch_command({**WORKLOAD, "grad_sync": "every", "cpu_offload": True}, 4, 512, world_size=64, nodes=8)
    assert command.startswith("torchrun --nnodes 8 --node-rank $NODE_RANK --rdzv-backend c10d "
                              "--rdzv-endpoint $MASTER_ADDR:29500 --nproc-per-node 8 -m gaplan train ")
    assert "--grad-sync every" in command and "--cpu-offload" in command


def test_one_rank_is_a_plain_gaplan_train_with_quoted_paths_and_no_defaults():
    workload = {**WORKLOAD, "model": "/models/my llama", "parallel": "ddp", "grad_checkpointing": False,
                "dtype": "fp32", "lr": 3e-4, "weights_dtype": "bf16"}
    command = launch_command(workload, 8, 64, device="cpu")
    assert command.startswith("gaplan train --model '/models/my llama' --seq-len 4096 --weights-dtype bf16 --lr 0.0003")
    assert shlex.split(command)[-4:] == ["--micro-batch", "8", "--effective-batch", "64"]
    assert "--parallel" not in command and "--dtype" not in command and "--device cpu" in command


def test_workload_flags_leave_defaults_out():
    assert workload_flags({"model": "tiny-gpt2"}) == ["--model", "tiny-gpt2"]
    assert workload_flags({"model": "tiny-gpt2", "loss": "plain", "optimizer": "adamw"}) == ["--model", "tiny-gpt2"]


def test_workload_flags_keep_the_loss_and_every_optimizer():
    from gaplan.workload.spec import OPTIMIZERS

    assert workload_flags({"model": "tiny-gpt2", "loss": "chunked:64"}) == ["--model", "tiny-gpt2", "--loss", "chunked:64"]
    for name in OPTIMIZERS[1:]:
        assert workload_flags({"model": "m", "optimizer": name})[-2:] == ["--optimizer", name]


@pytest.mark.parametrize(("saved", "flags"), [(True, ["--grad-checkpointing", "on"]), (False, []),
                                              ("every:2", ["--grad-checkpointing", "every:2"]),
                                              ("layers:3", ["--grad-checkpointing", "layers:3"])])
def test_the_launch_command_keeps_the_blocks_checkpointed_and_compile(saved, flags):
    assert workload_flags({"model": "m", "grad_checkpointing": saved}) == ["--model", "m", *flags]
    assert workload_flags({"model": "m", "compile": True}) == ["--model", "m", "--compile"]


@pytest.mark.parametrize(("given", "expected"), [
    ((None, None, None), (1, 1)),
    ((8, None, None), (8, 1)),
    ((None, 2, None), (16, 2)),
    ((None, 2, 4), (8, 2)),
    ((None, None, 4), (4, 1)),
    ((64, 8, 8), (64, 8)),
    ((64, 8, None), (64, 8)),
])
def test_world_size_from_nodes_and_gpus_per_node(given, expected):
    assert resolve_world(*given) == expected


@pytest.mark.parametrize(("given", "message"), [
    ((0, None, None), "world_size must be a positive integer"),
    ((None, 0, None), "nodes must be a positive integer"),
    ((12, 8, None), "does not split evenly"),
    ((64, 8, 4), "is not nodes 8 x gpus_per_node 4"),
])
def test_bad_world_is_one_line(given, message):
    with pytest.raises(GaplanError, match=message):
        resolve_world(*given)


def test_launch_refuses_uneven_nodes():
    with pytest.raises(GaplanError, match="does not split evenly"):
        launch_command(WORKLOAD, 1, 512, world_size=12, nodes=8)


def test_random_orders_give_one_pick():
    results = [fitting(m, b, s) for m, b, s in (("ddp", 2, 8), ("fsdp", 4, 4), ("fsdp+ckpt", 8, 2), ("fsdp+offload", 8, 2))]
    picks = set()
    for seed in range(20):
        shuffled = list(results)
        random.Random(seed).shuffle(shuffled)
        picks.add(pick(shuffled).layout.machinery)
    assert picks == {"fsdp+ckpt"}


def _switches() -> list[str]:
    from gaplan.workload.spec import WorkloadSpec

    return [f.name for f in dataclasses.fields(WorkloadSpec) if f.type in ("bool", bool)]


@pytest.mark.parametrize("name", _switches())
def test_the_launch_command_rebuilds_every_switch_of_the_workload(name):
    """Each bool field of WorkloadSpec, turned on, comes back from the printed command as gaplan train parses it (a
    switch left out would launch a run without it: --offload-activations once was)."""
    from gaplan.cli.main import main
    from gaplan.workflows.parse_options import spec_from_flat
    from gaplan.workload.spec import WorkloadSpec

    spec = WorkloadSpec(model="tiny-llama", parallel="fsdp" if name == "cpu_offload" else "ddp", **{name: True})
    flags = workload_flags(spec.to_dict())
    with main.get_command(None, "train").make_context("train", flags) as ctx:
        assert spec_from_flat(ctx.params, device=False) == spec, flags


def test_the_launch_command_keeps_quantize_with_lora_and_without():
    """QLoRA's (after --lora's own flags) and a module:function model's frozen layers in 4 bits (no --lora)."""
    assert workload_flags({"model": "m", "lora": True, "lora_r": 8, "quantize": "4bit"}) == [
        "--model", "m", "--lora", "--lora-r", "8", "--quantize", "4bit"]
    assert workload_flags({"model": "pkg:make", "quantize": "nf4"}) == ["--model", "pkg:make", "--quantize", "nf4"]
