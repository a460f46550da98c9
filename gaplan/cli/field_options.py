"""Click options generated from options dataclasses: a field whose metadata has ``help`` is a command-line option,
its flag, help, ``--help`` section, type and default taken from the field (:func:`gaplan.core.options.option`), so
each is written once, beside the value it sets.

The type comes from the field: ``parse`` (its one parser: the click type of :mod:`gaplan.cli.option_types` that
holds it), ``choices``, else the annotation (``int``, ``float``, ``bool`` as a flag: ``--x/--no-x`` where it defaults
on or to None, text otherwise). No torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

from gaplan.cli.option_types import click_type
from gaplan.core.options import flag, leaf_owners, option_name


class FieldOption(click.Option):
    """A click option that knows its ``--help`` section (:class:`gaplan.cli.config_file.GaplanCommand` groups by it),
    its config file table (the object its field is in, ``CONFIG_TABLE``: ``[train.loop]``; None for the command's
    own ``[train]``) and where it applies (None: everywhere; :func:`gaplan.cli.reference.scope_table`)."""

    def __init__(self, *args: Any, section: str | None = None, table: str | None = None, applies: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.section, self.table, self.applies = section, table, applies


def click_option(field: dataclasses.Field, table: str | None = None, **overrides: Any) -> Callable:
    """The click option decorator of one field, in config ``table`` (``overrides``: click's own arguments, e.g.
    another default for one command)."""
    meta, name = field.metadata, option_name(field)
    default = field.default if field.default is not dataclasses.MISSING else None
    annotation = str(field.type)
    kwargs: dict[str, Any] = {"help": meta["help"], "section": meta.get("section"), "table": table,
                              "applies": meta.get("applies")}
    decls = [meta.get("flag", flag(name)), *meta.get("aliases", ()), name]
    if annotation.startswith("bool"):
        kwargs["is_flag"] = True
        if default is not False:  # on (or decided) by default: the flag that turns it off is --no-NAME
            decls = [f"{flag(name)}/--no-{flag(name)[2:]}", name]
            kwargs["default"] = default
            if default is not None:
                kwargs["show_default"] = True
        return click.option(*decls, cls=FieldOption, **{**kwargs, **overrides})
    kwargs["default"] = default
    if default is not None:
        kwargs["show_default"] = True
    if "parse" in meta:
        kwargs["type"] = click_type(meta["parse"])
    elif "choices" in meta:
        kwargs["type"] = click.Choice(list(meta["choices"]))
    elif annotation.startswith("int"):
        kwargs["type"] = int
    elif annotation.startswith("float"):
        kwargs["type"] = float
    if "metavar" in meta:
        kwargs["metavar"] = meta["metavar"]
    return click.option(*decls, cls=FieldOption, **{**kwargs, **overrides})


def field_help(cls: type, name: str) -> str:
    """The help of ``cls``'s field ``name`` (a command that takes the option with more to say adds to it)."""
    return cls.__dataclass_fields__[name].metadata["help"]


def field_options(cls: type, *, only: tuple[str, ...] = (), **overrides: dict[str, Any]) -> Callable:
    """A decorator adding the options of ``cls``'s fields (and its nested dataclasses') that have help, in field
    order; ``only``: just these option names; ``overrides``: click arguments by option name."""

    def decorate(func: Callable) -> Callable:
        fields = [(field, getattr(owner, "CONFIG_TABLE", None)) for owner, field in leaf_owners(cls)
                  if "help" in field.metadata and (not only or option_name(field) in only)]
        for field, table in reversed(fields):
            func = click_option(field, table, **overrides.get(option_name(field), {}))(func)
        return func

    return decorate


def sectioned(section: str, *decls: str, **kwargs: Any) -> Callable:
    """``click.option`` of an option that no field holds, with its ``--help`` section (and ``table=``: a config
    file's table other than the command's own; ``applies=``: where it applies, when not everywhere)."""
    return click.option(*decls, cls=FieldOption, section=section, **kwargs)
