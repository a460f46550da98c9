"""gaplan.estimate.budget: the bytes the traced peak is compared with, and the assumption that says why."""

from __future__ import annotations

import pytest

from gaplan.core.constants import DEFAULT_CPU_BUDGET, MiB
from gaplan.core.errors import GaplanError
from gaplan.devices.reserve import CONTEXT_BYTES
from gaplan.estimate import lookup_target
from gaplan.estimate.budget import DEFAULT_TARGET, budget
from gaplan.estimate.device import WORKSPACE_BYTES_HOPPER, WORKSPACE_BYTES_OTHER, DeviceModel


def test_no_target_and_no_limit_is_the_default_target():
    b = budget("cuda", None, None)
    assert b.target is not None and b.target.name == DEFAULT_TARGET
    assert b.limit_bytes == b.target.total_bytes and b.usable_bytes == b.target.usable_bytes
    assert b.assumption.topic == "budget" and "CUDA context" in b.assumption.text
    assert b.assumption.values["usable_bytes"] == b.usable_bytes


def test_a_limit_smaller_than_the_target_is_a_smaller_card():
    t4 = lookup_target("t4")
    b = budget("cuda", 4096 * MiB, "t4")
    assert b.limit_bytes == 4096 * MiB and b.usable_bytes == 4096 * MiB - t4.context_bytes - t4.workspace_bytes
    assert "is smaller" in b.assumption.text and b.assumption.values["limit_bytes"] == 4096 * MiB
    larger = budget("cuda", 10 * t4.total_bytes, "t4")  # a larger limit changes nothing
    assert larger.usable_bytes == t4.usable_bytes and "is smaller" not in larger.assumption.text


def test_a_limit_alone_loses_the_contexts_allowance_and_hoppers_workspaces_and_cpu_keeps_everything():
    b = budget("cuda", 1024 * MiB, None)
    assert b.target is None and b.usable_bytes == 1024 * MiB - CONTEXT_BYTES - WORKSPACE_BYTES_HOPPER
    assert b.assumption.values["context_bytes"] == CONTEXT_BYTES and "CUDA context" in b.assumption.text
    cpu = budget("cpu", None, None)
    assert cpu.limit_bytes == cpu.usable_bytes == DEFAULT_CPU_BUDGET
    with pytest.raises(GaplanError, match="leaves nothing for tensors after the CUDA context and the cuBLAS"):
        budget("cuda", CONTEXT_BYTES + WORKSPACE_BYTES_HOPPER, None)
    with pytest.raises(GaplanError, match="leaves nothing for tensors"):
        budget("cuda", CONTEXT_BYTES, "t4")
    with pytest.raises(GaplanError, match="does not apply to a CPU estimate"):
        budget("cpu", None, "t4")


def test_a_model_that_does_not_fit_names_the_limit_given_not_only_what_the_reserve_leaves_of_it():
    """--memory-limit 600MiB said "does not fit in 24.00 MiB", a number the user never gave."""
    from click.testing import CliRunner

    from gaplan.cli.main import main

    gpu = budget("cuda", 600 * MiB, None)
    assert gpu.in_words == (f"{gpu.usable_bytes / MiB:.2f} MiB (what 600.00 MiB leaves after the CUDA context and "
                            "the cuBLAS workspaces)")
    assert budget("cpu", 64 * MiB, None).in_words == "64.00 MiB"
    result = CliRunner().invoke(main, ["estimate", "--seq-len", "16", "--memory-limit", "600MiB"])
    assert result.exit_code == 2 and f"tiny-gpt2 does not fit in {gpu.in_words}: weights" in result.output, result.output


def test_the_cublas_workspaces_come_off_the_budget_once_and_the_trace_holds_none():
    """``--target X --memory-limit M``: the workspaces are taken off M, once. cuBLAS allocates them through the
    caching allocator at its first GEMM on a card; the trace's products run on fake CPU tensors and the CUDA device
    model adds no operator workspace, so a product's traced peak is its operands and its output, at their blocks."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from gaplan.estimate.allocator import cuda_block_bytes
    from gaplan.training.breakdown import memory_tracker

    for name, workspace in (("h100", WORKSPACE_BYTES_HOPPER), ("a100-80gb", WORKSPACE_BYTES_OTHER)):
        target = lookup_target(name)
        b = budget("cuda", 8192 * MiB, name)
        assert 8192 * MiB - b.usable_bytes == target.context_bytes + workspace  # once: not twice
    model = DeviceModel("cuda")
    assert model.workspace() is None  # no per-operator workspace on cuda (MKL's is the CPU's)
    with model.allocator() as allocators, FakeTensorMode():
        tracker = memory_tracker(model.workspace())
        with tracker:
            a, w = torch.ones(512, 1024), torch.ones(1024, 4096)  # made under the tracker, so it counts them
            out = a @ w
    operands = sum(cuda_block_bytes(t.numel() * 4) for t in (a, w, out))
    assert allocators.latest.peak_allocated == operands  # nothing of 8.1 MiB or 64 MiB beside them
