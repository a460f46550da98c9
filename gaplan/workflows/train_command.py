"""``gaplan train``'s command line as one object: the workload's spec, :class:`TrainOptions`, the device and budget,
``--token-plan`` and ``--resume``, checked once at construction (:meth:`TrainCommand.__post_init__`).
:func:`prepare_train` turns it into what :func:`gaplan.workflows.train.run_train` takes: a resumed run's saved
settings with what was given again checked against them, and ``--token-plan``'s T* read for this workload. The CLI
parses text into it (:func:`gaplan.workflows.parse_options.command_from_options`) and prints what it raises; a Python
caller gets the same refusals, word for word.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from gaplan.core.checkpointing import AUTO
from gaplan.core.constants import BY_TOKENS
from gaplan.core.errors import GaplanError
from gaplan.core.options import OUTPUT, PLAN, TRAINING, nested, option, to_flat
from gaplan.core.progress import Say, quiet
from gaplan.runs.folder import default_run_dir
from gaplan.workflows.parse_options import check_command_fields
from gaplan.workflows.train_options import TrainOptions
from gaplan.workflows.train_resume import with_run_options
from gaplan.workload.spec import WorkloadSpec


@dataclass(frozen=True)
class TrainCommand:
    """One ``gaplan train``: ``spec`` trained as ``options`` say on ``device`` (``memory_limit`` bytes), into
    ``out``; or the run in ``resume`` continued (``given``: the option names given again, checked against it)."""

    spec: WorkloadSpec
    options: TrainOptions = nested(TrainOptions)
    device: str = "auto"
    memory_limit: int | None = None
    token_plan: str | None = option(None, section=PLAN, metavar="TOKENS.JSON", applies=BY_TOKENS, help=(
        "With --batch-by tokens: take T* from a tokens.json written by gaplan probe --batch-by tokens."))
    resume: str | None = option(None, section=TRAINING, metavar="RUN_DIR", help=(
        "Continue the run in RUN_DIR from its checkpoint."))
    out: str | None = option(None, section=OUTPUT, metavar="DIR", help=(
        "Run folder (default reports/train-<model>-<time>); one that holds a run is refused (--resume continues it)."))
    given: frozenset[str] = frozenset()  # with resume: the options given again (by name)
    overwrite: bool = False  # replace the run that ``out`` holds (its files only), else that is refused
    with_run_options: ClassVar[Callable] = staticmethod(with_run_options)  # read by command_from_options

    def __post_init__(self) -> None:
        check_command_fields(self)
        if self.overwrite and self.resume is not None:
            raise GaplanError("--overwrite replaces a run and --resume continues one: give one")
        if self.resume is not None and self.out is not None and os.path.realpath(self.out) != os.path.realpath(self.resume):
            raise GaplanError(f"--out {self.out} and --resume {self.resume}: a resumed run goes on in its own folder; "
                              "leave out --out (a copy of the folder resumes into the copy)")
        if self.token_plan is not None:  # the options hold the budget it gives: it needs tokens, and no budget
            if self.options.batch_by != "tokens":
                raise GaplanError("--token-plan needs --batch-by tokens")
            if self.options.token_budget is not None:
                raise GaplanError("--token-budget and --token-plan both give the token budget: give one")
        if self.out is None and self.resume is None:  # named once, so what is printed after names what was written
            object.__setattr__(self, "out", default_run_dir("train", self.spec.model))

    @property
    def run_dir(self) -> str:
        return self.resume or self.out


@dataclass(frozen=True)
class TrainSetup:
    """What :func:`gaplan.workflows.train.run_train` is given for a :class:`TrainCommand`."""

    spec: WorkloadSpec
    run_dir: str
    options: TrainOptions
    device: str
    memory_limit: int | None
    overwrite: bool = False


def prepare_train(command: TrainCommand, *, say: Say = quiet) -> TrainSetup:
    """The run ``command`` asks for: a resumed run's saved settings (what was given again must agree with them), or
    the given ones with ``--token-plan``'s T* (``say`` names it)."""
    spec, options, device, memory_limit = command.spec, command.options, command.device, command.memory_limit
    if command.resume:  # the run as it was started; what was given again must agree with it
        from gaplan.workflows.train_resume import resume_settings

        given = command.given
        given_spec = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name in given
                      and not (f.name == "grad_checkpointing" and options.grad_checkpointing == AUTO)}
        typed = to_flat(options)  # by option name, typed (to_saved is train.json's form)
        given_options = {name: typed[name] for name in given if name in typed}  # compared with the saved, typed too
        given_options.update(command=options.command)
        given_environment = {name: value for name, value in (("device", device), ("memory_limit", memory_limit))
                             if name in given}
        spec, options, environment = resume_settings(command.resume, given_spec, given_options, given_environment)
        device = device if "device" in given else environment.get("device", device)
        memory_limit = memory_limit if "memory_limit" in given else environment.get("memory_limit")
    elif command.token_plan is not None:  # a resumed run keeps its budget
        from gaplan.devices.backend import resolve_device
        from gaplan.workflows.probe_tokens import token_budget_from_plan

        budget = token_budget_from_plan(command.token_plan, spec, resolve_device(device), memory_limit)
        say(f"token plan {command.token_plan}: {budget.describe()}")
        options = dataclasses.replace(options, token_budget=budget.token_budget)
    return TrainSetup(spec, command.run_dir, options, device, memory_limit, command.overwrite)
