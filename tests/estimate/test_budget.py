"""gaplan.estimate.budget: the bytes the traced peak is compared with, and the assumption that says why."""

from __future__ import annotations

import pytest

from gaplan.core.constants import DEFAULT_CPU_BUDGET, MiB
from gaplan.core.errors import GaplanError
from gaplan.estimate import lookup_target
from gaplan.estimate.budget import DEFAULT_TARGET, budget
from gaplan.estimate.device import WORKSPACE_BYTES_HOPPER


def test_no_target_and_no_limit_is_the_default_target():
    b = budget("cuda", None, None)
    assert b.target is not None and b.target.name == DEFAULT_TARGET
    assert b.limit_bytes == b.target.total_bytes and b.usable_bytes == b.target.usable_bytes
    assert b.assumption.topic == "budget" and "CUDA context" in b.assumption.text
    assert b.assumption.values["usable_bytes"] == b.usable_bytes


def test_a_limit_smaller_than_the_target_is_the_allocators_budget():
    t4 = lookup_target("t4")
    b = budget("cuda", 4096 * MiB, "t4")
    assert b.limit_bytes == 4096 * MiB and b.usable_bytes == 4096 * MiB - t4.workspace_bytes
    assert "is smaller" in b.assumption.text and b.assumption.values["limit_bytes"] == 4096 * MiB
    larger = budget("cuda", 10 * t4.total_bytes, "t4")  # a larger limit changes nothing
    assert larger.usable_bytes == t4.usable_bytes and "is smaller" not in larger.assumption.text


def test_a_limit_alone_keeps_hoppers_workspaces_and_cpu_keeps_everything():
    b = budget("cuda", 1024 * MiB, None)
    assert b.target is None and b.usable_bytes == 1024 * MiB - WORKSPACE_BYTES_HOPPER
    cpu = budget("cpu", None, None)
    assert cpu.limit_bytes == cpu.usable_bytes == DEFAULT_CPU_BUDGET
    with pytest.raises(GaplanError, match="leaves nothing for tensors"):
        budget("cuda", WORKSPACE_BYTES_HOPPER, None)
    with pytest.raises(GaplanError, match="does not apply to a CPU estimate"):
        budget("cpu", None, "t4")
