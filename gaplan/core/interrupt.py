"""SIGINT and SIGTERM end a command the same way, and none is lost. No torch.

The CLI runs each command in :func:`catching_signals`: both signals then raise :class:`KeyboardInterrupt` in the
main thread and are remembered. A :class:`KeyboardInterrupt` can still be swallowed where Python cannot raise it (a destructor, a
callback of the garbage collector, a child's death read as a failed trial), so a writer asks
:func:`raise_if_interrupted` before it writes a run's files, and the CLI asks :func:`received` before it reports
success: a signal that arrived is an interruption, never a result. (The training loop takes both signals over
while it runs, to checkpoint after the current step: :mod:`gaplan.training.loop`.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

_received: list[int] = []


@contextlib.contextmanager
def catching_signals() -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM raise :class:`KeyboardInterrupt` and are remembered; the handlers
    before it are put back after (a caller that is not the main thread changes nothing)."""
    _received.clear()
    previous: dict[int, Any] = {}
    # Under torchrun, SIGTERM is how its agent stops the other ranks once one has failed: that rank's line is the
    # news, so theirs end as torchrun ends them (the training loop still checkpoints on it: gaplan.training.loop).
    numbers = (signal.SIGINT,) if os.environ.get("TORCHELASTIC_RUN_ID") else (signal.SIGINT, signal.SIGTERM)
    try:
        for number in numbers:
            previous[number] = signal.signal(number, _on_signal)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        _received.clear()  # a signal belongs to the command it came to: a caller's next command starts clean


def _on_signal(number: int, frame: Any) -> None:
    _received.append(number)
    raise KeyboardInterrupt(signal.Signals(number).name)


def received() -> str | None:
    """The name of the first signal received in :func:`catching_signals` (``SIGINT``, ``SIGTERM``), or None."""
    return signal.Signals(_received[0]).name if _received else None


def raise_if_interrupted() -> None:
    """Before a run's files are written: a signal received (and perhaps swallowed since) stops the command here."""
    if _received:
        raise KeyboardInterrupt(received())


def exit_on_late_signals(status: int | str | None) -> None:
    """After a command has ended (its output written, its exit status decided): a SIGINT or SIGTERM during the
    interpreter's teardown (torch's can take a second) ends the process at once with that status, not as the
    signal's default would (exit 143, no line, for a command whose result was already out)."""

    def exit_now(number: int, frame: Any) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status if isinstance(status, int) else 0 if status is None else 1)

    with contextlib.suppress(ValueError):  # not the main thread
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, exit_now)
