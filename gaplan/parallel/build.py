"""Build an FSDP2 workload without any rank's device ever holding the whole model.

Every rank builds the model on the meta device (nothing allocated), shards it (``fully_shard`` per block and
the root) and only then allocates its own shards on its device (``to_empty``). The weights come from rank 0:
it alone builds the whole model on the CPU (the config's random init under the run's seed, or the folder's
pretrained weights, as a one-process run starts) and torch's ``set_model_state_dict(broadcast_from_rank0=True)``
sends each tensor to the ranks, which keep their shard. Buffers that are not in a state dict (rotary
frequencies, position ids) are sent from rank 0 too. This is the initialization FSDP2's documentation
describes for models too large for one device; it is what makes ``gaplan plan``'s 70B launch command real.

A ``module:function`` workload builds its model in the user's code, so each rank builds it whole (under the
same seed) and it is sharded after, as before.
"""

from __future__ import annotations

import dataclasses

import torch

from gaplan.parallel.fsdp import find_blocks, shard_model
from gaplan.workload.build import Workload, build_workload, make_optimizer
from gaplan.workload.compile import compile_model
from gaplan.workload.spec import WorkloadSpec, model_source_kind


@dataclasses.dataclass(frozen=True)
class ShardedBuild:
    """The sharded workload and what the run says about it."""

    workload: Workload
    block_count: int


def build_sharded_workload(spec: WorkloadSpec, device: str | torch.device, *, seed: int = 0,
                           load_weights: bool = True, cpu_offload: bool = False) -> ShardedBuild:
    """``spec`` sharded over the default process group (joined already), materialized on ``device``.

    A collective: every rank calls it. ``load_weights`` as in :func:`build_workload` (rank 0 reads the folder).
    """
    import torch.distributed as dist

    spec.check_device(str(device))
    device = torch.device(device)
    if model_source_kind(spec.model) == "function":
        workload = build_workload(spec, device, seed=seed, load_weights=load_weights)
        blocks = len(find_blocks(workload.model))
        shard_model(workload.model, dtype=spec.dtype, cpu_offload=cpu_offload)
        return ShardedBuild(_with_new_optimizer(workload), blocks)
    workload = build_workload(spec, device, seed=seed, load_weights=load_weights, model_on_meta=True)
    model = workload.model
    blocks = len(find_blocks(model))
    shard_model(model, dtype=spec.dtype, cpu_offload=cpu_offload)
    # Offloaded shards live on the CPU; FSDP2 moves them to the device for each unit's compute.
    model.to_empty(device="cpu" if cpu_offload else device)
    source = build_workload(spec, "cpu", seed=seed, load_weights=load_weights) if dist.get_rank() == 0 else None
    _fill_from_rank0(model, source.model if source is not None else None)
    info = source.info if source is not None else workload.info
    workload = dataclasses.replace(workload, info=_broadcast_object(info))
    del source
    if spec.compile:  # built on meta, where build_workload leaves it eager: compiled once sharded and filled
        compile_model(model, device)
    return ShardedBuild(_with_new_optimizer(workload), blocks)


def _fill_from_rank0(model: torch.nn.Module, full: torch.nn.Module | None) -> None:
    """Rank 0's weights and buffers into every rank's shards (a collective; ``full`` is None off rank 0)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    state = full.state_dict() if full is not None else {}
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    # Non-persistent buffers are in no state dict: to_empty left them uninitialized on every rank.
    saved = set(state) if full is not None else None
    saved = _broadcast_object(saved)
    full_buffers = dict(full.named_buffers()) if full is not None else {}
    for name, buffer in model.named_buffers():
        if name in saved:
            continue
        if full is not None:
            buffer.copy_(full_buffers[name])
        dist.broadcast(buffer, src=0)


def _broadcast_object(value):
    """Rank 0's picklable ``value`` on every rank."""
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _with_new_optimizer(workload: Workload) -> Workload:
    """The optimizer made again over the sharded parameters: ``fully_shard`` replaced every one by a DTensor."""
    optimizer = make_optimizer(workload.model, workload.spec.optimizer, workload.spec.learning_rate)
    return dataclasses.replace(workload, optimizer=optimizer)
