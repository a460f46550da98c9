"""The effective batch over a run: fixed, grown with the measured noise scale (adaptive), or a fixed ramp. No torch.

With gradient accumulation a bigger batch costs no memory: the micro-batch stays at B*, only the accumulation steps
change. The critical batch grows as the loss falls (McCandlish et al. 2018; Merrill et al. 2025's batch-size warmup),
so a run may start small and double its batch as the measured gradient noise scale says it is worth it.

- ``fixed``: the asked effective batch every step.
- ``adaptive``: start at ``minimum``; after each step, when the smoothed noise scale (in samples) is at least
  :data:`GROWTH_THRESHOLD` times the current batch for :data:`PATIENCE` steps in a row, double it (never past
  ``maximum``). The streak starts again after a change, and nothing ever shrinks the batch: a noisy reading can delay
  growth, never undo it.
- ``warmup:STEPS``: the same doublings from ``minimum`` at evenly spaced steps, ``maximum`` from step ``STEPS`` on,
  whatever the noise scale (the noise-independent ramp to compare with).

Every step's samples follow the last one's in the data's seeded order (``first_sample``), so a step depends only on
the schedule's history, which the checkpoint keeps: a resumed run takes the same samples at the same sizes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from gaplan.core.options import OptionError

SCHEDULES = ("fixed", "adaptive", "warmup")
GROWTH_THRESHOLD = 2.0  # grow while the batch is below half the noise scale: its steps are mostly noise
PATIENCE = 5  # ... for this many steps in a row (the smoothed reading, not one lucky step)


@dataclass(frozen=True)
class ScheduleState:
    """Where a run's schedule stands before a step: its effective batch, the growth streak, and the position in
    the data's order of the step's first sample."""

    effective_batch: int
    streak: int = 0
    first_sample: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ScheduleState:
        return cls(int(data["effective_batch"]), int(data["streak"]), int(data["first_sample"]))


@dataclass(frozen=True)
class ScheduleChange:
    """One change of the effective batch, after step ``step`` (1-based), and why."""

    step: int
    before: int
    after: int
    reason: str


@dataclass(frozen=True)
class BatchSchedule:
    """How the effective batch moves between ``minimum`` and ``maximum`` (both in samples, divisible by ``world_size``).

    ``kind``: ``fixed``, ``adaptive`` or ``warmup`` (then ``ramp_steps``, the step from which it is ``maximum``).
    """

    kind: str = "fixed"
    minimum: int = 1
    maximum: int = 1
    ramp_steps: int = 0
    world_size: int = 1
    threshold: float = GROWTH_THRESHOLD
    patience: int = PATIENCE

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise OptionError(f"batch_schedule must be fixed, adaptive or warmup:STEPS (got {self.kind!r})",
                              "batch_schedule")
        for name in ("minimum", "maximum", "world_size", "patience"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise OptionError(f"the schedule's {name} must be a positive integer (got {value!r})")
        if self.minimum > self.maximum:
            raise OptionError(f"effective_batch_min {self.minimum} is above effective_batch {self.maximum}: the "
                              "schedule grows from the first to the second", "effective_batch_min", "effective_batch")
        if self.minimum % self.world_size:
            raise OptionError(f"effective_batch_min {self.minimum} is not divisible by the world size "
                              f"{self.world_size}", "effective_batch_min")
        if self.kind == "warmup" and self.ramp_steps < 1:
            raise OptionError(f"batch_schedule warmup:STEPS needs STEPS of at least 1 (got {self.ramp_steps})",
                              "batch_schedule")
        if not (self.threshold > 0 and self.threshold < float("inf")):
            raise OptionError(f"the schedule's threshold must be a positive number (got {self.threshold})")

    @classmethod
    def parse(cls, text: str, minimum: int, maximum: int, world_size: int = 1) -> BatchSchedule:
        """``fixed``, ``adaptive`` or ``warmup:STEPS`` between ``minimum`` and ``maximum``."""
        kind, ramp_steps = parse_schedule(text)
        return cls(kind, minimum, maximum, ramp_steps, world_size)

    @property
    def levels(self) -> list[int]:
        """The effective batches the schedule can take: ``minimum`` doubling, then ``maximum``."""
        if self.kind == "fixed":
            return [self.maximum]
        levels = [self.minimum]
        while levels[-1] * 2 < self.maximum:
            levels.append(levels[-1] * 2)
        if levels[-1] != self.maximum:
            levels.append(self.maximum)
        return levels

    def start(self) -> ScheduleState:
        """The state of a run's first step."""
        return ScheduleState(self.maximum if self.kind == "fixed" else self.minimum)

    def ramp_batch(self, step: int) -> int:
        """``warmup``: the effective batch of step ``step`` (0-based): the levels at evenly spaced steps."""
        levels = self.levels
        return levels[min(len(levels) - 1, step * (len(levels) - 1) // self.ramp_steps)]

    def after_step(self, state: ScheduleState, step: int, noise_scale: float | None
                   ) -> tuple[ScheduleState, ScheduleChange | None]:
        """The state for the step after step ``step`` (0-based), given its smoothed noise scale in samples (None
        where not measured), and the change made, if any."""
        batch, first = state.effective_batch, state.first_sample + state.effective_batch
        if self.kind == "fixed":
            return replace(state, first_sample=first), None
        if self.kind == "warmup":
            after = max(batch, self.ramp_batch(step + 1))
            change = (ScheduleChange(step + 1, batch, after, f"warmup ramp to {self.maximum} by step "
                                                           f"{self.ramp_steps}") if after != batch else None)
            return ScheduleState(after, 0, first), change
        streak = state.streak + 1 if noise_scale is not None and noise_scale >= self.threshold * batch else 0
        if streak >= self.patience and batch < self.maximum:
            after = next(level for level in self.levels if level > batch)
            shown = f"{noise_scale:.1f}" if noise_scale != float("inf") else "beyond measure (|G|^2 <= 0)"
            reason = f"noise scale {shown} >= {self.threshold:g} x {batch} for {streak} steps"
            return ScheduleState(after, 0, first), ScheduleChange(step + 1, batch, after, reason)
        return ScheduleState(batch, streak, first), None


def parse_schedule(text: str) -> tuple[str, int]:
    """``fixed``, ``adaptive`` or ``warmup:STEPS`` as its kind and its ramp's steps (0 but for warmup)."""
    kind, _, steps = str(text).partition(":")
    if kind == "warmup":
        if not steps.isdigit() or int(steps) < 1:
            raise OptionError(f"batch_schedule warmup:STEPS needs a positive number of steps (got {text!r})",
                              "batch_schedule")
        return kind, int(steps)
    if steps or kind not in SCHEDULES:
        raise OptionError(f"batch_schedule must be fixed, adaptive or warmup:STEPS (got {text!r})", "batch_schedule")
    return kind, 0


def measurable_cap(effective_batch: int, micro_batch_cap: int, world_size: int) -> int:
    """The micro-batch cap that gives a step at least two micro-batches in all, so the noise scale (which compares
    them) can be measured: on one process a step that fits in one micro-batch is split in two."""
    if world_size > 1:
        return micro_batch_cap
    return max(1, min(micro_batch_cap, -(-effective_batch // 2)))
