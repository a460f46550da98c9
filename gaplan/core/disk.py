"""Disk faults, told apart from bugs in one place: a full disk, a quota, a read-only file system, no permission, the
process's file-size limit. No torch.

Every large file gaplan writes (checkpoints and their shards, ``--save-weights``, ``--save-model``, caches, report
images) is checked first: :func:`ensure_room` compares what it will take with the free space of its file system and
with ``RLIMIT_FSIZE``. An atomic write needs room for its temporary file while the old file still exists, so the old
file is not counted as free. When a write fails anyway (another process filled the disk), :func:`disk_errno` reads
the cause out of whatever the writer raised, by type first: Python's ``OSError`` by its errno, distributed
checkpoint's ``CheckpointException`` by every rank's failure. Only the two serializers that give no errno are read by
their text: safetensors (``SafetensorError``, the OS error in its message) and torch's zip writer (a
``RuntimeError`` naming the stream writer). Anything else is a bug and is raised as it is, with its traceback; the
one line of a fault keeps the writer's exception chained (``gaplan --debug`` shows it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator

from gaplan.core.errors import GaplanError
from gaplan.core.units import format_bytes

# What each fault is called in the one line a user reads.
FAULTS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EFBIG: "the process's file size limit (ulimit -f) is reached",
    errno.EIO: "the write failed (an I/O error)",
}
# The OS's own words, where a writer passes on a message and not an errno (safetensors, torch's zip writer).
_STRERRORS = {os.strerror(code).lower(): code for code in FAULTS}
_OS_ERROR_CODE = re.compile(r"(?:os error|code:)\s*(\d+)", re.IGNORECASE)
# torch's zip writer (caffe2's PyTorchStreamWriter) reports a failed write without its errno.
_TORCH_WRITE_FAILED = ("file write failed", "unexpected pos", "failed writing", "PytorchStreamWriter failed")
# The writers whose exceptions carry the OS error only in their text, by class name (no import of theirs here).
_MESSAGE_ONLY_WRITERS = ("SafetensorError",)
_CHECKPOINT_EXCEPTION = "CheckpointException"  # distributed checkpoint's: a BaseException that is no interrupt
# Slack over a file's payload: a zip's or safetensors' headers, file system blocks.
ROOM_SLACK = 1 << 20


class WriteFailed(GaplanError):
    """A file could not be written for a reason of the disk, not of gaplan: one line, exit 2."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def free_bytes(path: str) -> int | None:
    """Bytes an unprivileged writer may still use on the file system of ``path`` (its folder if it does not exist)."""
    stats = _statvfs(existing_folder(path))
    return stats.f_bavail * stats.f_frsize if stats is not None else None


def _statvfs(folder: str):
    """The file system's figures, or None where they cannot be read (or the OS has no statvfs: Windows)."""
    try:
        return os.statvfs(folder)
    except (OSError, AttributeError):
        return None


