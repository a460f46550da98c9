"""A fresh process per trial: ``fork()`` the caller, run one piece of work in the child, get its dict back.

The child sees what a new training process sees (nothing a trial allocated survives it); it dies with its parent,
and an error in it comes back as data (a :class:`~gaplan.core.errors.GaplanError` as the user's, anything else
as a crash with its traceback; a SIGKILL, the kernel's OOM killer's, as killed).
"""

from __future__ import annotations

import json
import os
import signal
import traceback
from collections.abc import Callable


def run_in_child(work: Callable[[], dict], output: str | None = None, header: str = "") -> dict:
    """Run ``work`` in a forked child and return the dict it produced (or why it produced none).

    ``output``: a file the child's stdout and stderr (the user's code's prints, its libraries' warnings and
    progress bars) are appended to, after ``header``, instead of this process's screen."""
    import sys

    sys.stdout.flush()  # else the child inherits what is buffered here and writes it a second time
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into the caller's stack
        os.close(read_end)
        die_with_parent()
        if output is not None:
            _output_to(output, header)
        status = 0
        try:
            message = work()
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent as data
            from gaplan.core.errors import GaplanError
            from gaplan.core.options import error_reply

            if isinstance(exc, GaplanError):
                message = error_reply(exc)
            else:
                message = {"error": "crash", "message": traceback.format_exc(limit=6)}
            status = 1
        if output is not None:  # os._exit does not flush Python's buffers
            sys.stdout.flush()
            sys.stderr.flush()
        with os.fdopen(write_end, "w") as out:
            out.write(json.dumps(message))
        os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as incoming:
        text = incoming.read()
    _, wait_status = os.waitpid(pid, 0)
    if text:
        return json.loads(text)
    if os.WIFSIGNALED(wait_status):
        # SIGKILL here is the kernel's OOM killer (or a user): report it as running out of memory.
        number = os.WTERMSIG(wait_status)
        return {"error": "killed", "message": f"trial process killed by {signal.Signals(number).name}"}
    return {"error": "crash", "message": f"trial process exited with status {os.waitstatus_to_exitcode(wait_status)}"}


def _output_to(path: str, header: str) -> None:
    """This process's stdout and stderr (file descriptors 1 and 2, so C libraries' output too) appended to ``path``."""
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    if header:
        os.write(descriptor, header.encode())
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.close(descriptor)
    import sys

    # Python's own streams too: a notebook's or a test runner's sys.stdout is not file descriptor 1.
    sys.stdout = open(1, "w", buffering=1, closefd=False, errors="replace")  # noqa: SIM115 - lives with the child
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="replace")  # noqa: SIM115


def output_tail(path: str, lines: int = 20) -> str:
    """The last ``lines`` lines of a trials' output file (empty when there is none)."""
    try:
        with open(path, errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError:
        return ""


def die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (else a killed probe leaves trials running)."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: a trial child then outlives a killed worker until its trial ends


def failure_line(message: dict) -> str:
    """The last line of what a child that failed sent back (:func:`run_in_child`'s ``message``), on one line."""
    from gaplan.core.errors import one_line

    lines = str(message.get("message", "")).strip().splitlines()
    return one_line(lines[-1] if lines else message.get("error", message))
