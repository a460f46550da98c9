"""gaplan.training.breakdown: MemTracker with an operator's workspace, counted at the moment it runs."""

from __future__ import annotations

import pytest
import torch

from gaplan.core.constants import MiB
from gaplan.training.breakdown import memory_tracker


def _peak_of(workspace_bytes: int) -> dict:
    """x @ x (256 KiB out) while little is live, then a 2 MiB tensor beside its output."""
    x = torch.randn(256, 256)  # made before the tracker: not counted

    def workspace(func, args) -> int:
        return workspace_bytes if func is torch.ops.aten.mm.default else 0

    tracker = memory_tracker(workspace)
    with tracker:
        product = x @ x
        later = torch.zeros(2 * MiB // 4)
        del later
    del product
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    return peak


@pytest.mark.parametrize("workspace_mib", [0, 1])
def test_a_workspace_off_the_peak_adds_nothing(workspace_mib):
    peak = _peak_of(workspace_mib * MiB)
    assert peak["Total"] == 256 * 1024 + 2 * MiB  # the product's output and the later tensor, no workspace
    assert peak["Temp"] == 0


def test_a_workspace_at_the_peak_counts_over_what_is_live_then():
    peak = _peak_of(4 * MiB)
    assert peak["Total"] == 256 * 1024 + 4 * MiB  # the output, live while the call's buffer is
    assert peak["Temp"] == 4 * MiB
