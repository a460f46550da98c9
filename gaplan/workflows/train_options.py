"""``gaplan train``'s options as one tree: the plan's source, the data (:class:`DataSource`), the loop
(:class:`LoopOptions`) and the outputs. Built from parsed options by field (:func:`gaplan.core.options.from_options`),
checked once here, saved flat in ``train.json`` (the shape older run folders have, so they still resume).

Each field says in its metadata whether ``--resume`` may change it (``free``), must keep it (``fixed``: the samples of
a step and the weights depend on it), or does not carry it over (no mark: the workload spec holds it, or the run
sets it).
"""

from __future__ import annotations

from dataclasses import dataclass

from gaplan.core.checkpointing import Checkpointing, check_choice, parse_checkpointing_choice, saved_choice
from gaplan.core.constants import BY_TOKENS, DEFAULT_EFFECTIVE_BATCH, PLAN_FILE_HELP
from gaplan.core.options import (
    MEMORY,
    OUTPUT,
    PLAN,
    TIMING,
    OptionError,
    leaf_fields,
    nested,
    option,
    option_name,
)
from gaplan.data.source import DataSource
from gaplan.plan.goodput import LR_SCALINGS, SCHEDULE_LR_SCALING
from gaplan.plan.schedule import FIXED, ScheduleChoice, adaptive_needs_two, parse_schedule
from gaplan.plan.tokens import DEFAULT_GRANULE
from gaplan.training.config import LoopOptions
from gaplan.workflows.parse_options import granule_of

BATCH_BY = ("samples", "tokens")


