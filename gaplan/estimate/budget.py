"""The budget: what the traced peak is compared with, from a target, a memory limit or the CPU default."""

from __future__ import annotations

from dataclasses import dataclass

from gaplan.core.constants import DEFAULT_CPU_BUDGET
from gaplan.core.errors import GaplanError
from gaplan.core.options import OptionError
from gaplan.core.units import format_bytes
from gaplan.devices.reserve import CONTEXT_BYTES
from gaplan.estimate import assumptions
from gaplan.estimate.assumptions import Assumption
from gaplan.estimate.device import WORKSPACE_BYTES_HOPPER
from gaplan.estimate.targets import Target, lookup_target

DEVICE_KINDS = ("cuda", "cpu")
DEFAULT_TARGET = "h100-80gb"  # when neither a target nor a memory limit is given (device_kind="cuda")


@dataclass(frozen=True)
class Budget:
    """The target (if any), the memory limit, the bytes tensors may take, and the assumption that explains them."""

    target: Target | None
    limit_bytes: int  # the device's memory (a target's total) or the given limit
    usable_bytes: int  # what tensors may take: the limit less the reserve
    assumption: Assumption

    @property
    def in_words(self) -> str:
        """The bytes tensors may take, and where they come from when a reserve came off the limit."""
        if self.usable_bytes == self.limit_bytes:
            return format_bytes(self.usable_bytes)
        return (f"{format_bytes(self.usable_bytes)} (what {format_bytes(self.limit_bytes)} leaves after the CUDA "
                "context and the cuBLAS workspaces)")


def check_device_kind(device_kind: str) -> None:
    if device_kind not in DEVICE_KINDS:
        raise GaplanError(f"device kind must be one of {', '.join(DEVICE_KINDS)} (got {device_kind!r})")


def budget(device_kind: str, memory_limit: int | None, target: str | None) -> Budget:
    """The budget of a ``device_kind`` estimate given a memory limit and/or a target name."""
    if device_kind == "cpu":
        if target is not None:
            raise GaplanError(f"--target {target} is a GPU; it does not apply to a CPU estimate")
        limit = memory_limit or DEFAULT_CPU_BUDGET
        return Budget(None, limit, limit, assumptions.cpu_budget(limit))
    if target is None and memory_limit is None:
        target = DEFAULT_TARGET
    # A memory limit is the card's memory, as gaplan probe --memory-limit takes it on CUDA: the context's allowance
    # (gaplan.devices.reserve) and the cuBLAS workspaces come off it, as off a target's total. The workspaces come
    # off once: cuBLAS allocates them through the caching allocator at its first GEMM on the card, and the trace's
    # products run on fake CPU tensors, so no traced storage holds them (tests/estimate/test_budget.py).
    if target is not None:
        the_target = lookup_target(target)
        if memory_limit is not None and memory_limit - the_target.reserve_bytes < the_target.usable_bytes:
            usable = memory_limit - the_target.reserve_bytes
            _check_usable(usable, memory_limit)
            return Budget(the_target, memory_limit, usable, assumptions.target_budget(the_target, memory_limit, usable))
        usable = the_target.usable_bytes
        return Budget(the_target, the_target.total_bytes, usable, assumptions.target_budget(the_target, None, usable))
    assert memory_limit is not None
    usable = memory_limit - CONTEXT_BYTES - WORKSPACE_BYTES_HOPPER
    _check_usable(usable, memory_limit)
    return Budget(None, memory_limit, usable, assumptions.limit_budget(memory_limit, usable))


def check_margin(margin: object) -> None:
    """``margin`` is a fraction of the limit in [0, 1) (as ``gaplan probe --margin``), else one line."""
    if not isinstance(margin, int | float) or isinstance(margin, bool) or not 0 <= margin < 1:
        raise OptionError(f"margin must be a fraction in [0, 1) (got {margin})", "margin")


def margin_budget(device_kind: str, memory_limit: int | None, target: str | None,
                  margin: float) -> tuple[Budget, int | None]:
    """The budget with ``margin`` of its limit kept free, and the memory limit that gives it (``memory_limit`` as
    given when there is no margin): what the layouts and the lever rows are estimated against."""
    the_budget = budget(device_kind, memory_limit, target)
    if margin:
        memory_limit = int(the_budget.limit_bytes * (1 - margin))
        the_budget = budget(device_kind, memory_limit, target)
    return the_budget, memory_limit


def _check_usable(usable: int, memory_limit: int) -> None:
    if usable <= 0:
        raise GaplanError(f"--memory-limit {format_bytes(memory_limit)} leaves nothing for tensors after the CUDA "
                          "context and the cuBLAS workspaces")
