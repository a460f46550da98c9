"""Write a file so that readers see the old content or the new, never half of it. No torch."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from gaplan.core.errors import GaplanError


def atomic_write(path: str, write: Callable[[str], object], fsync: bool = False) -> None:
    """Call ``write(temp_path)``, then rename the temp file over ``path`` (same directory, so same file system).

    ``fsync`` flushes the temp file to disk before the rename, for files a crash must not lose
    (checkpoints). On any failure the temp file is removed and ``path`` is left as it was; an
    ``OSError`` (disk full, no permission) becomes a one-line :class:`GaplanError`.
    """
    directory = os.path.dirname(os.path.abspath(path))
    temp = os.path.join(directory, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    try:
        os.makedirs(directory, exist_ok=True)
        write(temp)
        if fsync:
            with open(temp, "rb+") as handle:
                os.fsync(handle.fileno())
        os.replace(temp, path)
    except OSError as exc:
        raise GaplanError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` (UTF-8, ``\\n`` line ends) to ``path`` atomically."""

    def write(temp: str) -> None:
        with open(temp, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)

    atomic_write(path, write)
