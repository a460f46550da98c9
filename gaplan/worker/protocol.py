"""What the probe sends its trial worker, typed: the setup once, then one request per trial. No torch.

Both travel as JSON lines (:mod:`gaplan.worker.serve`); these classes are their only shape.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class WorkerSetup:
    """The workload (``WorkloadSpec.to_dict()``), where it runs (``auto``: the worker resolves it and says which in
    its ready message) and under which budget (None: the device's own)."""

    workload: dict[str, Any]
    device: str
    limit_bytes: int | None
    threads: int | None = None
    seed: int = 0
    warm_optimizer: bool = True  # create the optimizer's states before the trial (steady state)
    ddp: bool = False  # wrap the model in DistributedDataParallel, as a run on several ranks trains it
    # Ranks per trial: above 1 (FSDP) every trial is that many forked processes in one process group, each
    # under its own budget (cuda:r for rank r on CUDA); the trial fits only if it fits on every rank.
    ranks: int = 1
    timeout_s: float | None = None  # a multi-rank trial that has not ended by then is killed (None: no limit)
    # limit_bytes is a card's memory (--memory-limit): on CUDA, what a process holds outside the allocator (the
    # context, NCCL's buffers above one rank: gaplan.devices.reserve) comes off it before it caps the allocator.
    card_limit: bool = False

    def allocator_limit(self, device: str) -> int | None:
        """The allocator's budget on ``device``: ``limit_bytes``, less the allowances when it is a card's memory."""
        if not (self.card_limit and self.limit_bytes and device.startswith("cuda")):
            return self.limit_bytes
        from gaplan.devices.reserve import outside_allocator_bytes

        world = 2 if self.ddp or self.ranks > 1 else 1  # above one rank, NCCL's buffers
        return max(1, self.limit_bytes - outside_allocator_bytes(world))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerSetup:
        return cls(**data)


@dataclass(frozen=True)
class TrialRequest:
    """One trial: ``optimizer_steps`` steps of ``micro_steps`` micro-batches of ``micro_batch`` samples.

    ``sizes`` replaces the even split by one step's uneven sizes (a plan's); ``unbounded`` lifts the
    budget (a reference run known not to fit); ``breakdown`` asks for peak bytes by category instead.
    """

    micro_batch: int
    micro_steps: int = 2
    optimizer_steps: int = 1
    sizes: list[int] | None = field(default=None)
    unbounded: bool = False
    breakdown: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialRequest:
        return cls(**data)
