"""How a workload's model is spread over ranks: replicated (DDP) or sharded (FSDP2's ``fully_shard``).

FSDP2 shards each transformer block and then the root, so a block's full parameters exist only
while it runs. Two settings make the loss token-exact (``sum / num_items_in_batch`` over all ranks
needs a *summed* gradient, not FSDP's default average), and both go on **every** unit: set on the
root alone they silently leave the blocks averaging (measured; see DESIGN.md "Sharding"):

* ``set_gradient_divide_factor(1.0)``: no division;
* ``set_force_sum_reduction_for_comms(True)``: a plain SUM, since gloo has no ``PREMUL_SUM``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from gaplan.core.errors import GaplanError

DTYPES_LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}


def block_classes(model: nn.Module) -> set[type[nn.Module]]:
    """The classes of the model's transformer blocks: HF's ``_no_split_modules`` names, or the model's own
    ``gaplan_fsdp_blocks`` (a list of classes or class names) for a ``module:function`` workload."""
    names = getattr(model, "gaplan_fsdp_blocks", None) or getattr(model, "_no_split_modules", None) or []
    classes = {name for name in names if isinstance(name, type)}
    wanted = {name for name in names if isinstance(name, str)}
    classes |= {type(module) for module in model.modules() if type(module).__name__ in wanted}
    return classes


def find_blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks to shard one by one (outermost first; a block inside a block is not split off)."""
    classes = block_classes(model)
    blocks: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if module is not model and type(module) in classes:
            blocks.append(module)
            inside.update(id(child) for child in module.modules())
    if not blocks:
        raise GaplanError(f"--parallel fsdp: no transformer blocks found in {type(model).__name__} (it has no "
                          "_no_split_modules); a module:function workload names its own: set "
                          "model.gaplan_fsdp_blocks = [MyBlock] (classes or class names)")
    return blocks


def shard_model(model: nn.Module, *, dtype: str = "fp32", cpu_offload: bool = False, mesh=None) -> nn.Module:
    """``fully_shard`` each block, then the root; in place (the model becomes an ``FSDPModule``)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    low = DTYPES_LOW.get(dtype)
    # Compute in low precision, reduce gradients in fp32; the sharded master weights stay in their dtype.
    precision = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32) if low else MixedPrecisionPolicy()
    offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    units = [*find_blocks(model), model]
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=precision, offload_policy=offload)
    for unit in units:
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def no_sync_for(model: nn.Module, grad_sync: str = "last") -> Callable[[], contextlib.AbstractContextManager] | None:
    """What keeps a micro-step (all but the last) from synchronizing gradients: DDP's ``no_sync``; for a
    sharded model, ``set_requires_gradient_sync(False)`` for the micro-step, or None with ``grad_sync="every"``
    (then every micro-step reduce-scatters, and gradients stay sharded in between)."""
    if not is_sharded(model):
        return getattr(model, "no_sync", None)
    if grad_sync == "every":
        return None

    @contextlib.contextmanager
    def no_sync() -> Iterator[None]:
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return no_sync
