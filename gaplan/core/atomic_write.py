"""Write a file so that readers see the old content or the new, never half of it. No torch."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from gaplan.core.disk import disk_faults_as_one_line, ensure_room
from gaplan.core.errors import GaplanError
from gaplan.core.interrupt import raise_if_interrupted


def atomic_write(path: str, write: Callable[[str], object], fsync: bool = False, size: int | None = None,
                 what: str | None = None) -> None:
    """Call ``write(temp_path)``, then rename the temp file over ``path`` (same directory, so same file system).

    ``fsync`` flushes the temp file to disk before the rename, for files a crash must not lose (checkpoints).
    ``size``, the bytes the file will take, is checked against the free space and the file-size limit first
    (:func:`gaplan.core.disk.ensure_room`: the old file still exists while the temp is written). On any failure
    the temp file is removed and ``path`` is left as it was. A disk fault, raised by whichever writer ``write``
    calls, becomes a one-line :class:`gaplan.core.disk.WriteFailed` (``what`` names the file in it), another
    ``OSError`` a one-line :class:`GaplanError`; anything else (a bug) goes through.
    """
    raise_if_interrupted()  # nothing is written once SIGINT or SIGTERM has come (gaplan.core.interrupt)
    directory = os.path.dirname(os.path.abspath(path))
    temp = os.path.join(directory, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    try:
        os.makedirs(directory, exist_ok=True)
        ensure_room(path, size or 0, what)
        with disk_faults_as_one_line(path, size, what):
            write(temp)
            # Writers create files 0600 (safetensors, mkstemp): the file gets the mode any new file of the user's
            # gets, so a shared run folder or weights folder reads as the rest of it does.
            os.chmod(temp, 0o666 & ~_umask())
            if fsync:
                with open(temp, "rb+") as handle:
                    os.fsync(handle.fileno())
            os.replace(temp, path)
    except GaplanError:
        raise
    except OSError as exc:
        raise GaplanError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        # Only a temp file that exists: on a read-only file system removing one never made raises EROFS, which would
        # replace the one-line error above with a traceback.
        if os.path.lexists(temp):
            with contextlib.suppress(OSError):
                os.remove(temp)


def _umask() -> int:
    """The process's umask (read by setting it, then set back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` (UTF-8, ``\\n`` line ends as given) to ``path`` atomically."""
    data = text.encode("utf-8")

    def write(temp: str) -> None:
        with open(temp, "wb") as handle:
            handle.write(data)

    atomic_write(path, write, size=len(data))
