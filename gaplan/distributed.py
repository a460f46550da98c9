"""This process's place under torchrun: the process group, rank and world size, and the few collectives training needs."""

from __future__ import annotations

import os

import torch


class Distributed:
    """This process's place under torchrun (rank 0 of 1 without it)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.active = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.active else 0
        self.world_size = dist.get_world_size() if self.active else 1

    def sum(self, value: float) -> float:
        if not self.active:
            return value
        tensor = torch.tensor([value], dtype=torch.float64)
        self.dist.all_reduce(tensor)
        return float(tensor.item())

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on any rank."""
        return bool(self.sum(1.0 if flag else 0.0)) if self.active else flag

    def min(self, value: int) -> int:
        if not self.active:
            return value
        tensor = torch.tensor([value], dtype=torch.int64)
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MIN)
        return int(tensor.item())


def init_distributed(device: str) -> Distributed:
    """Join the torchrun process group when its environment says so (gloo on CPU, nccl on CUDA)."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return Distributed()