def existing_folder(path: str) -> str:
    """The nearest folder of ``path`` that exists (the one a new file or folder would be made in)."""
    folder = os.path.abspath(path)
    while not os.path.isdir(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return folder


def file_size_limit() -> int | None:
    """The process's ``RLIMIT_FSIZE`` soft limit in bytes, or None when unlimited (or where there is none)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def ensure_room(path: str, needed: int, what: str | None = None, file_bytes: int | None = None) -> None:
    """Raise :class:`WriteFailed` when ``needed`` bytes cannot be written at ``path``: not enough free space (the
    temporary file of an atomic write beside the old one), a file-size limit below its largest file
    (``file_bytes``, default ``needed``), or a folder that cannot be written (read-only, no permission). ``what``
    names the file in the message (default its base name)."""
    folder = existing_folder(os.path.dirname(os.path.abspath(path)) or ".")
    stats = _statvfs(folder)
    if stats is not None and stats.f_flag & getattr(os, "ST_RDONLY", 0):
        raise WriteFailed(describe(path, errno.EROFS, needed, what), errno.EROFS)
    if not os.access(folder, os.W_OK):
        raise WriteFailed(describe(path, errno.EACCES, needed, what), errno.EACCES)
    limit, largest = file_size_limit(), needed if file_bytes is None else file_bytes
    if limit is not None and largest > limit:
        raise WriteFailed(describe(path, errno.EFBIG, largest, what), errno.EFBIG)
    # A file system that counts no blocks (/proc, some network mounts) says nothing about its room.
    free = stats.f_bavail * stats.f_frsize if stats is not None and stats.f_blocks else None
    if free is not None and needed + ROOM_SLACK > free:
        raise WriteFailed(describe(path, errno.ENOSPC, needed, what), errno.ENOSPC)


def describe(path: str, code: int | None, needed: int | None = None, what: str | None = None) -> str:
    """One line: what could not be written where, and why (with the sizes where they say why)."""
    name = what or os.path.basename(os.path.abspath(path))
    where = os.path.dirname(os.path.abspath(path))
    head = f"cannot write {name} to {where}"
    if code == errno.ENOSPC and needed:
        free = free_bytes(path)
        if free is not None and needed + ROOM_SLACK > free:
            return f"{head}: it needs {format_bytes(needed)} and {format_bytes(free)} are free"
    if code == errno.EFBIG and needed:
        limit = file_size_limit()
        if limit is not None:
            return (f"{head}: it needs {format_bytes(needed)} and the process's file size limit (ulimit -f) is "
                    f"{format_bytes(limit)}")
    if code == errno.EDQUOT and needed:
        return f"{head}: {FAULTS[code]} (it needs {format_bytes(needed)})"
    if code in FAULTS:  # the OS's own words too, for a search
        return f"{head}: {FAULTS[code]} ({os.strerror(code)})"
    return f"{head}: the write failed"


def disk_errno(exc: BaseException, path: str | None = None, needed: int | None = None) -> int | None:
    """The disk fault behind ``exc`` (an errno of :data:`FAULTS`), or None when it is not one (a bug).

    Looks through the exception's causes and, for distributed checkpoint, every rank's failure. torch's zip writer
    reports no errno: its failure is put down to the disk being full when ``path``'s file system has less than
    ``needed`` free, else to the file-size limit when that is below ``needed``, else to a failed write (EIO).
    """
    if not isinstance(exc, Exception) and type(exc).__name__ != _CHECKPOINT_EXCEPTION:
        return None  # KeyboardInterrupt, SystemExit, GeneratorExit: never a disk fault
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        code = _own_errno(current, path, needed)
        if code is not None:
            return code
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]
        failures = getattr(current, "failures", None)  # torch.distributed.checkpoint's CheckpointException
        if isinstance(failures, dict):
            for failure in failures.values():
                pending += [e for e in (failure if isinstance(failure, tuple) else (failure,))
                            if isinstance(e, BaseException)]
    return None


def _own_errno(exc: BaseException, path: str | None, needed: int | None) -> int | None:
    """The fault of ``exc`` itself: by errno for an ``OSError``; by text only for a writer that gives nothing else
    (so a bug whose message happens to read "code: 1" or "permission denied" stays a bug)."""
    if isinstance(exc, OSError):
        return exc.errno if exc.errno in FAULTS else None
    text = str(exc)
    lowered = text.lower()
    torch_writer = isinstance(exc, RuntimeError) and any(marker.lower() in lowered for marker in _TORCH_WRITE_FAILED)
    if not torch_writer and type(exc).__name__ not in _MESSAGE_ONLY_WRITERS:
        return None
    for match in _OS_ERROR_CODE.finditer(text):
        if int(match.group(1)) in FAULTS:
            return int(match.group(1))
    for words, code in _STRERRORS.items():
        if words in lowered:
            return code
    if torch_writer:
        free = free_bytes(path) if path else None
        limit = file_size_limit()
        if needed is not None and free is not None and needed + ROOM_SLACK > free:
            return errno.ENOSPC
        if needed is not None and limit is not None and needed + ROOM_SLACK > limit:  # its headers on top
            return errno.EFBIG
        return errno.EIO
    return None


@contextlib.contextmanager
def disk_faults_as_one_line(path: str, needed: int | None = None, what: str | None = None) -> Iterator[None]:
    """Turn a disk fault raised inside into :class:`WriteFailed` for ``path`` (the writer's exception chained to it);
    anything else goes through untouched: a bug with its type and traceback, an interrupt as an interrupt."""
    try:
        yield
    except WriteFailed:
        raise
    except BaseException as exc:  # distributed checkpoint's CheckpointException is a BaseException
        code = disk_errno(exc, path, needed)  # None for a bug and for KeyboardInterrupt / SystemExit
        if code is None:
            raise
        raise WriteFailed(describe(path, code, needed, what), code) from exc

