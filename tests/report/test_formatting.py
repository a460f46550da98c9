"""Numbers and messages as the report writes them."""

from __future__ import annotations

import pytest

from gaplan.plan.split import run_lengths
from gaplan.report.formatting import count, failure_reason


@pytest.mark.parametrize("error, steps, reason", [
    ("DefaultCPUAllocator: can't allocate memory: you tried to alloc", 0, "out of memory (CPU allocator) at optimizer step 1"),
    ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a tot", 1, "out of memory (CUDA) at optimizer step 2"),
    ("trial process killed by SIGKILL", 0, "killed (SIGKILL, likely the kernel's OOM killer) at optimizer step 1"),
    ("std::bad_alloc: out of memory", None, "out of memory"),
    (None, 1, "out of memory at optimizer step 2"),
    ("the model itself does not fit", 0, "the model itself does not fit"),
])
def test_failure_reason(error: str | None, steps: int | None, reason: str) -> None:
    assert failure_reason(error, steps) == reason


def test_counts_and_run_lengths() -> None:
    assert [count(5_518_848), count(1_500), count(0), count(None)] == ["5.5M", "1.5K", "unknown", "unknown"]
    assert run_lengths([32, 32, 32, 31]) == "32 x3, 31 x1"
