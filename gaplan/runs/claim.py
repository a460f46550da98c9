"""Who may write a run folder: one run a folder, one writer at a time. No torch.

A command that writes a run folder claims it first (:func:`claim_run_folder`): the folder as it resolves (symlinks,
``..``) is locked with an OS lock (``flock`` on the folder itself, so nothing is left in it, and the kernel
releases it when the process ends, however it ends), then checked: a folder that already holds a run's files is
refused in one line, unless the command continues that run (``--resume``) or was told ``--overwrite`` (then the
old run's files are replaced, and only those; a command refused before it writes leaves them as they were). A
probe or a bench never writes into a train run's folder.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator

from gaplan.core.errors import GaplanError
from gaplan.runs import folder

# Every file name gaplan writes into a run folder (the shards of FSDP checkpoints by their prefix).
RUN_FILE_NAMES = frozenset(
    value for name, value in vars(folder).items()
    if name.isupper() and isinstance(value, str) and "." in value and name not in ("REPORTS_ROOT",)
)
TRAIN_RUN_FILES = (folder.TRAIN_JSON, folder.CHECKPOINT)  # what makes a folder a train run's
# Where --overwrite sets the old run's files aside (``.replaced.tmp.<pid>``) until the new run writes its own.
REPLACED_PREFIX = ".replaced.tmp."


def run_files_in(directory: str) -> list[str]:
    """The names in ``directory`` that gaplan writes (its run files, FSDP shard folders and the temporary files of
    a write that was cut off), sorted; empty for a folder that does not exist."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(name for name in names if name in RUN_FILE_NAMES or name.startswith(folder.SHARDED_STATE_PREFIX)
                  or is_temporary_write(name) or name.startswith(REPLACED_PREFIX))


def is_temporary_write(name: str) -> bool:
    """``.<run file>.tmp.<pid>``: what :func:`gaplan.core.atomic_write.atomic_write` writes before its rename."""
    if not name.startswith("."):
        return False
    base, sep, pid = name[1:].rpartition(".tmp.")
    return bool(sep) and pid.isdigit() and (base in RUN_FILE_NAMES or base.startswith(folder.SHARDED_STATE_PREFIX))


def check_run_folder(out: str, command: str, *, overwrite: bool = False, what: str = "--out") -> list[str]:
    """Refuse ``out`` when it holds a run that ``command`` (``train``, ``probe``, ``bench``) would replace, unless
    ``overwrite``; a probe or bench never replaces a train run. Returns the run's files that ``overwrite`` removes."""
    found = run_files_in(os.path.realpath(out))
    if not found:
        return []
    shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    is_train_run = any(name in found for name in TRAIN_RUN_FILES)
    if is_train_run and command != "train":
        raise GaplanError(f"{what} {out} holds a train run ({shown}): a {command} never writes into one; give a "
                          f"fresh {what}")
    if overwrite:
        return found
    go_on = f"continue it with gaplan train --resume {out}, " if is_train_run else ""
    raise GaplanError(f"{what} {out} already holds a run ({shown}): {go_on}give a fresh {what}, or add --overwrite "
                      "to replace it")


def check_not_a_run_file(path: str, run_dir: str, what: str) -> None:
    """An output that would be the run folder (``--save-model RUN``) or one of its own files (``--save-weights
    RUN/checkpoint.pt``), which the run writes too: refused in one line before any work."""
    real = os.path.realpath(path)
    if real == os.path.realpath(run_dir):
        raise GaplanError(f"{what} {path} is the run folder itself: give a folder of its own")
    if os.path.dirname(real) == os.path.realpath(run_dir) and os.path.basename(real) in RUN_FILE_NAMES:
        raise GaplanError(f"{what} {path} is the run folder's own {os.path.basename(real)}, which the run writes: "
                          "give another file name")


def remove_run_files(directory: str, names: list[str]) -> None:
    """Remove the run files ``names`` from ``directory`` (``--overwrite``): gaplan's files, never the user's."""
    for name in names:
        path = os.path.join(directory, name)
        with contextlib.suppress(FileNotFoundError):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)


def remove_temporary_writes(directory: str) -> list[str]:
    """Remove the temporary files that writes cut off by a kill left in ``directory``; their names. Call it only
    while holding the folder (no other writer), once the files they would have replaced are known good."""
    stale = [name for name in run_files_in(directory) if is_temporary_write(name)]
    remove_run_files(directory, stale)
    return stale


# Folders this process holds: realpath -> [descriptor, depth]. A command that writes a folder it already holds (a
# train's --compare benches into its own run folder) takes it again, not a second lock that would wait for itself.
_held: dict[str, list[int]] = {}


