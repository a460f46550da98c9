"""Lazy package exports: a package names what it offers without importing it (and torch) on import."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for a package whose names live in submodules.

    ``exports`` maps a public name to the module (relative to ``package``, e.g. ``".corpus"``) that defines it;
    the module is imported on the first access of the name, so ``import gaplan.data.readers`` loads no torch.
    """

    def __getattr__(name: str) -> object:
        if name in exports:
            value = getattr(importlib.import_module(exports[name], package), name)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
