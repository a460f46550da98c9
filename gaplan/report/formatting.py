"""Numbers and messages as a person reads them in the report: bytes, counts, rates, OOM reasons."""

from __future__ import annotations

from typing import Any

import pandas as pd

from gaplan.core.constants import GiB, MiB
from gaplan.core.units import format_bytes


def missing(value: Any) -> bool:
    """None or NA (a CSV's empty cell)."""
    return value is None or (not isinstance(value, str) and bool(pd.isna(value)))


def is_false(value: Any) -> bool:
    """False but not missing: a nullable boolean read from a CSV."""
    return not missing(value) and not bool(value)


def byte_size(value: Any) -> str:
    return "-" if missing(value) else format_bytes(int(value))


def count(value: Any) -> str:
    """5518848 -> 5.5M; 0 or missing -> unknown."""
    if missing(value) or not value:
        return "unknown"
    number = float(value)
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if number >= size:
            return f"{number / size:.1f}{suffix}"
    return f"{number:.0f}"


def rate(value: Any) -> str:
    return "-" if missing(value) else f"{float(value):,.1f}"


def integer(value: Any) -> str:
    return "-" if missing(value) else f"{int(value)}"


def yes_no(value: Any) -> str:
    return "-" if missing(value) else ("yes" if value else "no")


def loss(value: Any) -> str:
    return "-" if missing(value) else f"{float(value):.4g}"


def shorten(text: str, limit: int) -> str:
    """One line of at most ``limit`` characters, cut with '...'."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def axis_unit(largest_bytes: float) -> tuple[float, str]:
    """The scale and unit of a memory axis whose top is ``largest_bytes``."""
    return (GiB, "GiB") if largest_bytes >= GiB else (MiB, "MiB")


# An OOM's message as the allocator wrote it (one line, cut at 200 characters by the trial) -> what ran out.
_OOM_KINDS = (
    ("DefaultCPUAllocator", "out of memory (CPU allocator)"),
    ("CUDA out of memory", "out of memory (CUDA)"),
    ("killed by SIGKILL", "killed (SIGKILL, likely the kernel's OOM killer)"),
    ("out of memory", "out of memory"),
)


def failure_reason(error: Any, completed_steps: Any) -> str:
    """Why a trial failed, in words: what ran out and at which optimizer step.

    The allocator's own message (sizes in bytes, a hint about ``PYTORCH_CUDA_ALLOC_CONF``) is long
    and was cut mid-word; the step is the one after the last completed one.
    """
    text = "" if missing(error) else " ".join(str(error).split())
    reason = next((kind for marker, kind in _OOM_KINDS if marker in text), None if text else "out of memory")
    if reason is None:  # not an allocator message (e.g. "the model itself does not fit"): already words
        return shorten(text, 80)
    if not missing(completed_steps):
        reason += f" at optimizer step {int(completed_steps) + 1}"
    return reason


# breakdown.csv's categories as the report names them; "other" is MemTracker's temporaries and untagged tensors.
CATEGORY_LABELS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_states": "optimizer states",
    "activations": "activations",
    "other": "other (temporaries: logits, loss buffers, optimizer-step scratch)",
}
