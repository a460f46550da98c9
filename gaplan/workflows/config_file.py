"""A command's options from a TOML file (``--config``): the file read and every key and value checked, below the CLI.

The file holds a table per command, keyed by the flags without their dashes; a file without tables is the invoked
command's own. Each value is checked by its option's own parser, given by the caller (the CLI passes click's
types), so a bad key, value, table or file is one :class:`GaplanError` line.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Mapping
from typing import Any

from gaplan.core.errors import GaplanError


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


def read_config(path: str, command: str, parsers: Mapping[str, Callable[[Any], Any]]) -> dict[str, Any]:
    """``command``'s values in the TOML file at ``path``, by key; ``parsers[key](value)`` parses one (raising on a
    value its option refuses: the error's ``message`` or text is the line's end)."""
    data = read_toml(path)
    tables = [key for key, value in data.items() if isinstance(value, dict)]
    if tables and command not in tables:
        raise GaplanError(f"--config {path}: no [{command}] table (it has {', '.join(f'[{t}]' for t in tables)})")
    values = data[command] if tables else data
    for key, value in values.items():
        parse = parsers.get(key)
        if parse is None:
            near = difflib.get_close_matches(key.replace("_", "-"), list(parsers), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise GaplanError(f"--config {path}: [{command}] has no option {key!r}{hint}")
        try:
            parse(value)
        except Exception as exc:  # noqa: BLE001 - the option's parser refuses it: its own words end the line
            raise GaplanError(f"--config {path}: [{command}] {key} = {value!r}: "
                              f"{getattr(exc, 'message', None) or exc}") from None
    return dict(values)
