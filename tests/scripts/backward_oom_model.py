"""A ``module:function`` model whose backward runs out of memory once: on rank 1, at micro-batch 8 or more, in
torchrun's first start (``TORCHELASTIC_RESTART_COUNT`` 0).

The error stands in for the CPU allocator's at the one place under DDP that no vote reaches: the backward of the
last micro-step, which DDP synchronizes (the peers wait in its all-reduce). The rest is real: gaplan train under
torchrun, the marker, torchrun's restart, the ranks' agreement and the run at half the micro-batch.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from gaplan import CustomWorkload


def make_batch(size: int) -> dict[str, torch.Tensor]:
    features = torch.randn(size, 16)
    return {"features": features, "labels": (features.sum(1) > 0).long()}


def _out_of_memory(grad: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes (injected)")


def make_model() -> CustomWorkload:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))

    def loss(module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        value = F.cross_entropy(module(batch["features"]), batch["labels"])
        if (len(batch["labels"]) >= 8 and os.environ.get("RANK") == "1"
                and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"):
            model[0].weight.register_hook(_out_of_memory)  # the first layer's gradient: mid-backward
        return value

    return CustomWorkload(model=model, make_batch=make_batch, loss=loss, loss_is_scaled_for_ga=False)
