"""Resuming a run: the run as it was started (``train.json``), what the user gave again checked against it, what
may change (how a step is split: device, budget, micro-batch, ranks, memory settings) and what may not (the step
itself: the effective batch, the data and its order, the optimizer, the loss, the seed). docs/resume.md has the
table and the reasons.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Collection, Mapping
from typing import Any

from gaplan.core.atomic_write import atomic_write_text
from gaplan.core.errors import GaplanError
from gaplan.core.options import (
    OptionError,
    flag,
    from_saved,
    get_path,
    leaf_fields,
    option_name,
    replace_path,
    to_flat,
    to_saved,
)
from gaplan.core.outputs import check_path_exists
from gaplan.core.progress import Say
from gaplan.data.source import reads_as
from gaplan.plan.split import Plan
from gaplan.runs.folder import CHECKPOINT, TRAIN_JSON, TRAIN_LOG_CSV, path_in
from gaplan.workflows.train_options import TrainOptions, resume_marks
from gaplan.workload.spec import SPLIT_ONLY_FIELDS, WorkloadSpec


def resume_settings(run_dir: str, given_spec: dict[str, Any], given_options: Mapping[str, Any],
                    given_environment: Mapping[str, Any] | None = None
                    ) -> tuple[WorkloadSpec, TrainOptions, dict[str, Any]]:
    """The workload and options of the run in ``run_dir``, with what the user gave again checked against them.

    ``given_*`` hold only what was given explicitly (``given_options`` by option name). A value that contradicts the
    saved run (another workload, seed, effective batch, data) is an error; what the options' metadata marks ``free``
    (``steps``, to train further; the outputs) is taken. ``given_environment``: the device and memory limit given
    again; where one differs from the run's and no micro-batch is given, the run's ``--micro-batch`` (a size for
    the old card) is dropped, so the resumed run re-plans (a cached probe of the new setting, or a new probe).
    Returns the spec, the options and the saved environment (device, memory limit).
    """
    check_path_exists(run_dir, "--resume")  # a link that loops is not "no checkpoint in it"
    if not os.path.isfile(path_in(run_dir, CHECKPOINT)) and not os.path.isfile(path_in(run_dir, TRAIN_JSON)):
        raise GaplanError(f"--resume {run_dir}: no {CHECKPOINT} in it")  # before anything else: no run at all
    marks = resume_marks()
    section = "workload"
    try:
        saved = _read_train_json(run_dir)
        spec = WorkloadSpec.from_dict(saved["workload"]).validate()  # a bad value named here, by its key
        section = "options"
        options = _saved_options(saved["options"])
        options = dataclasses.replace(options, source=options.source.without_defaults())
    except OptionError as exc:  # a value in the file, named by its key there: the user gave no such flag
        raise GaplanError(f"--resume {run_dir}: {TRAIN_JSON} holds a value that cannot be used: "
                          + exc.for_cli(lambda name: f'"{section}"."{name}"')) from None
    except GaplanError as exc:
        raise GaplanError(f"--resume {run_dir}: {TRAIN_JSON} holds a value that cannot be used: {exc}") from None
    except FileNotFoundError:
        raise GaplanError(f"--resume {run_dir}: no {TRAIN_JSON} in it (not a gaplan train run folder)") from None
    except (KeyError, TypeError, AttributeError) as exc:  # valid JSON of another shape
        missing = f"no {exc.args[0]!r} in it" if isinstance(exc, KeyError) else "not the JSON object train writes"
        raise GaplanError(f"--resume {run_dir}: {TRAIN_JSON} is not a gaplan train record ({missing}: an object of "
                          '"workload", "options" and "environment")') from None
    except (OSError, ValueError) as exc:
        raise GaplanError(f"--resume {run_dir}: {TRAIN_JSON} cannot be read ({exc.__class__.__name__}: {exc})") from None
    for name, value in given_spec.items():
        if name in SPLIT_ONLY_FIELDS:  # memory, not the math: the run goes on with the new one (and re-plans)
            spec = dataclasses.replace(spec, **{name: value})
        elif getattr(spec, name) != value and not (name == "lr" and value == spec.learning_rate):  # its default, said
            raise GaplanError(f"--resume {run_dir}: {_as_given(name, value)} contradicts the run's "
                              f"{_as_run_had(getattr(spec, name))} (resume continues the run as it was started)")
    spec = spec.validate()  # with what was given merged (a new checkpointing, layout, attention ...)
    for path_names, leaf in leaf_fields(TrainOptions):
        name = option_name(leaf)
        if name not in given_options or name not in marks:
            continue
        # A data field agrees with what it reads as: --target-field target again on a run started without it.
        if marks[name] == "fixed" and reads_as(name, get_path(options, path_names)) != reads_as(name, given_options[name]):
            given = f"{leaf.metadata.get('flag', flag(name))} {given_options[name]}"
            raise GaplanError(f"--resume {run_dir}: {given} contradicts the run's "
                              f"{_as_run_had(get_path(options, path_names))} (resume continues the run as it was started)")
        if marks[name] == "free":
            options = replace_path(options, path_names, given_options[name])
    environment = saved.get("environment", {})
    moved = any(environment.get(name) != value for name, value in (given_environment or {}).items())
    if moved and "micro_batch" not in given_options:
        options = dataclasses.replace(options, micro_batch=None)
    return spec, dataclasses.replace(options, resume=True), environment


def with_run_options(options: Mapping[str, Any], given: Collection[str]) -> Mapping[str, Any]:
    """The parsed options of a ``--resume`` with the run's own (its train.json) for those not given, so a check
    across options reads the run's (a token budget given again needs the run's batching by tokens, not the flag's
    default); as parsed where there is no resume or train.json cannot be read (:func:`resume_settings` says why)."""
    if not options.get("resume"):
        return options
    try:
        run = to_flat(_saved_options(_read_train_json(options["resume"])["options"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, GaplanError):
        return options
    return {**options, **{name: value for name, value in run.items() if name not in given and name in options}}


def _read_train_json(run_dir: str) -> dict[str, Any]:
    """The run's ``train.json`` as saved (its workload, options, environment and commands)."""
    with open(path_in(run_dir, TRAIN_JSON), encoding="utf-8") as handle:
        return json.load(handle)


