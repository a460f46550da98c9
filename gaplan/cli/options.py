"""Options shared by the ``gaplan`` commands (click): their flags and help, and what the parser knows (which were
given, the command line). The checks are below the CLI (:mod:`gaplan.workflows.parse_options` and each command's
options object). No torch."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

import click

from gaplan.cli.field_options import field_options, sectioned
from gaplan.cli.option_types import BYTES, CHECKPOINTING
from gaplan.core.constants import BY_TOKENS
from gaplan.core.options import DATA, MEMORY, OUTPUT, PLAN
from gaplan.workload.spec import WorkloadSpec

# The options of the workload's fields that gaplan plan takes too (it has its own --dtype, --optimizer, --lr ...).
TASK_AND_LENGTHS = ("task", "seq_len", "target_len", "attention")
LORA = ("lora", "lora_r", "lora_alpha", "lora_dropout", "lora_targets", "quantize")
SOURCE_LEN = sectioned(DATA, "--source-len", type=int, default=None, table="workload",
                       help="seq2seq-lm: the source length (--seq-len's other name).")
LORA_CONFIG = sectioned(DATA, "--lora-config", default=None, metavar="FILE|DIR", table="workload",
                        help="An adapter_config.json (or its folder): r, alpha, dropout and targets from it (they "
                             "take the place of the --lora-* options); implies --lora.")


def task_and_lengths(func: Callable) -> Callable:
    """``--task``, ``--seq-len``/``--source-len``, ``--target-len`` and ``--attention``."""
    return field_options(WorkloadSpec, only=TASK_AND_LENGTHS)(SOURCE_LEN(func))


def lora_options(func: Callable) -> Callable:
    """LoRA (peft) and QLoRA: the base frozen, adapters trained; shared by probe, train, bench, estimate and plan."""
    return field_options(WorkloadSpec, only=LORA)(LORA_CONFIG(func))


def workload_options(func: Callable) -> Callable:
    """Options that describe what is trained (the workload spec's fields, and where it runs), shared by every command
    that builds a model."""
    hand_written = [
        sectioned(MEMORY, "--grad-checkpointing", type=CHECKPOINTING, default=None, is_flag=False, flag_value="on",
                  metavar="off|on|every:K|layers:N|ops|auto", table="workload",
                  help="Recompute activations in backward: on (every block), off (default), every:K (every K-th "
                       "block), layers:N (the first N blocks), ops (every block at the op level, torchtitan's "
                       "policy: matmul outputs, but every second, and attention outputs kept; the rest "
                       "recomputed), or auto (probe: on only when a larger micro-batch fits and wins on "
                       "throughput)."),
        SOURCE_LEN, LORA_CONFIG,
        sectioned(MEMORY, "--device", default="auto", show_default=True, metavar="auto|cpu|cuda[:N]"),
        sectioned(MEMORY, "--memory-limit", type=BYTES, default=None, metavar="SIZE",
                  help="Memory budget, e.g. 2GiB or 800MB (CPU default 1 GiB; CUDA default: the card)."),
        sectioned(MEMORY, "--threads", type=int, default=None,
                  help="CPU threads for torch (default: torch's; at most 4 per core)."),
    ]
    for option in reversed(hand_written):
        func = option(func)
    return field_options(WorkloadSpec)(func)


def batch_by_options(func: Callable) -> Callable:
    """``--batch-by`` and ``--granule``: micro-batches of a number of samples, or packed within a token budget."""
    options = [
        sectioned(PLAN, "--batch-by", type=click.Choice(["samples", "tokens"]), default="samples", show_default=True,
                  help="samples: micro-batches of a fixed number of samples; tokens: each step's samples packed "
                       "into micro-batches of at most T padded tokens (long-tailed data wastes less on padding; "
                       "T* is probed from --data's lengths)."),
        sectioned(PLAN, "--granule", type=int, default=None, applies=BY_TOKENS,
                  help="With --batch-by tokens: a probed token budget is a multiple of this many tokens.  "
                       "[default: 64]"),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def overwrite_option(applies: str | None = None) -> Callable:
    """``--overwrite`` (``applies``: where, when not everywhere)."""
    return sectioned(OUTPUT, "--overwrite", is_flag=True, applies=applies,
                     help="Replace the run that --out holds: its gaplan files go once the new run writes its own (a "
                          "command refused before that leaves them; the folder's other files are kept). Without it, "
                          "an --out that holds a run is refused.")


def command_object(options: dict[str, Any]):
    """This command line as its command's object (the command's ``options_class``: ``ProbeCommand`` ..., checked
    there), with the options the user gave and the command line itself
    (:func:`gaplan.workflows.parse_options.command_from_options`)."""
    from gaplan.workflows.parse_options import command_from_options

    ctx = click.get_current_context()
    return command_from_options(ctx.command.options_class, options, given_on_command_line(ctx), command_line())


def command_line() -> str:
    """This invocation as a shell command, recorded in plan.json so a report says how to reproduce it.

    Rebuilt from the options given (not from ``sys.argv``, which is the host program's when gaplan is
    called in-process, as by click's test runner); defaults are left out, as the user left them out.
    """
    ctx = click.get_current_context()
    words = ["gaplan", ctx.info_name or ""]
    given = given_on_command_line(ctx)
    for param in ctx.command.params:
        if param.name not in given or not isinstance(param, click.Option):
            continue
        flag, value = max(param.opts, key=len), ctx.params[param.name]
        if param.is_flag:
            words += [flag] if value else param.secondary_opts[-1:]
        else:
            for item in value if param.multiple else [value]:
                words += [flag, str(item)]
    return " ".join(map(shlex.quote, words))


def stderr_printer(quiet: bool) -> Callable[[str], None]:
    return (lambda text: None) if quiet else (lambda text: click.echo(text, err=True))


def given_on_command_line(ctx: click.Context) -> set[str]:
    """The options the user gave (not defaults): on the command line, or in ``--config``'s file other than an
    option's default; what ``--resume`` checks against the saved run."""
    from click.core import ParameterSource

    return {name for name in ctx.params
            if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
            or from_config_file(ctx, name)}


def from_config_file(ctx: click.Context, name: str) -> bool:
    """Whether option ``name``'s value came from ``--config`` and differs from its default (it counts as given)."""
    from click.core import ParameterSource

    if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT_MAP:
        return False
    option = next((p for p in ctx.command.params if p.name == name), None)
    if option is None:
        return True
    held, ctx.default_map = ctx.default_map, None  # the option's own default, not the file's value default_map holds
    try:
        default = option.get_default(ctx, call=True)
    finally:
        ctx.default_map = held
    return ctx.params.get(name) != (option.type_cast_value(ctx, default) if isinstance(default, str) else default)