@dataclass(frozen=True)
class TrainOptions:
    """How ``gaplan train`` runs, beyond the workload: the plan's source, the data, the loop, the outputs."""

    effective_batch: int | None = option(None, resume="fixed", section=PLAN, help=(
        f"Samples per optimizer step (default {DEFAULT_EFFECTIVE_BATCH}, or the plan's)."))
    effective_tokens: int | None = option(None, resume="fixed", section=PLAN, metavar="TOKENS", applies=BY_TOKENS, help=(
        "With --batch-by tokens, instead of --effective-batch: each optimizer step takes the next samples (in the "
        "seeded data order) until their real tokens reach TOKENS, the last sample crossing it (so a step holds TOKENS "
        "or a little more), packed into micro-batches as usual; the loss is normalized over the step's real target "
        "tokens."))
    micro_batch: int | None = option(None, resume="free", section=PLAN, help=(  # resume: a new split of the same step
        "Skip the probe and use this micro-batch."))
    batch_by: str = option("samples", resume="fixed")  # or "tokens": micro-batches packed to <= token_budget tokens
    token_budget: int | None = option(None, resume="fixed", section=PLAN, metavar="TOKENS", applies=BY_TOKENS, help=(
        "With --batch-by tokens: the most padded tokens (samples x longest) in one micro-batch (default: probed from "
        "--data's lengths, T*)."))
    granule: int | None = option(None, resume="fixed")  # by tokens: a probed budget is a multiple of it (None: 64)
    plan_file: str | None = option(None, resume="fixed", section=PLAN, flag="--plan", metavar="PLAN.JSON",
                                   help=PLAN_FILE_HELP)
    # None: sqrt with a schedule, else none (__post_init__).
    lr_scaling: str | None = option(None, resume="fixed", section=PLAN, choices=LR_SCALINGS, applies=(
        "a `--plan` of `gaplan probe --objective goodput`, or `--batch-schedule`"), help=(
        "With a --plan from gaplan probe --objective goodput: scale --lr from the effective batch the noise scale was "
        "measured at to the plan's (linearly or by the square root of their ratio). With --batch-schedule: --lr is "
        "for --effective-batch, scaled to each step's batch.  [default: sqrt with --batch-schedule adaptive|warmup, "
        "else none]"))
    batch_schedule: ScheduleChoice = option(FIXED, resume="fixed", section=PLAN, parse=parse_schedule, save=str,
                                            metavar="fixed|adaptive|warmup:STEPS", help=(
        "The effective batch over the run, the micro-batch staying at B*: fixed; adaptive (from --effective-batch-min, "
        "doubling when the steps measured at the batch show the noise scale at least 2x the batch by a confidence "
        "bound, never shrinking, up to --effective-batch); or warmup:STEPS (the same doublings at evenly spaced steps, "
        "--effective-batch from step STEPS on)."))
    effective_batch_min: int | None = option(None, resume="fixed", section=PLAN, metavar="N", applies=(
        "`--batch-schedule adaptive` or `warmup:STEPS`"), help=(
        "With --batch-schedule adaptive|warmup: the first steps' effective batch (default B* x world size)."))
    # As given, beside the spec's resolved value: None (not given: a --plan's choice stands), AUTO (a --plan's choice,
    # which it needs) or the blocks given (a --plan made with others is refused).
    grad_checkpointing: Checkpointing | str | None = option(None, parse=parse_checkpointing_choice, save=saved_choice)
    source: DataSource = nested(DataSource)
    loop: LoopOptions = nested(LoopOptions)
    # Set by the run, never by an option (the flat options' "resume" is TrainCommand's --resume RUN_DIR).
    resume: bool = option(False, run_state=True)
    save_weights: str | None = option(None, resume="free", section=OUTPUT, metavar="FILE", help=(
        "Write the final weights (safetensors)."))
    save_model: str | None = option(None, resume="free", section=OUTPUT, metavar="DIR", help=(
        "Write the trained model as a save_pretrained folder (config, weights, tokenizer) that transformers loads."))
    merge: bool = option(False, resume="free", section=OUTPUT, applies="`--save-model` with `--lora`", help=(
        "With --lora and --save-model: write the adapters merged into the base, a full model for from_pretrained "
        "(default: the adapter folder)."))
    enforce_memory_limit: bool = option(False, resume="free", section=MEMORY, help=(
        "CPU: train under --memory-limit (default 1 GiB) as the probe's trials do, so a plan that is too big hits "
        "real OOMs."))
    compare: bool = option(False, resume="free", section=TIMING, help=(
        "After training, time the plan against other splits and a true large batch, and write the report (with loss "
        "and samples/s plots)."))
    threads: int | None = option(None, resume="free")
    command: str | None = option(None, resume="free")

    def __post_init__(self) -> None:
        for name in ("effective_batch", "effective_tokens", "micro_batch", "threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise OptionError(f"{name} must be a positive integer (got {value})", name)
        check_choice(self.grad_checkpointing, self.plan_file)
        from gaplan.devices.cpu import check_threads

        check_threads(self.threads)
        scheduled = self._check_schedule()
        if self.lr_scaling is None:  # a schedule changes the batch under one --lr
            object.__setattr__(self, "lr_scaling", SCHEDULE_LR_SCALING if scheduled else "none")
        if self.lr_scaling not in LR_SCALINGS:
            raise OptionError(f"lr_scaling must be one of {', '.join(LR_SCALINGS)} (got {self.lr_scaling!r})",
                              "lr_scaling")
        if self.lr_scaling != "none" and self.plan_file is None and not scheduled:
            raise OptionError("lr_scaling scales the learning rate from the batch it was set for to a goodput plan's "
                              "batch or to each step's batch of a batch_schedule: give plan_file, from gaplan probe "
                              "--objective goodput, or batch_schedule adaptive|warmup:STEPS", "lr_scaling",
                              "plan_file", "batch_schedule")
        if self.merge and not self.save_model:
            raise OptionError("merge writes the merged model to save_model: give --save-model DIR", "merge",
                              "save_model")
        if self.batch_by not in BATCH_BY:
            raise OptionError(f"batch_by must be one of {', '.join(BATCH_BY)} (got {self.batch_by!r})", "batch_by")
        if self.effective_tokens is not None:
            if self.batch_by != "tokens":
                raise OptionError("effective_tokens needs batch_by tokens (steps of a number of tokens are packed by "
                                  "tokens)", "effective_tokens", "batch_by")
            if self.effective_batch is not None:
                raise OptionError("effective_tokens and effective_batch both set the size of a step: give one",
                                  "effective_tokens", "effective_batch")
        if self.granule == DEFAULT_GRANULE:  # the default's own value is no choice (an older train.json holds it)
            object.__setattr__(self, "granule", None)
        granule_of(self.granule, self.batch_by)
        if self.batch_by == "samples":
            if self.token_budget is not None:
                raise OptionError("token_budget needs batch_by tokens", "token_budget", "batch_by")
            return
        if self.token_budget is not None and self.token_budget < 2:
            raise OptionError(f"token_budget must be at least 2 tokens (got {self.token_budget})", "token_budget")
        if self.micro_batch is not None or self.plan_file is not None:
            raise OptionError("batch_by tokens packs by token_budget: leave out micro_batch and plan_file",
                              "batch_by", "token_budget", "micro_batch", "plan_file")

    def _check_schedule(self) -> bool:
        """Whether the effective batch follows a schedule; its options checked (one line each)."""
        if not isinstance(self.batch_schedule, ScheduleChoice):  # typed: text is parsed at the edge
            raise OptionError(f"batch_schedule must be a ScheduleChoice, e.g. parse_schedule('adaptive') (got "
                              f"{self.batch_schedule!r})", "batch_schedule")
        kind = self.batch_schedule.kind
        minimum = self.effective_batch_min
        if minimum is not None and (not isinstance(minimum, int) or isinstance(minimum, bool) or minimum < 1):
            raise OptionError(f"effective_batch_min must be a positive integer (got {minimum!r})",
                              "effective_batch_min")
        if kind == "fixed":
            if minimum is not None:
                raise OptionError("effective_batch_min is where a batch_schedule starts, and the schedule is fixed: "
                                  "give batch_schedule adaptive or warmup:STEPS, or leave it out",
                                  "effective_batch_min", "batch_schedule")
            return False
        if minimum is not None and self.effective_batch is not None and minimum > self.effective_batch:
            raise OptionError(f"effective_batch_min {minimum} is above effective_batch {self.effective_batch}: the "
                              "schedule grows from the first to the second", "effective_batch_min", "effective_batch")
        if self.batch_by == "tokens":
            raise OptionError("batch_schedule changes a step's samples; with batch_by tokens a step is packed by "
                              "tokens: not supported together yet", "batch_schedule", "batch_by")
        if kind == "adaptive" and not self.loop.noise_scale:
            raise OptionError("batch_schedule adaptive grows the batch by the measured noise scale: it needs "
                              "noise_scale on (or use warmup:STEPS)", "batch_schedule", "noise_scale")
        if kind == "adaptive" and self.effective_batch == 1:  # known before any probe (E >= the ranks, so one)
            raise OptionError(adaptive_needs_two(1), "batch_schedule", "effective_batch")
        return True

    # Convenience views of the nested options, read all over the run.
    @property
    def data(self) -> str | None:
        return self.source.path

    @property
    def seed(self) -> int:
        return self.loop.seed

    @property
    def steps(self) -> int:
        return self.loop.steps


def resume_marks() -> dict[str, str]:
    """``{option name: "fixed" | "free"}`` of every option a resumed run keeps or may change."""
    return {option_name(field): field.metadata["resume"] for _, field in leaf_fields(TrainOptions)
            if "resume" in field.metadata}
