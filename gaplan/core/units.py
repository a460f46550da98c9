"""Parsing and printing byte sizes (``2GiB``, ``512MB``, ``1.5g``)."""

from __future__ import annotations

import re

from gaplan.core.options import OptionError

_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kb": 10**3, "kib": 2**10,
    "m": 2**20, "mb": 10**6, "mib": 2**20,
    "g": 2**30, "gb": 10**9, "gib": 2**30,
    "t": 2**40, "tb": 10**12, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | str, name: str = "memory_limit") -> int:
    """A positive byte count from bytes (an int) or text (``2GiB``/``1.5GB``/``800M``/``1073741824``).

    A bad value raises an :class:`OptionError` that names ``name`` as the caller wrote it (``memory_limit`` in
    Python; the command line shows its flag, ``--memory-limit``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise OptionError(f"{name} must be at least 1 byte (got {value})", name)
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise OptionError(f"{name} must be a size such as 2GiB, 512MiB or 1.5GB, or bytes (got {value!r})", name)
    count = int(float(match.group(1)) * _UNITS[unit])
    if count <= 0:  # 0.5 (bytes) rounds down to none
        raise OptionError(f"{name} must be at least 1 byte (got {value!r})", name)
    return count


def format_bytes(count: float | None) -> str:
    """Human-readable binary size: ``1.23 GiB``."""
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
