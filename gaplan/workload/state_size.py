"""What a state takes on disk: the bytes of its tensors (checkpoints, shards, weights files), checked before writing."""

from __future__ import annotations

from typing import Any

import torch


def tensor_bytes(state: Any, shared_once: bool = True) -> int:
    """The bytes of the tensors in a nested state: what a checkpoint or a weights file of it takes on disk, less its
    headers. ``shared_once``: a storage two entries share (tied weights) counts once, as ``torch.save`` writes it;
    distributed checkpoint writes every entry, so it counts each. A DTensor counts its local shard."""
    seen: set[int] = set()
    total = 0
    pending = [state]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            pending += list(value.values())
        elif isinstance(value, (list, tuple)):
            pending += list(value)
        elif isinstance(value, torch.Tensor):
            local = value.to_local() if hasattr(value, "to_local") else value  # a DTensor: this rank's shard
            if not shared_once:
                total += local.numel() * local.element_size()
                continue
            storage = local.untyped_storage()
            if storage.data_ptr() not in seen or storage.data_ptr() == 0:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total
