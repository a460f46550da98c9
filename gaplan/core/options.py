"""Options as typed dataclasses: built from parsed options by their fields, checked once, errors in field names.

A field's metadata says what the command line calls it (``option``, default: the field's name), its help and
``--help`` section (the click option is generated from them), and, for a run's options, whether ``--resume`` may
change it (``resume``: ``"fixed"`` or ``"free"``). A nested dataclass field
(``nested=True``) is built from the same flat mapping, so one parsed-options dict fills a whole tree.

A check that fails raises :class:`OptionError`, whose text names fields: ``str()`` says them as field names (for
Python callers), :meth:`OptionError.for_cli` as flags (``micro_batch`` -> ``--micro-batch``).
"""

from __future__ import annotations

import dataclasses
import numbers
import re
import traceback
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, TypeVar

from gaplan.core.errors import GaplanError, RemoteTraceback, is_user_code, mark_user_code

T = TypeVar("T")

# The ``--help`` sections an option's ``section`` names, in the order ``--help`` shows them.
DATA, MEMORY, PLAN, TRAINING, TIMING, OUTPUT = "Model and data", "Memory", "Plan", "Training", "Timing", "Output"
SECTIONS = (DATA, MEMORY, PLAN, TRAINING, TIMING, OUTPUT)


class OptionError(GaplanError):
    """A value that cannot be used, said in field names: ``OptionError("micro_batch must be positive", "micro_batch")``.

    ``fields`` are the field names the message mentions; the command line shows each as its flag.
    """

    def __init__(self, message: str, *fields: str) -> None:
        super().__init__(message)
        self.fields = fields

    def for_cli(self, flag_of: Callable[[str], str] | None = None) -> str:
        """The message with each named field as its command-line flag (``flag_of``, default :func:`flag`)."""
        text = str(self)
        for name in sorted(self.fields, key=len, reverse=True):
            text = re.sub(rf"(?<![\w-]){re.escape(name)}(?!\w)", (flag_of or flag)(name), text)
        return text


def positive_finite(value: object) -> bool:
    """Whether ``value`` is a number above zero and finite (NaN, inf, a bool, a string are not)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
            and value < float("inf"))


def check_positive_ints(**values: object) -> None:
    """An :class:`OptionError` naming the first argument that is given (not None) and not a positive integer."""
    for name, value in values.items():
        if value is not None and (not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1):
            raise OptionError(f"{name} must be a positive integer (got {value!r})", name)


def error_reply(exc: GaplanError) -> dict:
    """A user error as the data a child process sends back: its line, an :class:`OptionError`'s field names, and the
    traceback of what it was raised from, where the user's own code raised (``--debug`` shows it in the parent)."""
    fields = list(exc.fields) if isinstance(exc, OptionError) else []
    cause = "".join(traceback.format_exception(exc.__cause__)) if is_user_code(exc) and exc.__cause__ else None
    return {"error": "user", "message": str(exc), **({"fields": fields} if fields else {}),
            **({"user_code": cause} if cause else {})}


def user_error(reply: dict) -> GaplanError:
    """The error an :func:`error_reply` stands for, raised again in the parent: an option named by its field stays
    one, so the command line still shows its flag; the user's code's traceback stays chained to it."""
    fields = reply.get("fields") or ()
    error = OptionError(reply["message"], *fields) if fields else GaplanError(reply["message"])
    if reply.get("user_code"):
        error.__cause__ = RemoteTraceback(reply["user_code"])
        mark_user_code(error)
    return error


def flag(name: str) -> str:
    """The command-line flag of an option name: ``micro_batch`` -> ``--micro-batch``."""
    return "--" + name.replace("_", "-")


def option(default: Any = None, *, resume: str | None = None, name: str | None = None, help: str | None = None,
           section: str | None = None, metavar: str | None = None, choices: tuple[str, ...] | None = None,
           parse: Callable[[Any], Any] | None = None, applies: str | None = None, **kwargs: Any) -> Any:
    """A dataclass field with gaplan's metadata: ``resume`` (fixed/free), ``name`` (the option it comes from), and,
    for a field that is a command-line option, its ``help`` (written here once: the CLI generates the click option
    from it, :mod:`gaplan.cli.field_options`), its ``--help`` ``section``, ``metavar``, ``choices``, ``parse`` (the
    one parser of its text, for a typed value) and ``applies``: where it applies, when not everywhere (given
    elsewhere, it is refused in one line; the docs' tables say it). Other keywords are marks of the module's own,
    kept in the metadata (``probe_key=False``)."""
    given = (("resume", resume), ("option", name), ("help", help), ("section", section), ("metavar", metavar),
             ("choices", choices), ("parse", parse), ("applies", applies))
    metadata = {k: v for k, v in given if v is not None}
    metadata.update({k: kwargs.pop(k) for k in list(kwargs) if k not in _FIELD_ARGUMENTS})  # a module's own marks
    if "default_factory" in kwargs:
        return dataclasses.field(metadata=metadata, **kwargs)
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


