"""``--config FILE`` and ``--print-config`` on every command: a command's options from a TOML file, flags over it.

The file holds a table per command, keyed by the flags without their dashes, and in it a table per object that holds
options (an option's ``table``: its field's dataclass; a key may also sit flat in the command's table, and a file with
no tables is the invoked command's own)::

    [train]
    effective-batch = 256

    [train.workload]
    model = "tiny-llama"
    grad-checkpointing = "every:2"

It fills click's ``default_map``, so each value is parsed by its option's own type, once, as if given on the command
line, and a flag given there wins. ``--print-config`` prints the command's resolved options in the same form and runs
nothing: ``gaplan train ... --print-config > run.toml`` then ``gaplan train --config run.toml`` repeats the run. A value
from the file counts as given (its option is checked where it applies) unless it is the option's default.
"""

from __future__ import annotations

from typing import Any

import click

from gaplan.cli.field_options import FieldOption
from gaplan.core.options import OUTPUT, SECTIONS

OTHER = "Other options"  # where an option that names no section would land

PRINT_CONFIG = "gaplan.print_config"  # ctx.meta: --print-config was given
JSON_ASKED = "gaplan.json"  # ctx.meta: the command runs with --json


def _key(param: click.Parameter) -> str:
    """An option's name in a config file and in the help sections: its first long flag without its dashes."""
    return next((opt for opt in param.opts if opt.startswith("--")), param.opts[0]).lstrip("-")


def _options(command: click.Command) -> dict[str, click.Option]:
    """The command's options by their file key."""
    return {_key(param): param for param in command.params
            if isinstance(param, click.Option) and param.expose_value}


def _load(ctx: click.Context, param: click.Parameter, path: str | None) -> None:
    """``--config``'s callback (eager: before any other option is read): the file's values as ``default_map``, each
    checked by its option's own type (gaplan.workflows.config_file)."""
    if path is None:
        return
    from functools import partial

    from gaplan.workflows.config_file import read_config

    options = _options(ctx.command)
    values = read_config(path, ctx.command.name,
                         {key: partial(option.type_cast_value, ctx) for key, option in options.items()},
                         {key: getattr(option, "table", None) for key, option in options.items()},
                         {key: _value_kind(option) for key, option in options.items()})
    ctx.default_map = {**(ctx.default_map or {}), **{options[key].name: value for key, value in values.items()}}


def _value_kind(option: click.Option) -> type | None:
    """The kind of value an option holds (``int``, ``float``, a switch's ``bool``, text's ``str``), for the file's
    values; for a typed option the one its type holds, else None (its parser reads the file's forms itself)."""
    kind = option.type
    if option.is_flag:
        return bool
    if isinstance(kind, click.types.IntParamType):
        return int
    if isinstance(kind, click.types.FloatParamType):
        return float
    return str if isinstance(kind, (click.types.StringParamType, click.Choice)) else getattr(kind, "holds", None)


def _mark(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[PRINT_CONFIG] = True


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if type(value) in (list, tuple):  # a typed value that is a tuple (a ScheduleChoice) is written as its text
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


# What names one run's folder: a run's saved config.toml leaves them out, so repeating it writes a new run.
RUN_FOLDER_KEYS = ("out", "overwrite", "resume")


def config_text(command: click.Command, ctx: click.Context, *, leave_out: tuple[str, ...] = ()) -> str:
    """The command's resolved options as TOML: its table, and a table per object that holds options
    (``[train.loop]``), as ``--config`` reads them back (an option without a value, or in ``leave_out`` by its key,
    is left out)."""
    tables: dict[str | None, list[str]] = {None: []}
    for key, option in _options(command).items():
        value = ctx.params.get(option.name)
        if value is None or (isinstance(value, (list, tuple)) and not value) or key in leave_out:
            continue
        tables.setdefault(getattr(option, "table", None), []).append(f"{key} = {_toml_value(value)}")
    lines = [f"[{command.name}]", *tables.pop(None)]
    for table, rows in tables.items():
        lines += ["", f"[{command.name}.{table}]", *rows]
    return "\n".join(lines) + "\n"


def run_config_text(ctx: click.Context) -> str:
    """This run's options for its folder's ``config.toml``: ``gaplan COMMAND --config DIR/config.toml`` repeats it
    into a new folder (``--out``, ``--overwrite`` and ``--resume`` are left out)."""
    return (f"# gaplan {ctx.command.name}'s options of this run. Repeat it: gaplan {ctx.command.name} --config "
            "config.toml [--out DIR]\n" + config_text(ctx.command, ctx, leave_out=RUN_FOLDER_KEYS))


def help_sections(command: click.Command, ctx: click.Context) -> dict[str, list[tuple[str, str]]]:
    """The command's options' help records by ``--help`` section, in :data:`SECTIONS`' order (docs/options.md is
    rendered from the same records)."""
    sections: dict[str, list[tuple[str, str]]] = {name: [] for name in (*SECTIONS, OTHER)}
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
        if record is None:  # an argument: in the usage line
            continue
        # Each option says its section (a FieldOption; --help's is set below). tests/cli keep OTHER empty.
        sections.setdefault(getattr(param, "section", None) or OTHER, []).append(record)
    return {name: records for name, records in sections.items() if records}


class GaplanCommand(click.Command):
    """A gaplan command: its options, ``--config FILE`` / ``--print-config``, and ``--help`` in sections;
    ``options_class``: the object its options build, checked before ``--print-config`` prints them."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for name, records in help_sections(self, ctx).items():
            with formatter.section(name):
                formatter.write_dl(records)

    def __init__(self, *args: Any, options_class: type | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.options_class = options_class  # the object its options build (ProbeCommand ...): --print-config checks it
        self.params.append(FieldOption(
            ["--config"], section=OUTPUT, type=click.Path(dir_okay=False), is_eager=True, expose_value=False, callback=_load,
            metavar="FILE", help="Options from a TOML file: a [COMMAND] table keyed by the flags without their "
                                 "dashes, with a table per object (as --print-config writes it: [COMMAND.workload], "
                                 "[COMMAND.data], ...); flags given on the command line win."))
        self.params.append(FieldOption(
            ["--print-config"], section=OUTPUT, is_flag=True, expose_value=False, callback=_mark,
            help="Print the resolved options as TOML (what --config reads) and run nothing."))

    def get_help_option(self, ctx: click.Context) -> click.Option | None:
        option = super().get_help_option(ctx)
        if option is not None:  # click's own --help, in the Output section
            option.section = OUTPUT  # type: ignore[attr-defined]
        return option

    def invoke(self, ctx: click.Context) -> Any:
        if ctx.meta.get(PRINT_CONFIG):
            if self.options_class is not None:  # checked as a run would be: a file --config would refuse is not written
                from gaplan.cli.options import command_object
                from gaplan.workflows.config_file import check_printable

                check_printable(command_object(ctx.params))
            click.echo(config_text(self, ctx), nl=False)
            return None
        ctx.meta[JSON_ASKED] = bool(ctx.params.get("as_json"))  # a refusal is then a JSON object on stdout too
        return super().invoke(ctx)
