"""This process's place under torchrun: the process group, rank and world size, and the few collectives training needs."""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable

import torch

from gaplan.core.disk import WriteFailed
from gaplan.core.errors import GaplanError, mark_rank_own


class Distributed:
    """This process's place under torchrun (rank 0 of 1 without it)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.active = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.active else 0
        self.world_size = dist.get_world_size() if self.active else 1
        # torchrun's LOCAL_RANK is this process's GPU on its node; the global rank is not (2 nodes x 8 GPUs).
        self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank)) if self.active else 0
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size)) if self.active else 1

    def sum(self, value: float) -> float:
        if not self.active:
            return value
        tensor = torch.tensor([value], dtype=torch.float64)
        self.dist.all_reduce(tensor)
        return float(tensor.item())

    def sums(self, values: list[float]) -> list[float]:
        """Each of ``values`` summed over the ranks, in one collective."""
        if not self.active:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64)
        self.dist.all_reduce(tensor)
        return [float(v) for v in tensor.tolist()]

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on any rank."""
        return bool(self.sum(1.0 if flag else 0.0)) if self.active else flag

    def fail_together(self, failure: Exception | None, elsewhere: str,
                      cleanup: Callable[[], None] | None = None) -> None:
        """Raise on every rank when any rank has ``failure``: its own, or on the others a one-line
        :class:`WriteFailed` saying ``elsewhere``; ``cleanup`` runs on rank 0 first (then all wait for it)."""
        failed = 1.0 if failure is not None else 0.0
        anywhere, on_rank_0 = self.sums([failed, failed if self.rank == 0 else 0.0]) if self.active else (failed, failed)
        if not anywhere:
            return
        if failure is not None and not on_rank_0:  # rank 0 says "another rank ...": this rank's line says why
            mark_rank_own(failure)
        if cleanup is not None:
            if self.rank == 0:
                cleanup()
            self.barrier()
        raise failure or WriteFailed(elsewhere)

    def min(self, value: int) -> int:
        if not self.active:
            return value
        tensor = torch.tensor([value], dtype=torch.int64)
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MIN)
        return int(tensor.item())


    def barrier(self) -> None:
        if self.active:
            self.dist.barrier()


# How to launch torchrun so that a restart forms a new process group (measured with gloo on torch 2.13).
RESTARTABLE_LAUNCH = ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --rdzv-backend c10d --rdzv-endpoint HOST:PORT "
                      "--max-restarts 1")


def process_group_backend(device: str) -> str:
    """gloo on CPU; on CUDA NCCL for CUDA tensors and gloo for the CPU tensors of the votes, sums and RNG states."""
    return "cpu:gloo,cuda:nccl" if device.startswith("cuda") else "gloo"


def local_device(device: str) -> str:
    """The device this process trains on: ``cuda:LOCAL_RANK`` under torchrun on CUDA, else ``device`` as given."""
    if device.startswith("cuda") and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


def init_distributed(device: str) -> Distributed:
    """Join the torchrun process group when its environment says so.

    It does not bind the CUDA device: ``torch.cuda.set_device`` creates the primary context (CUDA 12 creates it
    eagerly), hundreds of MiB on the card. Here that would sit on the card of the node's first process while it
    probes, a second context beside the trial's own that training will not have. The device is bound by the memory
    meter (``CudaBackend.activate``), after the plan and before the model is built; until then the ranks talk
    through gloo only (CPU tensors, and a barrier on a "cpu:gloo,cuda:nccl" group goes to gloo), which needs no
    device, and NCCL makes its communicator at its first collective, on the device bound by then.
    """
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        # A node's first process probes while the others wait in a barrier: allow for a long probe.
        try:
            dist.init_process_group(process_group_backend(device), timeout=datetime.timedelta(hours=2))
        except RuntimeError as exc:
            if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:
                raise
            # The rendezvous store torchrun shares with its ranks can hand restarted ranks the dead ranks'
            # addresses (pytorch/pytorch#135712; the static rendezvous, --master-port, always does).
            raise GaplanError(f"the ranks torchrun restarted could not form their process group "
                              f"({str(exc).splitlines()[0][:100]}): restarts need "
                              f"{RESTARTABLE_LAUNCH} ... (a store of the ranks' own and the c10d rendezvous)") from None
    return Distributed()


def end_distributed() -> None:
    """Destroy the process group before the interpreter exits. A gloo group left to interpreter teardown can abort
    a rank that finished ("terminate called without an active exception", SIGABRT), failing a run that trained:
    seen once in CI on a 2-rank FSDP run."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

