"""The effective batch over a run: fixed, grown with the measured noise scale (adaptive), or a fixed ramp. No torch.

With gradient accumulation a bigger batch costs no memory: the micro-batch stays at B*, only the accumulation steps
change. The critical batch grows as the loss falls (McCandlish et al. 2018; Merrill et al. 2025's batch-size warmup),
so a run may start small and double its batch as the measured gradient noise scale says it is worth it.

- ``fixed``: the asked effective batch every step.
- ``adaptive``: start at ``minimum``; after each step, when the steps measured at the current batch show the noise
  scale (in samples) at least :data:`GROWTH_THRESHOLD` times the batch, by the test of :mod:`gaplan.plan.growth_test`
  (a confidence bound, not one reading), double it (never past ``maximum``). The window of steps starts again after a
  change, and nothing ever shrinks the batch: a noisy reading can delay growth, never undo it. On one process a step
  needs two micro-batches to be measured, so the schedule starts at 2 or more there.
- ``warmup:STEPS``: the same doublings from ``minimum`` at evenly spaced steps, ``maximum`` from step ``STEPS`` on,
  whatever the noise scale (the noise-independent ramp to compare with).

Every step's samples follow the last one's in the data's seeded order (``first_sample``), so a step depends only on
the schedule's history, which the checkpoint keeps: a resumed run takes the same samples at the same sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from gaplan.core.options import OptionError
from gaplan.plan.growth_test import MIN_STEPS, SHORT_WINDOW, WINDOW, StepNoise, Z, growth_test

SCHEDULES = ("fixed", "adaptive", "warmup")


class ScheduleChoice(NamedTuple):
    """``--batch-schedule`` as a value: its kind and, for ``warmup:STEPS``, the ramp's steps (0 for the others)."""

    kind: str
    ramp_steps: int = 0

    def __str__(self) -> str:  # the text it was given as, which train.json saves
        return f"{self.kind}:{self.ramp_steps}" if self.kind == "warmup" else self.kind


FIXED = ScheduleChoice("fixed")
GROWTH_THRESHOLD = 2.0  # grow while the batch is below half the noise scale: its steps are mostly noise


