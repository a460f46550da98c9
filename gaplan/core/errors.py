"""Errors a user can act on. The CLI turns them into one line and exit status 2."""

from __future__ import annotations

import sys
from typing import TypeVar

E = TypeVar("E", bound=BaseException)


class GaplanError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class DoesNotFit(GaplanError):
    """The workload does not fit the memory budget even at micro-batch 1."""

    def __init__(self, message: str, needed_bytes: int | None = None) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes


# Only the allocators' own out-of-memory errors can be cured by a smaller batch. A CUDA error raised by a
# kernel launch or cuBLAS init ("CUDA error: out of memory", CUBLAS_STATUS_ALLOC_FAILED) leaves the CUDA
# context broken ("sticky"): it is fatal and must not be retried, so no bare "out of memory" here.
_OOM_MESSAGES = ("DefaultCPUAllocator: can't allocate memory", "CUDA out of memory. Tried to allocate")


def is_out_of_memory(exc: BaseException) -> bool:
    """The one place that decides whether an exception is an out-of-memory error (torch's, where torch is loaded:
    without it no torch error was raised)."""
    torch = sys.modules.get("torch")
    if isinstance(exc, MemoryError) or (torch is not None and isinstance(exc, torch.OutOfMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OOM_MESSAGES)


def mark_rank_own(exc: E) -> E:
    """Mark ``exc`` as this rank's own failure, which rank 0 did not share: under torchrun rank 0 alone prints the
    errors every rank raises alike, and a rank prints a line marked so as well, as it is the line that says why."""
    exc.gaplan_rank_own = True  # type: ignore[attr-defined]
    return exc


def is_rank_own(exc: BaseException) -> bool:
    return bool(getattr(exc, "gaplan_rank_own", False))


def mark_user_code(exc: E) -> E:
    """Mark ``exc`` as raised because the user's own code raised (chained as its cause): the CLI's one line points to
    ``--debug``, which prints that code's traceback."""
    exc.gaplan_user_code = True  # type: ignore[attr-defined]
    return exc


def is_user_code(exc: BaseException) -> bool:
    return bool(getattr(exc, "gaplan_user_code", False))


class RemoteTraceback(Exception):
    """Another process's traceback, as text: chained to the error raised again here, so ``--debug`` shows where the
    error began (as :mod:`concurrent.futures` does with a worker's)."""

    def __str__(self) -> str:
        return f"\n\"\"\"\n{self.args[0].rstrip()}\n\"\"\""


def one_line(text: object) -> str:
    """A message on one line: errors from json, pandas or torch can span several, the CLI prints exactly one."""
    return " ".join(str(text).split())
