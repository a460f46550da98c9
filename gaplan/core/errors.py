"""Errors a user can act on. The CLI turns them into one line and exit status 2."""

from __future__ import annotations


class GaplanError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class DoesNotFit(GaplanError):
    """The workload does not fit the memory budget even at micro-batch 1."""

    def __init__(self, message: str, needed_bytes: int | None = None) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes


def one_line(text: object) -> str:
    """A message on one line: errors from json, pandas or torch can span several, the CLI prints exactly one."""
    return " ".join(str(text).split())