_FIELD_ARGUMENTS = ("default_factory", "init", "repr", "hash", "compare", "kw_only")


def nested(factory: Any) -> Any:
    """A dataclass field holding another options dataclass, built from the same flat options."""
    return dataclasses.field(default_factory=factory, metadata={"nested": True})


def option_name(field: dataclasses.Field) -> str:
    return field.metadata.get("option", field.name)


def leaf_fields(cls: type, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dataclasses.Field]]:
    """Every non-nested field of ``cls`` and its nested dataclasses, with its path of field names."""
    for path, _, field in _walk(cls, prefix):
        yield path, field


def leaf_owners(cls: type) -> Iterator[tuple[type, dataclasses.Field]]:
    """Every non-nested field of ``cls`` and its nested dataclasses, with the dataclass that holds it."""
    for _, owner, field in _walk(cls, ()):
        yield owner, field


def to_saved(obj: Any) -> dict[str, Any]:
    """:func:`to_flat` in the form a file keeps (JSON): a field with a ``save`` mark written by it."""
    return {option_name(field): _saved(field, get_path(obj, path)) for path, field in leaf_fields(type(obj))}


def from_saved(cls: type[T], options: Mapping[str, Any], **overrides: Any) -> T:
    """``cls`` from :func:`to_saved`'s form: a field with a ``save`` mark read back by its ``parse`` (unknown names are
    left out; ``overrides`` win)."""
    parsed = dict(options)
    for _, field in leaf_fields(cls):
        name = option_name(field)
        if "save" in field.metadata and parsed.get(name) is not None and field.name not in overrides:
            parsed[name] = field.metadata["parse"](parsed[name])
    return from_options(cls, parsed, **overrides)


def _saved(field: dataclasses.Field, value: Any) -> Any:
    return field.metadata["save"](value) if "save" in field.metadata and value is not None else value


def _walk(cls: type, prefix: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], type, dataclasses.Field]]:
    hints = _nested_types(cls)
    for field in dataclasses.fields(cls):
        if field.metadata.get("nested"):
            yield from _walk(hints[field.name], (*prefix, field.name))
        else:
            yield (*prefix, field.name), cls, field


def from_options(cls: type[T], options: Mapping[str, Any], **overrides: Any) -> T:
    """``cls`` built from a flat mapping of option names (a click command's parameters), by its fields.

    A field whose option is absent keeps its default, as does one the run sets (``run_state``: no option gives it);
    ``overrides`` (by field name) win over ``options``.
    """
    hints = _nested_types(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.name in overrides:
            values[field.name] = overrides[field.name]
        elif field.metadata.get("nested"):
            values[field.name] = from_options(hints[field.name], options)
        elif option_name(field) in options and not field.metadata.get("run_state"):
            values[field.name] = options[option_name(field)]
    return cls(**values)


def check_applies(obj: Any, where: str, names: Collection[str] | None = None) -> None:
    """Refuse the first option of ``obj`` (its nested objects' too) set away from its default, of those whose field
    says it applies ``where`` (``names``: these options instead), as given where it does not apply: one line,
    ``--flag applies to {where}``, in the command line's words for every caller."""
    for path, field in leaf_fields(type(obj)):
        name = option_name(field)
        if name not in names if names is not None else field.metadata.get("applies") != where:
            continue
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        if get_path(obj, path) != default:
            raise GaplanError(f"{field.metadata.get('flag', flag(name))} applies to {where.replace('`', '')}")


def get_path(obj: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        obj = getattr(obj, name)
    return obj


def replace_path(obj: T, path: tuple[str, ...], value: Any) -> T:
    """``obj`` with the field at ``path`` (through nested dataclasses) set to ``value``."""
    if len(path) == 1:
        return dataclasses.replace(obj, **{path[0]: value})
    return dataclasses.replace(obj, **{path[0]: replace_path(getattr(obj, path[0]), path[1:], value)})


def to_flat(obj: Any) -> dict[str, Any]:
    """The leaf values of an options tree by option name (the inverse of :func:`from_options`)."""
    return {option_name(field): get_path(obj, path) for path, field in leaf_fields(type(obj))}


def _nested_types(cls: type) -> dict[str, type]:
    """The dataclass each field holds (``X | None`` holds ``X``)."""
    import types
    import typing

    def held(hint: Any) -> Any:
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            kinds = [arg for arg in typing.get_args(hint) if arg is not type(None)]
            return kinds[0] if len(kinds) == 1 else None
        return hint

    hints = {name: held(hint) for name, hint in typing.get_type_hints(cls).items()}
    return {name: hint for name, hint in hints.items() if hint is not None and dataclasses.is_dataclass(hint)}
