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
