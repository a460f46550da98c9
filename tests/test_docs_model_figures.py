"""The figures the docs give for the default model, from the model built today: its parameter count, what its
weights, gradients and optimizer states take, sharded over two ranks, and the size of its SGD checkpoint. One build
of tiny-gpt2 (about 5 s on 2 cores, more under load): heavy."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_gpt2():
    from gaplan import WorkloadSpec
    from gaplan.workload.build import build_workload

    return build_workload(WorkloadSpec(), "cpu")


def _flat(name: str) -> str:
    return " ".join((ROOT / name).read_text().split())


@pytest.mark.heavy
def test_the_default_models_size_and_static_memory(tiny_gpt2):
    from gaplan.core.units import format_bytes
    from gaplan.report.formatting import count
    from gaplan.workload.build import static_bytes

    adamw = static_bytes(tiny_gpt2.model, "adamw")
    params = sum(p.numel() for p in tiny_gpt2.model.parameters())
    readme = _flat("README.md")
    assert f"(causal-lm, {count(params)} parameters, seq len 128, fp32, adamw)" in readme
    assert f"static {format_bytes(adamw)} for weights, gradients and optimizer states" in readme
    sharded = _flat("docs/sharded.md")
    assert f"static {format_bytes(adamw / 2)} per rank for weights, gradients and optimizer states" in sharded
    assert f"Sharding halves the {format_bytes(adamw)} of weights, gradients and optimizer states" in sharded
    assert f"1,024 tokens of a {count(params)}-parameter model" in _flat("docs/noise-scale.md")


@pytest.mark.heavy
def test_the_disk_pages_checkpoint_size_is_the_weights(tiny_gpt2):
    """disk-faults.md: tiny-gpt2 with SGD writes "a 21 MiB checkpoint" (its fp32 weights; plain SGD keeps no
    state), and its one-line message asks for that to 0.05 MiB (the checkpoint's header)."""
    weights = sum(p.numel() * p.element_size() for p in tiny_gpt2.model.parameters()) / 2**20
    text = _flat("docs/disk-faults.md")
    assert f"tiny-gpt2 with SGD (a {round(weights)} MiB checkpoint)" in text
    needs = float(re.search(r"cannot write checkpoint\.pt to \S+ it needs ([\d.]+) MiB", text).group(1))
    assert weights <= needs < weights + 0.05


@pytest.mark.heavy
def test_the_lora_pages_record_is_the_adapted_model():
    """lora.md quotes the estimate's LoRA record for tiny-gpt2: the frozen base's fp32 bytes and the adapters'
    parameter count and bytes, as the PEFT model built today has them."""
    from gaplan import WorkloadSpec
    from gaplan.core.units import format_bytes
    from gaplan.workload.build import build_workload

    model = build_workload(WorkloadSpec(lora=True), "cpu").model
    frozen = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    adapters = [p for p in model.parameters() if p.requires_grad]
    count = sum(p.numel() for p in adapters)
    text = _flat("docs/lora.md")
    assert f"the frozen base, {format_bytes(frozen)} in fp32, has no gradients or optimizer states" in text
    assert f"the {count:,} adapter parameters ({format_bytes(sum(p.numel() * p.element_size() for p in adapters))})" \
        in text


@pytest.mark.heavy
@pytest.mark.slow
def test_the_sharded_pages_7b_estimate_is_todays():
    """sharded.md's Llama-2-7B on 8 H100s (an estimate on fake tensors: the same bytes on every machine; the seconds
    are the machine's): its parameters, static bytes, memory line, B*, peak and plan as today's estimate gives them
    (about 15 s on 2 cores)."""
    from gaplan import WorkloadSpec, make_plan
    from gaplan.core.units import format_bytes
    from gaplan.estimate import estimate

    result = estimate(WorkloadSpec(model="llama-2-7b", seq_len=4096, dtype="bf16", parallel="fsdp"),
                      target="h100-80gb", effective_batch=512, world_size=8)
    text = (ROOT / "docs" / "sharded.md").read_text().split("A Llama-2-7B shape on 8 H100s", 1)[1].split("```\n\n", 1)[0]
    flat = " ".join(text.split())
    intercept, slope = result.line
    assert f"(causal-lm, {result.param_count / 1e6:.1f}M parameters, seq len 4096, bf16, adamw)" in flat
    assert f"static {format_bytes(result.static_bytes)} for sharded weights" in flat
    assert f"memory line: {format_bytes(intercept)} + {format_bytes(slope)} per sample per rank" in flat
    assert f"largest micro-batch predicted to fit: {result.max_micro_batch} [{result.trace_count} traces," in flat
    assert f"peak {format_bytes(result.peak_bytes)} per rank]" in flat
    assert "plan: " + " ".join(make_plan(512, result.max_micro_batch, 8).describe().split()) in flat


def test_the_sharded_pages_activations_prose_is_its_7b_table():
    """The prose's "N GiB a sample" (twice) is the 7B table's activations at micro-batch 1, which the heavy test above
    holds to today's estimate."""
    text = (ROOT / "docs" / "sharded.md").read_text()
    row = re.search(r"\n\s+1\s+micro-steps(.*)\n", text.split("A Llama-2-7B shape on 8 H100s", 1)[1]).group(1)
    activations = float(re.findall(r"([\d.]+) (?:GiB|MiB|B)", row)[5])  # the table's sixth column
    flat = " ".join(text.split())
    assert flat.count(f"activations ({round(activations)} GiB a sample") == 2
