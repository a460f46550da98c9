"""Outputs checked before the work: a folder that cannot be written, or a file path that names a folder, is one
line before any probe or step runs, and nothing is left half-written. No torch."""

from __future__ import annotations

import errno
import os
import tempfile

from gaplan.core.disk import FAULTS
from gaplan.core.errors import GaplanError


def check_writable(directory: str, what: str = "--out") -> None:
    """Fail before any work when the output cannot be written (nothing half-written after)."""
    target = os.path.abspath(directory)
    if os.path.exists(target) and not os.path.isdir(target):
        raise GaplanError(f"{what} {directory} exists and is not a directory")
    parent = target
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    try:  # really try: permission bits say nothing for root or on /proc-like file systems
        os.rmdir(tempfile.mkdtemp(prefix=".gaplan-check-", dir=parent))
    except OSError as exc:
        why = FAULTS.get(exc.errno or 0)
        raise GaplanError(f"{what} {directory} is not writable" + (f": {why}" if why else "")) from None


def check_output_file(path: str, what: str) -> None:
    """``path`` is to be written as one file: not a folder, in a folder that can be written."""
    if os.path.isdir(path):
        raise GaplanError(f"{what} {path} is a directory: give the path of the file to write")
    check_writable(os.path.dirname(os.path.abspath(path)), what)


def check_weights_file(path: str, what: str = "--save-weights") -> None:
    """``path`` is to be written as one safetensors file (:func:`check_output_file`), and a file already there holds
    safetensors weights: any other (a run's checkpoint, log or record) is not written over."""
    check_output_file(path, what)
    if os.path.isfile(path) and not _holds_safetensors(path):
        raise GaplanError(f"{what} {path} holds something other than safetensors weights; not overwritten: give "
                          "another path, or remove it first")


def _holds_safetensors(path: str) -> bool:
    """The safetensors layout: 8 bytes of header length (little-endian), then the JSON header, within the file."""
    try:
        with open(path, "rb") as handle:
            head, size = handle.read(9), os.fstat(handle.fileno()).st_size
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and 8 + int.from_bytes(head[:8], "little") <= size


def check_path_exists(path: str, what: str) -> None:
    """``path`` (given as ``what``) exists: else one line that says why not, a link that loops or leads nowhere
    told apart from a path with nothing there."""
    if os.path.exists(path):
        return
    why = "no such file or folder"
    if os.path.islink(path):
        try:
            os.stat(path)
        except OSError as exc:
            why = ("a symbolic link that loops" if exc.errno == errno.ELOOP
                   else f"a symbolic link to {os.readlink(path)}, which does not exist")
    elif os.path.lexists(os.path.dirname(os.path.abspath(path))) and not os.path.exists(os.path.dirname(
            os.path.abspath(path))):
        why = "a folder on its path is a symbolic link that loops or leads nowhere"
    raise GaplanError(f"{what} {path}: cannot read it ({why})")


def absolute_if_here(path: str | None) -> str | None:
    """``path`` made absolute when it names a file or folder here (relative to the working directory), else as
    given (a preset's name, ``bytes``, a hub id): what a run records reads the same from any directory, so its
    ``--resume`` and its ``config.toml`` work from elsewhere, and one file named two ways is one file."""
    if path is None or os.path.isabs(path) or not os.path.exists(path):
        return path
    return os.path.abspath(path)