def _saved_options(saved: Mapping[str, Any]) -> TrainOptions:
    """``train.json``'s options (of those a resume keeps or may change) as the typed object."""
    marks = resume_marks()
    return from_saved(TrainOptions, {k: v for k, v in saved.items() if k in marks})


def _as_given(name: str, value: Any) -> str:
    """A value given again, as the command line says it: a switch as on or off (not Python's True)."""
    return f"--{name.replace('_', '-')} {'on' if value is True else 'off' if value is False else value}"


def _as_run_had(value: Any) -> Any:
    """A saved value as the contradiction names it: None is the default the run was started with (no value given)."""
    return "default (it was started without one)" if value is None else "on" if value is True else \
        "off" if value is False else value


def new_split(run_dir: str, spec: WorkloadSpec, options: TrainOptions, device: str,
              memory_limit: int | None) -> list[str]:
    """What differs, of what sets the split, between the run as started in ``run_dir`` and this resume of it: names
    of the device, the budget, the micro-batch and :data:`SPLIT_ONLY_FIELDS` (empty: the same setting)."""
    saved = _read_train_json(run_dir)
    environment, saved_options, saved_spec = saved.get("environment", {}), saved["options"], saved["workload"]
    changed = [name for name, now in (("device", device), ("memory_limit", memory_limit)) if environment.get(name) != now]
    if options.micro_batch is not None and saved_options.get("micro_batch") != options.micro_batch:
        changed.append("micro_batch")
    now = spec.to_dict()  # in the saved form, as train.json holds it
    changed += [name for name in SPLIT_ONLY_FIELDS if saved_spec.get(name) != now[name]]
    return changed


def extended(run_dir: str, options: TrainOptions) -> bool:
    """Whether this resume sets other ``steps`` than ``train.json`` holds (a run extended, or ended sooner)."""
    return _read_train_json(run_dir)["options"].get("steps") != options.steps


