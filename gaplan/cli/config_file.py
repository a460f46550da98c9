"""``--config FILE`` and ``--print-config`` on every command: a command's options from a TOML file, flags over it.

The file holds a table per command, keyed by the flags without their dashes (a file with no tables is the invoked
command's own)::

    [train]
    model = "tiny-llama"
    effective-batch = 256
    grad-checkpointing = "every:2"

It fills click's ``default_map``, so each value is parsed by its option's own type, once, as if given on the command
line, and a flag given there wins. ``--print-config`` prints the command's resolved options in the same form and runs
nothing: ``gaplan train ... --print-config > run.toml`` then ``gaplan train --config run.toml`` repeats the run. A value
from the file counts as given (its option is checked where it applies) unless it is the option's default.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from gaplan.core.errors import GaplanError

PRINT_CONFIG = "gaplan.print_config"  # ctx.meta: --print-config was given


def _read_toml(path: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise GaplanError(f"--config {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise GaplanError(f"--config {path}: not TOML ({exc})") from None


def _options(command: click.Command) -> dict[str, click.Option]:
    """The command's options by their file key: the first long flag without its dashes."""
    found = {}
    for param in command.params:
        if isinstance(param, click.Option) and param.expose_value:
            long = next((opt for opt in param.opts if opt.startswith("--")), param.opts[0])
            found[long.lstrip("-")] = param
    return found


def _load(ctx: click.Context, param: click.Parameter, path: str | None) -> None:
    """``--config``'s callback (eager: before any other option is read): the file's values as ``default_map``."""
    if path is None:
        return
    command = ctx.command
    data = _read_toml(path)
    tables = [key for key, value in data.items() if isinstance(value, dict)]
    if tables and command.name not in tables:
        raise GaplanError(f"--config {path}: no [{command.name}] table (it has {', '.join(f'[{t}]' for t in tables)})")
    table = data[command.name] if tables else data
    options = _options(command)
    defaults: dict[str, Any] = {}
    for key, value in table.items():
        option = options.get(key)
        if option is None:
            import difflib

            near = difflib.get_close_matches(key.replace("_", "-"), options, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise GaplanError(f"--config {path}: [{command.name}] has no option {key!r}{hint}")
        try:
            option.type_cast_value(ctx, value)
        except click.BadParameter as exc:
            raise GaplanError(f"--config {path}: [{command.name}] {key} = {value!r}: {exc.message}") from None
        defaults[option.name] = value
    ctx.default_map = {**(ctx.default_map or {}), **defaults}


def _mark(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[PRINT_CONFIG] = True


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def config_text(command: click.Command, ctx: click.Context) -> str:
    """The command's resolved options as its TOML table (an option without a value is left out)."""
    lines = [f"[{command.name}]"]
    for key, option in _options(command).items():
        value = ctx.params.get(option.name)
        if value is None or (isinstance(value, (list, tuple)) and not value):
            continue
        lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def from_config_file(ctx: click.Context, name: str) -> bool:
    """Whether option ``name``'s value came from ``--config`` and differs from its default (it counts as given)."""
    from click.core import ParameterSource

    if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT_MAP:
        return False
    option = next((p for p in ctx.command.params if p.name == name), None)
    return option is None or ctx.params.get(name) != option.get_default(ctx, call=True)


# ``--help`` in sections: each option's section, by its flag (a flag missing here lands in "Other options", which
# tests/cli/test_config_file.py keeps empty).
HELP_SECTIONS: dict[str, tuple[str, ...]] = {
    "Model and data": (
        "model", "task", "seq-len", "source-len", "target-len", "attention", "init", "weights-dtype",
        "trust-remote-code", "lora", "lora-r", "lora-alpha", "lora-dropout", "lora-targets", "lora-config", "quantize",
        "data", "text-field", "label-field", "target-field", "long-samples", "tokenizer"),
    "Memory": (
        "memory-limit", "device", "threads", "target", "list-targets", "margin", "dtype", "loss", "grad-checkpointing",
        "compile", "parallel", "cpu-offload", "grad-sync", "enforce-memory-limit"),
    "Plan": (
        "effective-batch", "effective-tokens", "micro-batch", "batch-by", "granule", "token-budget", "token-plan",
        "plan", "world-size", "nodes", "gpus-per-node", "search-cap", "sizes", "seed-from-estimate", "objective",
        "batch-range", "measure-steps", "layouts", "levers", "measure", "batch-schedule", "effective-batch-min",
        "lr-scaling"),
    "Training": (
        "optimizer", "lr", "steps", "seed", "max-grad-norm", "warmup-steps", "noise-scale", "checkpoint-every",
        "resume"),
    "Timing": (
        "report", "compare", "repeats", "warmup", "rounds", "max-rounds", "ci-target", "time-budget", "all-splits",
        "no-large-batch"),
    "Output": (
        "out", "overwrite", "save-weights", "save-model", "merge", "emit", "json", "quiet", "config", "print-config",
        "help"),
}
_SECTION_OF = {flag: section for section, flags in HELP_SECTIONS.items() for flag in flags}


class GaplanCommand(click.Command):
    """A gaplan command: its options, ``--config FILE`` / ``--print-config``, and ``--help`` in sections."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {name: [] for name in (*HELP_SECTIONS, "Other options")}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record is None:  # an argument: in the usage line
                continue
            long = next((opt for opt in param.opts if opt.startswith("--")), param.opts[0]).lstrip("-")
            sections[_SECTION_OF.get(long, "Other options")].append(record)
        for name, records in sections.items():
            if records:
                with formatter.section(name):
                    formatter.write_dl(records)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(click.Option(
            ["--config"], type=click.Path(dir_okay=False), is_eager=True, expose_value=False, callback=_load,
            metavar="FILE", help="Options from a TOML file (a [COMMAND] table keyed by the flags without their "
                                 "dashes); flags given on the command line win."))
        self.params.append(click.Option(
            ["--print-config"], is_flag=True, expose_value=False, callback=_mark,
            help="Print the resolved options as TOML (what --config reads) and run nothing."))

    def invoke(self, ctx: click.Context) -> Any:
        if ctx.meta.get(PRINT_CONFIG):
            click.echo(config_text(self, ctx), nl=False)
            return None
        return super().invoke(ctx)
