"""How the loop trains, as options: the user's (:class:`LoopOptions`) and the loop's whole config. No torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gaplan.core.constants import DEFAULT_TRAIN_STEPS
from gaplan.core.options import TRAINING, OptionError, option, positive_finite
from gaplan.plan.schedule import BatchSchedule


@dataclass(frozen=True)
class LoopOptions:
    """What a user sets about the loop. ``--resume`` may train further and checkpoint differently, nothing else."""

    CONFIG_TABLE: ClassVar[str] = "loop"  # its options' table in a config file: [COMMAND.loop]

    steps: int = option(DEFAULT_TRAIN_STEPS, resume="free", section=TRAINING, help="Optimizer steps.")
    seed: int = option(0, resume="fixed", section=TRAINING, help="Seed of the data order and of torch's random numbers.")
    max_grad_norm: float | None = option(None, resume="fixed", section=TRAINING, help=(
        "Clip the gradient norm (after fp16 unscaling)."))
    warmup_steps: int = option(0, resume="fixed", section=TRAINING, help="Linear learning-rate warm-up steps (at most --steps).")
    noise_scale: bool = option(True, resume="free", section=TRAINING, help=(
        "Measure the gradient noise scale each step (train_log.csv: noise_scale, grad_sq, grad_var) from the "
        "micro-batches' gradients, and say what it implies for the effective batch."))
    checkpoint_every: int = option(0, resume="free", section=TRAINING, help=(
        "Checkpoint every N steps (always at the end and on SIGINT/SIGTERM)."))

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise OptionError(f"steps must be a positive integer (got {self.steps})", "steps")
        norm = self.max_grad_norm
        if norm is not None and not positive_finite(norm):
            # clip_grad_norm_ with a negative norm flips every gradient: gradient ascent, with no word
            raise OptionError(f"max_grad_norm must be a positive number (got {norm}); leave it out for no clipping",
                              "max_grad_norm")
        if not -(2**63) <= self.seed < 2**64:  # what torch.manual_seed takes (past it: a ValueError traceback)
            raise OptionError(f"seed must be an integer from -2**63 to 2**64-1 (got {self.seed})", "seed")
        for name in ("warmup_steps", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise OptionError(f"{name} must be 0 or more (got {getattr(self, name)})", name)
        if self.warmup_steps > self.steps:  # the learning rate would never reach its peak: a typo, most likely
            raise OptionError(f"warmup_steps ({self.warmup_steps}) is above steps ({self.steps}): the learning rate "
                              f"would never reach its peak; give at most {self.steps}", "warmup_steps", "steps")


@dataclass(frozen=True)
class TrainConfig(LoopOptions):
    """The loop's config: the user's loop options and what the run decides (folder, token batching, a size cap).

    ``checkpoint_every=0`` saves only at the end and on SIGINT/SIGTERM."""

    run_dir: str | None = None
    token_budget: int | None = None  # batch by tokens: micro-batches of at most this many padded tokens
    effective_tokens: int | None = None  # with a token budget: steps of this many real tokens, not E samples
    micro_batch_limit: int | None = None  # no micro-batch above this (the size ranks agreed on after an OOM restart)
    schedule: BatchSchedule | None = None  # the effective batch over the run (None: the plan's, every step)
    new_split: bool = False  # resume: the plan given is for a new device, budget or micro-batch (not the saved one)
    data: dict | None = None  # the data source's fields (path, tokenizer, ...): the checkpoint records them
    lr_scaling: str | None = None  # with a schedule: the lr scaled from its largest batch to each step's (None: sqrt,
    # gaplan.plan.goodput.SCHEDULE_LR_SCALING)
