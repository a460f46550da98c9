"""Pure arithmetic: effective batch -> micro-batch sizes x accumulation steps x world size.

No torch here, so it can be tested exhaustively and reused by every command.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from gaplan.core.errors import GaplanError

MAX_ACCUM_STEPS = 100_000  # micro-steps per optimizer step a plan may hold (and list, size by size)


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
    micro_batch_cap: int  # the largest micro-batch the plan may use (B*, or a tuner's smaller choice)
    micro_batch_sizes: tuple[int, ...]
    rank_micro_batch_sizes: tuple[tuple[int, ...], ...]

    @property
    def is_even(self) -> bool:
        """True when every micro-batch on every rank has the same size."""
        return len({s for sizes in self.rank_micro_batch_sizes for s in sizes}) == 1

    def describe(self) -> str:
        """One line for people: ``effective batch 256 = micro-batch 43 x 6 accumulation steps x world size 1 (...)``."""
        return (f"effective batch {self.effective_batch} = micro-batch {self.micro_batch} x {self.grad_accum_steps} "
                f"accumulation steps x world size {self.world_size}   (sizes {run_lengths(self.micro_batch_sizes)})")

    def to_dict(self) -> dict:
        data = asdict(self)
        data["micro_batch_sizes"] = list(self.micro_batch_sizes)
        data["rank_micro_batch_sizes"] = [list(s) for s in self.rank_micro_batch_sizes]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Plan:
        """Rebuild a plan saved by :meth:`to_dict`, checking it is self-consistent."""
        try:
            cap = data["micro_batch_cap"] if "micro_batch_cap" in data else data["max_micro_batch"]  # older files
            plan = make_plan(int(data["effective_batch"]), int(cap), int(data.get("world_size", 1)))
        except (KeyError, TypeError, ValueError) as exc:
            raise GaplanError(f"not a gaplan plan: missing or bad field {exc}") from None
        if plan.grad_accum_steps != int(data.get("grad_accum_steps", plan.grad_accum_steps)):
            raise GaplanError("plan is inconsistent: its accumulation steps do not match its batch sizes")
        return plan


def run_lengths(sizes: Sequence[int]) -> str:
    """``[32, 32, 32, 31]`` is ``32 x3, 31 x1``: a thousand-step plan stays one short line."""
    return ", ".join(f"{size} x{len(list(group))}" for size, group in itertools.groupby(sizes))


MAX_LISTED_SIZES = 8  # an uneven split with more micro-steps is written as runs of one size


def split_text(sizes: Sequence[int]) -> str:
    """One rank's micro-batch sizes as arithmetic that gives its share: ``32 x 2`` when even, else each size written
    out (``22,21,21``), or runs of one size past :data:`MAX_LISTED_SIZES` steps (``43 x 4 + 42 x 5``)."""
    if len(set(sizes)) == 1:
        return f"{sizes[0]} x {len(sizes)}"
    if len(sizes) <= MAX_LISTED_SIZES:
        return ",".join(str(s) for s in sizes)
    return " + ".join(f"{size} x {len(list(group))}" for size, group in itertools.groupby(sizes))


def default_search_cap(effective_batch: int, world_size: int = 1) -> int:
    """``ceil(E / W)``: a micro-batch above one rank's share of the step is never of use to the plan (a world size
    below 1 is :func:`make_plan`'s to refuse: the cap is 1 then)."""
    if not (isinstance(effective_batch, int) and isinstance(world_size, int) and world_size >= 1):
        return 1
    return -(-effective_batch // world_size)


def split_evenly(total: int, parts: int) -> tuple[int, ...]:
    """``total`` split into ``parts`` integers that differ by at most one, largest first."""
    base, extra = divmod(total, parts)
    return tuple(base + 1 if i < extra else base for i in range(parts))


def make_plan(effective_batch: int, micro_batch_cap: int, world_size: int = 1) -> Plan:
    """The plan with the fewest accumulation steps whose micro-batches are at most ``micro_batch_cap``.

    The fewest steps ``G`` with ``ceil(E / (W * G)) <= cap``; each rank takes ``E / W``
    samples (``E`` must divide by ``W``), spread as evenly as possible over micro-steps (E=256, B*=48 gives
    G=6 and sizes 43,43,43,43,42,42). When ``W * G`` divides ``E`` every
    micro-batch has the same size.
    """
    for name, value in (("effective batch", effective_batch), ("world size", world_size),
                        ("the largest micro-batch", micro_batch_cap)):
        if not isinstance(value, int) or isinstance(value, bool):  # "8", 4.5, True: a caller's mistake, said so
            raise GaplanError(f"{name} must be a positive integer (got {value!r})")
    for name, value in (("effective batch", effective_batch), ("world size", world_size)):
        if value < 1:
            raise GaplanError(f"{name} must be a positive integer (got {value})")
    if micro_batch_cap < 1:
        raise GaplanError(f"the largest micro-batch that fits must be at least 1 (got {micro_batch_cap}): "
                          "nothing fits this device and budget")
    if effective_batch < world_size:
        raise GaplanError(f"effective batch {effective_batch} is smaller than the world size {world_size}: "
                          "every rank needs at least one sample per step")
    if effective_batch % world_size:
        # Equal shares keep every rank's micro-steps identical (DDP syncs on each step's last one).
        raise GaplanError(f"effective batch {effective_batch} is not divisible by the world size {world_size}")
    share = effective_batch // world_size
    steps = -(-share // micro_batch_cap)  # ceil
    if steps > MAX_ACCUM_STEPS:
        # The plan lists every micro-batch size: an absurd effective batch would exhaust memory building it.
        raise GaplanError(f"effective batch {effective_batch} needs {steps} accumulation steps at micro-batch "
                          f"{min(micro_batch_cap, share)} x world size {world_size}; gaplan plans at most "
                          f"{MAX_ACCUM_STEPS} per optimizer step")
    per_rank = split_evenly(effective_batch, world_size)
    ranks = tuple(split_evenly(share, steps) for share in per_rank)
    return Plan(
        effective_batch=effective_batch,
        micro_batch=ranks[0][0],
        grad_accum_steps=steps,
        world_size=world_size,
        micro_batch_cap=micro_batch_cap,
        micro_batch_sizes=ranks[0],
        rank_micro_batch_sizes=ranks,
    )


def make_even_plan(effective_batch: int, micro_batch_cap: int, world_size: int = 1) -> Plan:
    """The plan with the fewest accumulation steps whose micro-batches are all one size, at most ``micro_batch_cap``.

    For a loader with one batch size (Lightning's, accelerate's DataLoader): ``micro_batch x G x W`` is exactly
    ``E``, so the micro-batch divides ``E / W`` (E=256, B*=48 gives 32 x 8; :func:`make_plan` gives 43 x 6 with
    sizes 43 and 42, which such a loader cannot feed). Micro-batch 1 always divides, so a plan exists whenever
    :func:`make_plan`'s does.
    """
    plan = make_plan(effective_batch, micro_batch_cap, world_size)  # the same checks and messages
    share = effective_batch // world_size
    steps = next(g for g in range(plan.grad_accum_steps, share + 1) if share % g == 0)
    return replace(make_plan(effective_batch, share // steps, world_size), micro_batch_cap=micro_batch_cap)


def even_trade_message(plan: Plan, even: Plan, route: str, remedy: str) -> str:
    """One line for a route that can only feed equal micro-batches and runs ``even`` instead of ``plan`` (gaplan's
    plan at B*): what it gives up, and the nearest effective batches that split evenly at B*. ``route`` names who
    needs equal micro-batches; ``remedy`` how to train the plan itself."""
    cap, world = plan.micro_batch_cap, plan.world_size
    step = min(cap, plan.effective_batch // world) * world
    lower, upper = plan.effective_batch // step * step, (plan.effective_batch // step + 1) * step
    nearby = f"{lower} or {upper}" if lower else f"{upper}"
    return (f"gaplan's plan splits {plan.effective_batch // world} samples per device as "
            f"{','.join(map(str, plan.micro_batch_sizes))}, but {route} needs equal micro-batches: "
            f"using {even.micro_batch} x {even.grad_accum_steps} accumulation steps x {world} device(s) instead "
            f"(largest micro-batch <= {cap} that divides {plan.effective_batch // world}), "
            f"{plan.micro_batch - even.micro_batch} samples under the micro-batch that fits. "
            f"An effective batch of {nearby} would split evenly at micro-batch {cap}; {remedy}.")
