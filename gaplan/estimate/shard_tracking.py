"""What torch's FSDP tracker sees of one rank, in gaplan's terms: peaks by category, the optimizer states of the
shards made without a step, rank 0's local shard shapes, and the unsharded gradients a no-sync micro-step holds.

The helpers of :class:`gaplan.estimate.sharded.ShardedTracer`, kept apart from its trace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gaplan.core.errors import GaplanError
from gaplan.estimate.torch_private import private_attr, private_module
from gaplan.workload.spec import ADAMW_IMPLEMENTATIONS

if TYPE_CHECKING:
    from torch import nn


def local_rows(rows: int, world_size: int) -> int:
    """Rank 0's rows of a dimension-0 shard (FSDP2 chunks dim 0 into ``ceil(rows / W)`` and pads the rest)."""
    return max(1, -(-rows // world_size))

def by_category(snapshot: dict, names: dict[str, str]) -> dict[str, int]:
    """A tracker's peak snapshot for the (one, cpu) device, as ``{gaplan name: bytes}``."""
    if len(snapshot) != 1:
        seen = ", ".join(str(key) for key in snapshot) or "nothing"
        raise GaplanError(f"the sharded trace expected one device, torch's tracker reported {seen}")
    (peak,) = snapshot.values()
    out: dict[str, int] = {}
    for key, value in peak.items():
        name = names.get(getattr(key, "value", key))
        if name is not None:
            out[name] = out.get(name, 0) + int(value)
    return out


def fill_optimizer_state(optimizer, name: str) -> None:
    """The steady state's optimizer states on the shards: AdamW's step count and two moments (SGD has none).

    Made directly, not by a step: a first step over DTensors runs DTensor's sharding propagation for
    every parameter shape (minutes for a large model), and the states are what AdamW's first step makes.
    """
    import torch

    if name not in ADAMW_IMPLEMENTATIONS:  # torch's AdamW in any kernel: the same two moments
        return
    for group in optimizer.param_groups:
        for param in group["params"]:
            optimizer.state[param] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(param),
                                      "exp_avg_sq": torch.zeros_like(param)}


def local_shard_shapes(model: nn.Module, world_size: int) -> tuple[list[tuple], list[tuple]]:
    """Rank 0's local shard of every parameter as ``(shape, dtype, requires_grad)``, and the buffers' ``(shape, dtype)``."""
    params = []
    for param in model.parameters():
        rows = param.shape[0] if param.dim() else 1
        params.append(((local_rows(rows, world_size), *param.shape[1:]), param.dtype, param.requires_grad))
    buffers = [(tuple(buffer.shape), buffer.dtype) for buffer in model.buffers()]
    return params, buffers


def local_shard_module(shapes: tuple[list[tuple], list[tuple]]) -> nn.Module:
    """A module holding (fake, under the fake mode) tensors of :func:`local_shard_shapes`."""
    import torch
    from torch import nn

    params, buffers = shapes
    holder = nn.Module()
    holder.shards = nn.ParameterList([nn.Parameter(torch.empty(shape, dtype=dtype, device="cpu"), requires_grad=grad)
                                      for shape, dtype, grad in params])
    for index, (shape, dtype) in enumerate(buffers):
        holder.register_buffer(f"buffer_{index}", torch.empty(shape, dtype=dtype, device="cpu"))
    return holder


def label_held_gradients(tracker, model: nn.Module) -> None:
    """Label the unsharded gradients a no-sync micro-step left (fp32 under mixed precision) as unsharded gradients."""
    from torch.distributed.fsdp import FSDPModule

    module = private_module("torch.distributed._tools.fsdp2_mem_tracker")
    unsharded_grad = private_attr(private_attr(module, "_FSDPRefType"), "UNSHARDED_GRAD")
    update = private_attr(tracker, "_update_and_maybe_create_winfos")
    for unit in model.modules():
        if not isinstance(unit, FSDPModule):
            continue
        group = private_attr(private_attr(unit, "_get_fsdp_state")(), "_fsdp_param_group")
        if group is None:
            continue
        for param in private_attr(group, "fsdp_params"):
            held = getattr(param, "unsharded_accumulated_grad", None)
            if held is None and hasattr(param, "_unsharded_param"):
                held = param._unsharded_param.grad
            if held is not None:
                update(held, unsharded_grad, update_existing=True)