@dataclass(frozen=True)
class ScheduleState:
    """Where a run's schedule stands before a step: its effective batch, the position in the data's order of the
    step's first sample, and the noise measured at this batch (the adaptive rule's window, its last :data:`WINDOW`
    steps)."""

    effective_batch: int
    first_sample: int = 0
    window: tuple[StepNoise, ...] = ()

    @property
    def streak(self) -> int:
        """The steps measured at the current batch that the next decision weighs."""
        return len(self.window)

    def to_dict(self) -> dict:
        return {"effective_batch": self.effective_batch, "first_sample": self.first_sample,
                "window": [[s.grad_var, s.grad_sq] for s in self.window]}

    @classmethod
    def from_dict(cls, data: dict) -> ScheduleState:
        # (a checkpoint of an older gaplan kept a streak of smoothed readings, not a window: the window starts empty)
        window = tuple(StepNoise(float(v), float(g)) for v, g in data.get("window", ()))
        return cls(int(data["effective_batch"]), int(data["first_sample"]), window)


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
    ``min_steps``, ``z``, ``short_window``: the adaptive test's (:func:`gaplan.plan.growth_test.growth_test`).
    """

    kind: str = "fixed"
    minimum: int = 1
    maximum: int = 1
    ramp_steps: int = 0
    world_size: int = 1
    threshold: float = GROWTH_THRESHOLD
    min_steps: int = MIN_STEPS
    z: float = Z
    short_window: float = SHORT_WINDOW

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise OptionError(f"batch_schedule must be fixed, adaptive or warmup:STEPS (got {self.kind!r})",
                              "batch_schedule")
        for name in ("minimum", "maximum", "world_size", "min_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise OptionError(f"the schedule's {name} must be a positive integer (got {value!r})")
        if self.minimum > self.maximum:
            raise OptionError(f"effective_batch_min {self.minimum} is above effective_batch {self.maximum}: the "
                              "schedule grows from the first to the second", "effective_batch_min", "effective_batch")
        if self.minimum % self.world_size:
            raise OptionError(f"effective_batch_min {self.minimum} is not divisible by the world size "
                              f"{self.world_size}", "effective_batch_min")
        if self.kind == "adaptive" and self.world_size == 1 and self.minimum < 2:
            fields = ("effective_batch_min",) if self.maximum >= 2 else ("batch_schedule", "effective_batch")
            raise OptionError(adaptive_needs_two(self.maximum), *fields)
        if self.kind == "warmup" and self.ramp_steps < 1:
            raise OptionError(f"batch_schedule warmup:STEPS needs STEPS of at least 1 (got {self.ramp_steps})",
                              "batch_schedule")
        for name in ("threshold", "z"):
            if not (getattr(self, name) > 0 and getattr(self, name) < float("inf")):
                raise OptionError(f"the schedule's {name} must be a positive number (got {getattr(self, name)})")
        if not (self.short_window >= 0 and self.short_window < float("inf")):
            raise OptionError(f"the schedule's short_window must be 0 or more (got {self.short_window})")

    @classmethod
    def of(cls, choice: ScheduleChoice, minimum: int, maximum: int, world_size: int = 1) -> BatchSchedule:
        """``choice`` between ``minimum`` and ``maximum``."""
        return cls(choice.kind, minimum, maximum, choice.ramp_steps, world_size)

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

    def after_step(self, state: ScheduleState, step: int, noise: StepNoise | None
                   ) -> tuple[ScheduleState, ScheduleChange | None]:
        """The state for the step after step ``step`` (0-based), given that step's own noise estimates (None where
        not measured), and the change made, if any."""
        batch, first = state.effective_batch, state.first_sample + state.effective_batch
        if self.kind == "fixed":
            return replace(state, first_sample=first), None
        if self.kind == "warmup":
            after = max(batch, self.ramp_batch(step + 1))
            change = (ScheduleChange(step + 1, batch, after, f"warmup ramp over its first {self.ramp_steps} steps "
                                                           f"to {self.maximum}") if after != batch else None)
            return ScheduleState(after, first), change
        window = (state.window + (noise,))[-WINDOW:] if noise is not None else state.window
        if batch < self.maximum and noise is not None:
            test = growth_test(window, self.threshold, batch, self.z, self.short_window, self.min_steps)
            if test.grow:
                after = next(level for level in self.levels if level > batch)
                change = ScheduleChange(step + 1, batch, after, test.describe(self.threshold, batch))
                return ScheduleState(after, first), change
        return ScheduleState(batch, first, window if batch < self.maximum else ()), None


def parse_schedule(text: str | ScheduleChoice) -> ScheduleChoice:
    """``fixed``, ``adaptive`` or ``warmup:STEPS`` as a :class:`ScheduleChoice` (one already passes)."""
    if isinstance(text, ScheduleChoice):
        return text
    kind, _, steps = str(text).partition(":")
    if kind == "warmup":
        if not steps.isdigit() or int(steps) < 1:
            raise OptionError(f"batch_schedule warmup:STEPS needs a positive number of steps (got {text!r})",
                              "batch_schedule")
        return ScheduleChoice(kind, int(steps))
    if steps or kind not in SCHEDULES:
        raise OptionError(f"batch_schedule must be fixed, adaptive or warmup:STEPS (got {text!r})", "batch_schedule")
    return ScheduleChoice(kind)


def adaptive_needs_two(maximum: int) -> str:
    """Why one process cannot measure the noise scale at an effective batch of 1, and what to do instead."""
    if maximum < 2:
        return (f"batch_schedule adaptive measures the noise scale from two micro-batches a step, and an effective "
                f"batch of {maximum} on one process is one: give effective_batch 2 or more, or use warmup:STEPS")
    return ("batch_schedule adaptive measures the noise scale from two micro-batches a step: on one process its "
            "effective_batch_min must be 2 or more")


def measurable_cap(effective_batch: int, micro_batch_cap: int, world_size: int) -> int:
    """The micro-batch cap that gives a step at least two micro-batches in all, so the noise scale (which compares
    them) can be measured: on one process a step that fits in one micro-batch is split in two."""
    if world_size > 1:
        return micro_batch_cap
    return max(1, min(micro_batch_cap, -(-effective_batch // 2)))
