"""The loop's side of a batch schedule (:mod:`gaplan.plan.schedule`): each step's plan and samples, the learning
rate's factor, and what a checkpoint keeps of it."""

from __future__ import annotations

from typing import Any

from gaplan.plan.goodput import scaled_learning_rate
from gaplan.plan.growth_test import StepNoise
from gaplan.plan.schedule import BatchSchedule, ScheduleChange, ScheduleState, measurable_cap
from gaplan.plan.split import Plan, make_plan
from gaplan.training.noise_scale import NoiseReading


def step_noise(reading: NoiseReading | None) -> StepNoise | None:
    """What a schedule decides on from a step's reading: the step's own estimates, not the smoothed ones (those
    remember steps at the old batch)."""
    if reading is None:
        return None
    return StepNoise.of(reading.step_grad_sq, reading.step_grad_var, reading.items_per_sample)


class ScheduleFollower:
    """Follows ``schedule`` through a run whose largest micro-batch is ``micro_batch_cap`` (B*, or less after an
    out-of-memory fallback) on ``world_size`` ranks; ``lr_scaling`` scales the learning rate from the schedule's
    largest batch (the one ``--lr`` was given for) to each step's."""

    def __init__(self, schedule: BatchSchedule, lr_scaling: str, micro_batch_cap: int, world_size: int) -> None:
        self.schedule, self.lr_scaling = schedule, lr_scaling
        self.micro_cap, self.world_size = micro_batch_cap, world_size
        self.state = schedule.start()

    @property
    def effective_batch(self) -> int:
        return self.state.effective_batch

    def lr_factor(self) -> float:
        """The learning rate's factor at the current effective batch."""
        return scaled_learning_rate(1.0, self.state.effective_batch, self.schedule.maximum, self.lr_scaling)

    def plan(self) -> Plan:
        """The plan of the next step: its effective batch at the micro-batch cap. Adaptive needs two micro-batches
        a step to measure the noise scale it decides on, so one process splits a step that would be one."""
        batch = self.state.effective_batch
        cap = (measurable_cap(batch, self.micro_cap, self.world_size) if self.schedule.kind == "adaptive"
               else self.micro_cap)
        return make_plan(batch, min(cap, self.micro_cap), self.world_size)

    def fell_back_to(self, plan: Plan) -> None:
        """A step ran out of memory and was redone at ``plan``: no later step goes above its micro-batches."""
        self.micro_cap = min(self.micro_cap, plan.micro_batch_cap)

    def after_step(self, step: int, reading: NoiseReading | None) -> ScheduleChange | None:
        """Decide the next step's effective batch from step ``step`` (0-based) and its noise reading."""
        self.state, change = self.schedule.after_step(self.state, step, step_noise(reading))
        return change

    def state_dict(self) -> dict[str, Any]:
        return {**self.state.to_dict(), "micro_cap": self.micro_cap}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = ScheduleState.from_dict(state)
        self.micro_cap = int(state["micro_cap"])