def from_the_start_without_a_checkpoint(run_dir: str, options: TrainOptions, say: Say) -> TrainOptions:
    """A run stopped before its first checkpoint (``kill -9`` with ``--checkpoint-every 0``, the default, saves none
    before the end): ``--resume`` trains it again from the start, with its own options and the same samples per
    step, as torchrun's restart after an OOM does. Other options pass through."""
    if not options.resume or os.path.isfile(path_in(run_dir, CHECKPOINT)):
        return options
    forget_the_first_try(run_dir)
    say(f"no {CHECKPOINT} in {run_dir}: the run stopped before its first checkpoint (--checkpoint-every N keeps one "
        "every N steps); training it again from the start")
    return dataclasses.replace(options, resume=False)


def after_an_oom_restart(spec: WorkloadSpec, run_dir: str, options: TrainOptions, dist: Any,
                         say: Say) -> tuple[TrainOptions, Any]:
    """torchrun restarted the ranks after an OOM no vote could reach: the options to go on with (from the last
    checkpoint, or the start), and the sizes every rank agreed on (None when this is no such restart)."""
    from gaplan.training.restart import agree_on_restart

    restart = agree_on_restart(run_dir, dist) if dist.active else None
    if restart is None:
        return options, None
    resumable = os.path.exists(path_in(run_dir, CHECKPOINT))
    if not resumable:
        forget_the_first_try(run_dir)  # the steps before the failure are trained again
    options = dataclasses.replace(options, resume=options.resume or resumable,
                                  token_budget=restart.token_budget or options.token_budget)
    what = "; ".join(restart.messages) or f"a rank on another node ran out of memory under {spec.parallel.upper()}"
    say(f"restarted by torchrun ({what}): going on from {'the last checkpoint' if resumable else 'the start'}")
    return options, restart


def forget_the_first_try(run_dir: str) -> None:
    """What a run trained again from its start keeps of its first try: nothing. Its log's rows, and a first
    checkpoint's write a kill cut off (rank 0's files: the others leave them)."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    if os.path.exists(path_in(run_dir, TRAIN_LOG_CSV)):
        os.remove(path_in(run_dir, TRAIN_LOG_CSV))
    from gaplan.runs.claim import remove_temporary_writes

    remove_temporary_writes(run_dir)


def save_settings(run_dir: str, spec: WorkloadSpec, options: TrainOptions, device: str,
                   memory_limit: int | None) -> None:
    """``train.json``: the workload, the options and the environment, and ``commands``, the command lines that made
    the run as it is (its start, then each resume that changed it: a plain resume goes on bitwise as the start)."""
    commands = [options.command]
    if os.path.isfile(path_in(run_dir, TRAIN_JSON)):  # a resume, or the run trained again from its start: its history
        before = _read_train_json(run_dir)
        history = before.get("commands") or [before["options"].get("command")]
        commands = history + ([options.command] if options.command != history[-1] else [])  # (a torchrun restart's)
    data = {"workload": spec.to_dict(), "options": to_saved(dataclasses.replace(options, resume=False)),
            "environment": {"device": device, "memory_limit": memory_limit}, "commands": commands}
    atomic_write_text(path_in(run_dir, TRAIN_JSON), json.dumps(data, indent=2) + "\n")


def saved_position(run_dir: str, spec: WorkloadSpec, options: TrainOptions) -> tuple[int, Plan]:
    """The step and the plan the checkpoint in ``run_dir`` holds; a checkpoint whose own record of its workload is
    not ``spec``'s, and ``--steps`` below its step, are refused (before anything is written)."""
    from gaplan.training.checkpoint import check_checkpoint_record, checkpoint_position

    check_checkpoint_record(run_dir, spec.to_dict(), dataclasses.asdict(options.source))
    done, saved = checkpoint_position(run_dir)
    if options.steps < done:
        raise GaplanError(f"--resume {run_dir}: --steps {options.steps} is below the {done} steps the run has done "
                          f"(give --steps {done} or more: {done} ends it, more extends it)")
    return done, saved


def say_split(saved: Plan, plan: Plan, changed: list[str], world_size: int, say: Say) -> None:
    """One line where the resumed run splits its steps anew: the checkpoint's split (``saved``) and this one."""
    if saved.world_size != world_size:
        changed = [*changed, "world size"]
    if changed:
        say(f"resumed on a new split ({', '.join(name.replace('_', ' ') for name in changed)} changed): "
            f"{saved.describe()} -> {plan.describe()}")
