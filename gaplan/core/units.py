"""Parsing and printing byte sizes (``2GiB``, ``512MB``, ``1.5g``)."""

from __future__ import annotations

import re

from gaplan.core.errors import GaplanError

_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kb": 10**3, "kib": 2**10,
    "m": 2**20, "mb": 10**6, "mib": 2**20,
    "g": 2**30, "gb": 10**9, "gib": 2**30,
    "t": 2**40, "tb": 10**12, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str, what: str = "--memory-limit") -> int:
    """Parse ``2GiB``/``1.5GB``/``800M``/``1073741824`` into a positive byte count."""
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise GaplanError(f"{what} must be a size such as 2GiB, 512MiB or 1.5GB (got {text!r})")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise GaplanError(f"{what} must be larger than zero (got {text!r})")
    return value


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
