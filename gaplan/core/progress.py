"""The progress callback the library's workflows take (the CLI prints what it is given), and its silent default."""

from __future__ import annotations

from collections.abc import Callable

Say = Callable[[str], None]


def quiet(text: str) -> None:
    """Say nothing: the default ``say`` of every workflow."""
