"""gaplan.core.disk: a disk fault told apart from a bug, whatever raised it, and the one line that says which."""

import errno
import os

import pytest

from gaplan.core.disk import FAULTS, WriteFailed, describe, disk_errno, disk_faults_as_one_line, ensure_room, free_bytes


@pytest.mark.parametrize("code", sorted(FAULTS))
def test_an_os_error_of_each_fault_is_that_fault(code):
    assert disk_errno(OSError(code, os.strerror(code))) == code


def test_writers_that_pass_on_only_a_message_are_read_by_its_os_error():
    from safetensors import SafetensorError

    # safetensors' (Rust's io::Error, as it words it), and torch's zip writer when it names the OS's words
    assert disk_errno(SafetensorError("Error while serializing: I/O error: File too large (os error 27)")) == 27
    assert disk_errno(SafetensorError('IoError(Os { code: 28, kind: StorageFull, message: "No space left" })')) == 28
    assert disk_errno(RuntimeError("PytorchStreamWriter failed writing file data/0: Disk quota exceeded")) == \
        errno.EDQUOT


def test_a_bug_whose_message_reads_like_a_fault_is_a_bug():
    """Text is read only for the writers that give nothing else: anything else is classified by type and errno."""
    assert disk_errno(RuntimeError("subprocess failed with exit code: 1")) is None  # once read as EPERM
    assert disk_errno(ValueError("[Errno 30] Read-only file system: 'x'")) is None
    assert disk_errno(Exception("failed: Disk quota exceeded")) is None
    assert disk_errno(KeyError("permission denied")) is None
    assert disk_errno(KeyboardInterrupt()) is None and disk_errno(SystemExit(1)) is None


def test_a_fault_behind_another_exception_is_found_and_a_bug_is_not_a_fault():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("saving failed") from inner
    except RuntimeError as outer:
        assert disk_errno(outer) == errno.ENOSPC
    assert disk_errno(TypeError("unsupported operand type(s)")) is None
    assert disk_errno(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 3x2)")) is None
    assert disk_errno(OSError(errno.ENOENT, "No such file or directory")) is None  # not the disk's fault


def test_torch_s_zip_writer_failure_is_put_down_to_what_the_disk_shows(tmp_path):
    failed = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    free = free_bytes(str(tmp_path))
    assert disk_errno(failed, str(tmp_path), needed=free + (1 << 30)) == errno.ENOSPC
    assert disk_errno(failed, str(tmp_path), needed=1) == errno.EIO  # room, no limit: an I/O error


def test_the_line_names_the_file_its_folder_and_the_sizes(tmp_path):
    path = str(tmp_path / "checkpoint.pt")
    too_much = free_bytes(path) + (1 << 30)
    line = describe(path, errno.ENOSPC, too_much)
    assert line.startswith(f"cannot write checkpoint.pt to {tmp_path}: it needs ") and line.endswith(" are free")
    # A write that failed where the disk now has room (another process freed it): the fault, without sizes
    assert describe(path, errno.ENOSPC, 1 << 10) == (f"cannot write checkpoint.pt to {tmp_path}: the disk is full "
                                                      "(No space left on device)")
    assert describe(path, errno.EROFS) == (f"cannot write checkpoint.pt to {tmp_path}: the file system is read-only "
                                           "(Read-only file system)")
    with pytest.raises(WriteFailed, match="it needs .* are free") as raised:
        ensure_room(path, free_bytes(path) + (1 << 30))
    assert raised.value.code == errno.ENOSPC
    ensure_room(path, 1 << 10)  # room: nothing raised


def test_the_context_turns_a_fault_into_one_line_and_lets_a_bug_through(tmp_path):
    path = str(tmp_path / "w.safetensors")
    with pytest.raises(WriteFailed, match="w.safetensors .*the disk quota is exceeded"):
        with disk_faults_as_one_line(path, 10):
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
    with pytest.raises(KeyError):
        with disk_faults_as_one_line(path):
            raise KeyError("model.weight")


def test_a_fault_keeps_the_writer_s_exception_and_a_bug_keeps_its_type_and_traceback(tmp_path):
    import traceback

    path = str(tmp_path / "w.safetensors")
    with pytest.raises(WriteFailed) as fault:
        with disk_faults_as_one_line(path, 10):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert isinstance(fault.value.__cause__, OSError) and fault.value.__cause__.errno == errno.ENOSPC

    def serializer():  # a bug inside a write, whose message happens to look like an OS error
        raise RuntimeError("worker exited with code: 1")

    with pytest.raises(RuntimeError) as bug:
        with disk_faults_as_one_line(path):
            serializer()
    assert type(bug.value) is RuntimeError and str(bug.value) == "worker exited with code: 1"
    frames = [frame.name for frame in traceback.extract_tb(bug.value.__traceback__)]
    assert frames[-1] == "serializer", frames  # raised where it was, not re-raised from the context
    for interrupt in (KeyboardInterrupt, SystemExit):
        with pytest.raises(interrupt):
            with disk_faults_as_one_line(path):
                raise interrupt()