@contextlib.contextmanager
def hold_run_folder(out: str, what: str = "--out") -> Iterator[str]:
    """Hold ``out`` as its only writer while the block runs: the folder is made if missing (and removed again if
    the block leaves it empty), locked, and its resolved path yielded. Another process holding it is one line that
    names that process. Without ``fcntl`` (Windows) nothing is locked."""
    real = os.path.realpath(out)
    if real in _held:
        _held[real][1] += 1
        try:
            yield real
        finally:
            _held[real][1] -= 1
        return
    made = _missing_folders(real)
    try:
        os.makedirs(real, exist_ok=True)
    except OSError as exc:
        raise GaplanError(f"{what} {out}: cannot make the folder ({exc.strerror or exc})") from None
    try:
        descriptor = _lock(real, out, what)
        _held[real] = [descriptor, 1]
        try:
            yield real
        finally:
            del _held[real]
            if descriptor >= 0:
                os.close(descriptor)  # closing the descriptor releases the lock
    finally:
        # A command that wrote nothing (or was refused) leaves no folder behind: neither ``out`` nor the parents made
        # for it (``reports/``), deepest first; a folder something else wrote into stays.
        for path in made:
            try:
                os.rmdir(path)
            except OSError:
                break


def _missing_folders(real: str) -> list[str]:
    """The folders ``os.makedirs(real)`` would make, deepest first."""
    missing = []
    while real and not os.path.exists(real):
        missing.append(real)
        parent = os.path.dirname(real)
        if parent == real:
            break
        real = parent
    return missing


def _lock(real: str, out: str, what: str) -> int:
    try:
        import fcntl
    except ImportError:  # Windows: no flock
        return -1
    descriptor = os.open(real, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(descriptor)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise GaplanError(f"{what} {out}: cannot lock the folder ({exc.strerror or exc})") from None
        other = "" if what == "--resume" else f", or give another {what}"  # a run goes on in its own folder only
        raise GaplanError(f"{what} {out} is being written by {holder_of(real)}: wait for it to end{other}") from None
    return descriptor


def holder_of(path: str) -> str:
    """Which process holds the ``flock`` on ``path``, as ``process PID (its command line)``, read from
    ``/proc/locks``; ``another process`` where that cannot be read (not Linux)."""
    try:
        stat = os.stat(path)
        device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
        with open("/proc/locks", encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return "another process"
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == device and parts[4].isdigit():
            pid = int(parts[4])
            return f"process {pid}" + (f" ({command})" if (command := _command_line(pid)) else "")
    return "another process"


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = handle.read().split(b"\0")
    except OSError:
        return ""
    text = " ".join(" ".join(word.decode(errors="replace").split()) for word in words if word)
    return text if len(text) <= 120 else text[:117] + "..."


@contextlib.contextmanager
def claim_run_folder(out: str, command: str, *, overwrite: bool = False, resume: bool = False,
                     inputs: list[str] | tuple[str, ...] = (), what: str = "--out") -> Iterator[str]:
    """Hold ``out`` (:func:`hold_run_folder`) and check it (:func:`check_run_folder`; skipped for a run that is
    continued); with ``overwrite`` the old run's files are replaced (:func:`_set_aside`), unless one of them is among
    the command's ``inputs`` (a ``--plan`` read from the folder it would empty). Yields the resolved path."""
    with hold_run_folder(out, what) as real:
        if _held[real][1] == 1 and _held[real][0] >= 0:  # the only writer: a set-aside run is a killed writer's
            _settle_set_aside(real)
        if not resume and _held[real][1] == 1:  # a nested claim (a train's --compare) writes its own folder
            old = check_run_folder(out, command, overwrite=overwrite, what=what)
            read = {os.path.realpath(path) for path in inputs}
            for name in old:
                if os.path.join(real, name) in read:
                    raise GaplanError(f"--overwrite would remove {name} of {out}, which this command reads: copy it "
                                      f"out of the folder first, or give a fresh {what}")
            with _set_aside(real, old):
                yield real
                return
        yield real


@contextlib.contextmanager
def _set_aside(real: str, names: list[str]) -> Iterator[None]:
    """``--overwrite``: the old run's files moved aside while the new run starts, back in place if it ends before
    writing anything (an input it refuses costs the old run nothing), else removed."""
    if not names:
        yield
        return
    aside = os.path.join(real, f"{REPLACED_PREFIX}{os.getpid()}")
    remove_run_files(real, [os.path.basename(aside)])  # a kill's leftover of this pid's
    os.mkdir(aside)
    for name in names:
        os.replace(os.path.join(real, name), os.path.join(aside, name))
    before = set(os.listdir(real))
    wrote = True
    try:
        yield
    except BaseException:
        wrote = set(os.listdir(real)) != before
        raise
    finally:
        if wrote:
            shutil.rmtree(aside, ignore_errors=True)
        else:
            for name in names:
                os.replace(os.path.join(aside, name), os.path.join(real, name))
            os.rmdir(aside)


def _settle_set_aside(real: str) -> None:
    """What an ``--overwrite`` cut by ``kill -9`` left: the old run set aside in ``.replaced.tmp.<pid>``, which
    :func:`_set_aside` had no chance to put back or remove. As it would have: back in place when the new run wrote
    nothing (the old run is found again by ``--resume``, ``report`` and the refusal), else removed (the new run had
    replaced it, as asked). Call it holding the folder, so no live writer's set-aside is touched."""
    for aside in sorted(name for name in os.listdir(real) if name.startswith(REPLACED_PREFIX)):
        path = os.path.join(real, aside)
        kept = os.listdir(path) if os.path.isdir(path) else []
        others = [name for name in run_files_in(real) if not name.startswith(REPLACED_PREFIX)]
        if kept and not others:
            for name in kept:
                os.replace(os.path.join(path, name), os.path.join(real, name))
        remove_run_files(real, [aside])
