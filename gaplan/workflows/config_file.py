"""A command's options from a TOML file (``--config``): the file read and every key and value checked, below the CLI.

The file holds a table per command, keyed by the flags without their dashes, and in it a table per object that holds
options (``[train.workload]``, ``[train.loop]`` ...); a key may also sit flat in the command's table, and a file
without tables is the invoked command's own. Each value is checked by its option's own parser, given by the caller
(the CLI passes click's types), so a bad key, value, table or file is one :class:`GaplanError` line.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Mapping
from typing import Any

from gaplan.core.errors import GaplanError


def check_printable(command: Any) -> None:
    """``--print-config`` prints what a command line resolves to; a resumed run's options are the run's own (its
    ``config.toml`` and ``train.json``), not the command line's: refused, naming the file."""
    resume = getattr(command, "resume", None)
    if resume is not None:
        raise GaplanError(f"--print-config with --resume: a resumed run keeps the options it was started with, in "
                          f"{resume}/config.toml (gaplan train --config {resume}/config.toml --out DIR repeats them)")


def read_toml(path: str) -> dict[str, Any]:
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
    except UnicodeDecodeError as exc:  # tomllib decodes the file as UTF-8 before it parses a line
        raise GaplanError(f"--config {path}: not TOML (not UTF-8 text: byte {exc.object[exc.start]:#04x} at offset "
                          f"{exc.start})") from None


def read_config(path: str, command: str, parsers: Mapping[str, Callable[[Any], Any]],
                tables: Mapping[str, str | None] | None = None,
                numbers: Mapping[str, type | None] | None = None) -> dict[str, Any]:
    """``command``'s values in the TOML file at ``path``, by key; ``parsers[key](value)`` parses one (raising on a
    value its option refuses: the error's ``message`` or text is the line's end). ``tables[key]`` is the table an
    option belongs in, nested as the objects are (``[train.loop]``; None: ``[train]`` itself); a key may also sit in
    ``[train]`` itself, as a flat file has it. ``numbers[key]`` (``int``, ``float``, ``bool``, ``str``): the kind
    of value an option holds, so a file's value is one as the command line's text would be (``2.5`` for an integer
    is refused, not cut to 2; a switch is a TOML boolean; text is a string)."""
    data = read_toml(path)
    top = [key for key, value in data.items() if isinstance(value, dict)]
    if top and command not in top:
        raise GaplanError(f"--config {path}: no [{command}] table (it has {', '.join(f'[{t}]' for t in top)})")
    found = data[command] if top else data
    homes = tables or {}
    known = sorted({table for table in homes.values() if table})
    values: dict[str, Any] = {}
    for name, value in found.items():
        if not isinstance(value, dict):
            values[name] = _checked(path, command, name, value, parsers, numbers or {})
            continue
        if name not in known:
            raise GaplanError(f"--config {path}: [{command}.{name}] is not a table of {command} (its tables: "
                              f"{', '.join(known) or 'none'})")
        for key, item in value.items():
            _checked(path, f"{command}.{name}", key, item, parsers, numbers or {})
            if homes.get(key) != name:  # every key in the table of the object that holds it
                where = f"[{command}.{homes[key]}]" if homes.get(key) else f"[{command}]"
                raise GaplanError(f"--config {path}: [{command}.{name}] has no option {key!r} (it is in {where})")
            values[key] = item
    return values


def _checked(path: str, table: str, key: str, value: Any, parsers: Mapping[str, Callable[[Any], Any]],
             numbers: Mapping[str, type | None]) -> Any:
    parse = parsers.get(key)
    if parse is None:
        near = difflib.get_close_matches(key.replace("_", "-"), list(parsers), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise GaplanError(f"--config {path}: [{table}] has no option {key!r}{hint}")
    kind = numbers.get(key)
    # A float, bool or list where a number goes: refused as its text would be (click's int() would cut 2.5 to 2); a
    # switch is true or false, and a text option's value a string (a list was turned into its Python text).
    if kind in (int, float) and (isinstance(value, bool) or not isinstance(value, (str, int) if kind is int
                                                                          else (str, int, float))):
        raise GaplanError(f"--config {path}: [{table}] {key} = {value!r}: {value!r} is not "
                          f"{'an integer' if kind is int else 'a number'}")
    if kind is bool and not isinstance(value, bool):
        raise GaplanError(f"--config {path}: [{table}] {key} = {value!r}: a switch is true or false")
    if kind is str and not isinstance(value, str):
        raise GaplanError(f'--config {path}: [{table}] {key} = {value!r}: {value!r} is not a string ("text" in quotes)')
    try:
        parse(value)
    except Exception as exc:  # noqa: BLE001 - the option's parser refuses it: its own words end the line
        raise GaplanError(f"--config {path}: [{table}] {key} = {value!r}: "
                          f"{getattr(exc, 'message', None) or exc}") from None
    return value
