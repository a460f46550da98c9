"""Tracing a deep model at two small depths and drawing each memory category to its full depth.

A stack of identical blocks (same class, parameters and buffers) adds the same memory per block, so the sharded
estimate traces truncated copies (:func:`truncated_copy`) and extrapolates each category on the line through them
(:func:`extrapolate`); a model without such a stack is traced whole.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from gaplan.core.errors import GaplanError

if TYPE_CHECKING:
    from torch import nn


SEGMENT_KEYS = ("unfilled_segments", "cached_segments")


def extrapolate(traced: dict[int, dict[str, int]], depth: int) -> dict[str, int]:
    """Each category at ``depth`` blocks, on the line through the two traced depths (the one trace when whole); the
    allocator's segments are left to :func:`unsegmented`."""
    if depth in traced:
        return {name: value for name, value in traced[depth].items() if name not in SEGMENT_KEYS}
    (d1, low), (d2, high) = sorted(traced.items())[:2]
    names = (set(low) | set(high)) - set(SEGMENT_KEYS)
    return {name: max(0, round(low.get(name, 0) + (high.get(name, 0) - low.get(name, 0)) * (depth - d1) / (d2 - d1)))
            for name in names}


def unsegmented(traced: dict[int, dict[str, int]]) -> dict[str, int]:
    """The allocator's segments beyond the live blocks, the most of any traced depth, not extrapolated: they are
    what the step's largest transient tensors leave cached (the loss's logits, a block's widest intermediates), the
    same at every depth, not a block's worth each."""
    return {key: max(row.get(key, 0) for row in traced.values()) for key in SEGMENT_KEYS}


def uniform_stack(model: nn.Module, blocks: list[nn.Module]) -> tuple[nn.Module, str] | None:
    """``(parent, name)`` of the ``nn.ModuleList`` that holds exactly ``blocks`` when they are identical in shape
    (same class, same parameters and buffers); None otherwise (the model is then traced at full depth)."""
    from torch import nn

    def signature(block: nn.Module) -> tuple:
        return (type(block), tuple((n, tuple(t.shape), t.dtype, t.requires_grad) for n, t in block.named_parameters()),
                tuple((n, tuple(t.shape), t.dtype) for n, t in block.named_buffers()))

    if len(blocks) < 2 or len({signature(b) for b in blocks}) != 1:
        return None
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.ModuleList) and len(child) == len(blocks) and all(
                    a is b for a, b in zip(child, blocks, strict=True)):
                return parent, name
    return None


def truncated_copy(model: nn.Module, stack: tuple[nn.Module, str] | None, depth: int) -> nn.Module:
    """A deep copy of ``model`` (on meta) that keeps the first ``depth`` blocks of its stack."""
    from torch import nn

    if stack is None:
        raise GaplanError("internal: a truncated copy needs a uniform stack of blocks")
    parent, name = stack
    full = getattr(parent, name)
    parent._modules[name] = nn.ModuleList(list(full)[:depth])
    try:
        return copy.deepcopy(model)
    finally:
        parent._modules[name] = full
