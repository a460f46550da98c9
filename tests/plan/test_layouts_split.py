"""gaplan.plan.layouts: the split as written arithmetic, the near-limit test and the probe command that checks a pick."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gaplan.plan.layouts import (
    Layout,
    LayoutComparison,
    LayoutResult,
    format_split,
    near_limit,
    probe_command,
    size_flag,
    split_sizes,
)
from gaplan.plan.split import make_plan

GiB = 2**30


def evaluate(text: str) -> int:
    """What the split as written multiplies out to: ``22,21,21 x 8`` is (22 + 21 + 21) x 8."""
    sizes, ranks = text.rsplit(" x ", 1)
    if sizes.startswith("("):
        total = sum(int(size) * int(count) for size, count in
                    (run.split(" x ") for run in sizes.strip("()").split(" + ")))
    elif "," in sizes:
        total = sum(int(size) for size in sizes.split(","))
    else:
        size, steps = sizes.split(" x ")
        total = int(size) * int(steps)
    return total * int(ranks)


@pytest.mark.parametrize(("effective", "world", "steps", "text"), [
    (512, 8, 3, "22,21,21 x 8"),
    (512, 8, 2, "32 x 2 x 8"),
    (512, 8, 22, "(3 x 20 + 2 x 2) x 8"),
    (61, 1, 4, "16,15,15,15 x 1"),
])
def test_a_split_is_written_so_that_it_multiplies_out_to_the_effective_batch(effective, world, steps, text):
    assert format_split(split_sizes(effective, world, steps), world) == text
    assert evaluate(text) == effective


@given(st.integers(1, 64), st.integers(1, 300), st.integers(1, 400))
def test_every_plan_is_written_as_its_own_sizes(world, share, cap):
    plan = make_plan(world * share, cap, world)
    sizes = split_sizes(plan.effective_batch, world, plan.grad_accum_steps)
    assert sizes == plan.micro_batch_sizes
    assert evaluate(format_split(sizes, world)) == plan.effective_batch


def fsdp(micro_batch: int, steps: int, peak: int, **extra) -> LayoutResult:
    layout = Layout(machinery="fsdp+ckpt", precision="fp32-master", parallel="fsdp", grad_checkpointing=True,
                    cpu_offload=False, weights_dtype="fp32", dtype="bf16", grad_sync="every")
    return LayoutResult(layout, "", fits=True, peak_bytes=peak, max_micro_batch=25, micro_batch=micro_batch,
                        grad_accum_steps=steps, world_size=8, extra=extra)


def test_the_comparison_serializes_each_split_with_its_sizes():
    comparison = LayoutComparison(model="m", param_count=1, seq_len=8, device_kind="cuda", target="h100-80gb",
                                  memory_limit_bytes=80 * GiB, usable_bytes=79 * GiB, world_size=8, nodes=1,
                                  effective_batch=512, dtype="bf16", results=[fsdp(22, 3, 70 * GiB)])
    data = comparison.to_dict()
    assert data["pick"]["split"] == "22,21,21 x 8" and data["pick"]["micro_batch_sizes"] == [22, 21, 21]
    assert data["results"][0]["split"] == "22,21,21 x 8" and data["pick_near_limit"] is False


@pytest.mark.parametrize(("peak", "measured", "expected"), [
    (76 * GiB, False, True),  # 96% of the usable memory, estimated
    (74 * GiB, False, False),  # 94%: clear of the estimate's error
    (78 * GiB, True, False),  # measured on the hardware: no estimate to doubt
])
def test_near_limit_is_an_estimated_peak_within_five_percent(peak, measured, expected):
    result = fsdp(22, 3, peak, **({"measured": True} if measured else {}))
    assert near_limit(result, 79 * GiB) is expected


def test_the_probe_command_carries_the_pick_and_parses_as_gaplan_probe():
    from gaplan.cli.main import main

    workload = {"model": "llama-2-7b", "task": None, "seq_len": 4096, "dtype": "bf16", "optimizer": "adamw",
                "lr": None, "grad_checkpointing": True, "init": "auto", "weights_dtype": "fp32",
                "trust_remote_code": False, "parallel": "fsdp", "cpu_offload": False, "grad_sync": "every"}
    command = probe_command(workload, 512, 8, target="h100-80gb", margin=0.05)
    assert command == ("gaplan probe --model llama-2-7b --seq-len 4096 --dtype bf16 --parallel fsdp --grad-sync every "
                       "--grad-checkpointing on --target h100-80gb --world-size 8 --effective-batch 512 --margin 0.05")
    words = shlex.split(command)
    context = main.get_command(None, "probe").make_context("probe", words[2:])  # click checks every option and its value
    assert context.params["world_size"] == 8 and context.params["grad_sync"] == "every"
    cpu = probe_command({**workload, "parallel": "ddp", "grad_sync": "last", "grad_checkpointing": False}, 64, 2,
                        device_kind="cpu", memory_limit=160 * 2**20)
    assert cpu.endswith("--device cpu --memory-limit 160MiB --world-size 2 --effective-batch 64")
    assert main.get_command(None, "probe").make_context("probe", shlex.split(cpu)[2:]).params["memory_limit"] == 160 * 2**20


def test_size_flags_read_back_exactly():
    from gaplan.core.units import parse_bytes

    for count in (40 * GiB, 160 * 2**20, 123_456_789):
        assert parse_bytes(size_flag(count)) == count
