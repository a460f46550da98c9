"""Pure arithmetic: effective batch -> micro-batch sizes x accumulation steps x world size.

No torch here, so it can be tested exhaustively and reused by every command.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gaplan.errors import GaplanError


@dataclass(frozen=True)
class Plan:
    """How one optimizer step of ``effective_batch`` samples is split.

    ``rank_micro_batch_sizes[r][g]`` is the number of samples rank ``r`` feeds at
    micro-step ``g``; ``micro_batch_sizes`` is rank 0's list (all ranks when the
    effective batch divides evenly).
    """

    effective_batch: int
    micro_batch: int
    grad_accum_steps: int
    world_size: int
    max_micro_batch: int
    micro_batch_sizes: tuple[int, ...]
    rank_micro_batch_sizes: tuple[tuple[int, ...], ...]

    @property
    def is_even(self) -> bool:
        """True when every micro-batch on every rank has the same size."""
        return len({s for sizes in self.rank_micro_batch_sizes for s in sizes}) == 1

    def to_dict(self) -> dict:
        data = asdict(self)
        data["micro_batch_sizes"] = list(self.micro_batch_sizes)
        data["rank_micro_batch_sizes"] = [list(s) for s in self.rank_micro_batch_sizes]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Plan:
        """Rebuild a plan saved by :meth:`to_dict`, checking it is self-consistent."""
        try:
            plan = make_plan(int(data["effective_batch"]), int(data["max_micro_batch"]),
                             int(data.get("world_size", 1)))
        except (KeyError, TypeError, ValueError) as exc:
            raise GaplanError(f"not a gaplan plan: missing or bad field {exc}") from None
        if plan.grad_accum_steps != int(data.get("grad_accum_steps", plan.grad_accum_steps)):
            raise GaplanError("plan is inconsistent: its accumulation steps do not match its batch sizes")
        return plan


def split_evenly(total: int, parts: int) -> tuple[int, ...]:
    """``total`` split into ``parts`` integers that differ by at most one, largest first."""
    base, extra = divmod(total, parts)
    return tuple(base + 1 if i < extra else base for i in range(parts))


def make_plan(effective_batch: int, max_micro_batch: int, world_size: int = 1) -> Plan:
    """The plan with the fewest accumulation steps whose micro-batches all fit.

    The fewest steps ``G`` with ``ceil(E / (W * G)) <= B*``; each rank takes ``E / W``
    samples (``E`` must divide by ``W``), spread as evenly as possible over micro-steps (E=256, B*=48 gives
    G=6 and sizes 43,43,43,43,42,42). When ``W * G`` divides ``E`` every
    micro-batch has the same size.
    """
    for name, value in (("effective batch", effective_batch), ("world size", world_size)):
        if not isinstance(value, int) or value < 1:
            raise GaplanError(f"{name} must be a positive integer (got {value})")
    if not isinstance(max_micro_batch, int) or max_micro_batch < 1:
        raise GaplanError(f"the largest micro-batch that fits must be at least 1 (got {max_micro_batch}): "
                          "nothing fits this device and budget")
    if effective_batch < world_size:
        raise GaplanError(f"effective batch {effective_batch} is smaller than the world size {world_size}: "
                          "every rank needs at least one sample per step")
    if effective_batch % world_size:
        # Equal shares keep every rank's micro-steps identical (DDP syncs on each step's last one).
        raise GaplanError(f"effective batch {effective_batch} is not divisible by the world size {world_size}")
    per_rank = split_evenly(effective_batch, world_size)
    steps = -(-per_rank[0] // max_micro_batch)  # ceil; rank 0 holds the largest share
    ranks = tuple(split_evenly(share, steps) for share in per_rank)
    return Plan(
        effective_batch=effective_batch,
        micro_batch=ranks[0][0],
        grad_accum_steps=steps,
        world_size=world_size,
        max_micro_batch=max_micro_batch,
        micro_batch_sizes=ranks[0],
        rank_micro_batch_sizes=ranks,
    )
