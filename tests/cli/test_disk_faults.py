"""Disk faults injected for real, no writer mocked: a size-limited tmpfs (where this process may mount one; skipped
with the reason otherwise) and a file-size limit (RLIMIT_FSIZE) on the writing process. Each ends in one line and exit
2, the last good checkpoint resumable, train_log.csv consistent with it; after room is made, --resume reaches the
uninterrupted run's weights bitwise."""

import csv
import errno
import json
import os
import resource
import shutil
import subprocess
import sys

import pytest
import torch

from ..conftest import REPO_ROOT, free_port

# SGD, no momentum: the checkpoint is the weights, 21 MiB for tiny-gpt2.
TRAIN = ["train", "--model", "tiny-gpt2", "--seq-len", "16", "--effective-batch", "4", "--micro-batch", "2",
         "--optimizer", "sgd", "--lr", "0.1", "--steps", "3", "--threads", "1", "--device", "cpu", "--quiet",
         "--no-noise-scale"]
SCRIPTS = os.path.join(REPO_ROOT, "tests", "scripts")


def gaplan(*args, fsize=None, timeout=300):
    def limit():
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run([sys.executable, "-m", "gaplan", *args], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=timeout, preexec_fn=limit)


def one_line(done):
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("gaplan: ") and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def logged_steps(run):
    path = os.path.join(run, "train_log.csv")
    if not os.path.exists(path):
        return []
    with open(path, newline="") as handle:
        return [int(row["step"]) for row in csv.DictReader(handle)]


def checkpoint_step(run):
    return int(torch.load(os.path.join(run, "checkpoint.pt"), weights_only=True)["step"])


def weights(path):
    from safetensors.torch import load_file

    return load_file(path)


def same_bits(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("uninterrupted")
    done = gaplan(*TRAIN, "--out", str(folder / "run"), "--save-weights", str(folder / "w.safetensors"))
    assert done.returncode == 0, done.stderr[-3000:]
    return weights(str(folder / "w.safetensors"))


class SmallDisk:
    """A tmpfs of a given size, mounted for the test (root only) and resized to "make room"."""

    def __init__(self, path, size_mib):
        self.path = str(path)
        os.makedirs(self.path, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", self.path],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a size-limited tmpfs here ({done.stderr.strip() or 'mount failed'}); the "
                        "RLIMIT_FSIZE tests cover the same paths")

    def resize(self, size_mib):
        subprocess.run(["mount", "-o", f"remount,size={size_mib}m", self.path], check=True)

    def unmount(self):
        subprocess.run(["umount", self.path], capture_output=True)


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root; the RLIMIT_FSIZE tests cover the same paths")
    disks = []

    def mount(name, size_mib):
        disks.append(SmallDisk(tmp_path / name, size_mib))
        return disks[-1]

    yield mount
    for disk in disks:
        disk.unmount()


@pytest.mark.heavy
@pytest.mark.slow
def test_a_disk_with_room_for_one_checkpoint_not_two_keeps_the_first_and_resume_reaches_the_same_weights(
        small_disk, uninterrupted):
    disk = small_disk("disk", 40)  # one 21 MiB checkpoint fits; a second needs its temp file beside the first
    run = os.path.join(disk.path, "run")
    line = one_line(gaplan(*TRAIN, "--checkpoint-every", "1", "--out", run))
    assert f"cannot write checkpoint.pt to {run}: it needs" in line and "MiB are free" in line, line
    assert "the checkpoint of step 1 is kept" in line and f"gaplan train --resume {run}" in line, line
    assert checkpoint_step(run) == 1 and logged_steps(run) == [1]  # the log cut back to the checkpoint
    assert not [f for f in os.listdir(run) if ".tmp." in f], "no temp file is left behind"

    line = one_line(gaplan("train", "--resume", run, "--quiet"))  # the disk still full: the same, no traceback
    assert "cannot write checkpoint.pt" in line and checkpoint_step(run) == 1 and logged_steps(run) == [1]

    disk.resize(200)  # room made
    done = gaplan("train", "--resume", run, "--quiet", "--save-weights", os.path.join(disk.path, "w.safetensors"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert logged_steps(run) == [1, 2, 3] and checkpoint_step(run) == 3
    assert same_bits(weights(os.path.join(disk.path, "w.safetensors")), uninterrupted)


@pytest.mark.slow
def test_a_disk_too_small_for_one_checkpoint_is_refused_before_training(small_disk):
    disk = small_disk("disk", 15)
    run = os.path.join(disk.path, "run")
    line = one_line(gaplan(*TRAIN, "--out", run))
    assert "cannot write checkpoint.pt" in line and "checked before training" in line, line
    assert logged_steps(run) == [] and not os.path.exists(os.path.join(run, "checkpoint.pt"))


@pytest.mark.slow
def test_a_file_size_limit_below_the_checkpoint_is_refused_before_training(tmp_path):
    run = str(tmp_path / "run")
    line = one_line(gaplan(*TRAIN, "--out", run, fsize=10 << 20))
    assert "the process's file size limit (ulimit -f) is 10.00 MiB" in line and "checked before training" in line
    assert logged_steps(run) == [] and not os.path.exists(os.path.join(run, "checkpoint.pt"))


@pytest.mark.heavy
@pytest.mark.slow
def test_weights_that_do_not_fit_after_training_name_the_resume_that_writes_them_without_training_again(
        small_disk, tmp_path, uninterrupted):
    disk = small_disk("weights", 10)
    run, target = str(tmp_path / "run"), os.path.join(disk.path, "w.safetensors")
    line = one_line(gaplan(*TRAIN, "--out", run, "--save-weights", target))
    assert f"cannot write w.safetensors to {disk.path}: it needs" in line, line
    command = f"gaplan train --resume {run} --save-weights {target}"
    assert command in line and "(checkpoint.pt, step 3)" in line, line
    assert not os.listdir(disk.path), "nothing half-written"
    assert checkpoint_step(run) == 3 and logged_steps(run) == [1, 2, 3]

    disk.resize(100)
    done = gaplan(*command.split()[1:], "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    assert logged_steps(run) == [1, 2, 3], "no step was trained again"
    assert same_bits(weights(target), uninterrupted)


@pytest.mark.heavy
@pytest.mark.slow
def test_a_model_folder_that_does_not_fit_names_the_resume_that_writes_it(small_disk, tmp_path):
    disk = small_disk("model", 10)
    run, target = str(tmp_path / "run"), os.path.join(disk.path, "model")
    line = one_line(gaplan(*TRAIN, "--out", run, "--save-model", target))
    assert "cannot write the model folder model to" in line and "it needs" in line, line
    command = f"gaplan train --resume {run} --save-model {target}"
    assert command in line, line
    assert not os.listdir(disk.path), "no half-written folder"

    disk.resize(100)
    done = gaplan(*command.split()[1:], "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    assert logged_steps(run) == [1, 2, 3]
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(target).config.n_layer == 4


@pytest.mark.slow
def test_a_read_only_folder_is_one_line(small_disk):
    disk = small_disk("ro", 100)
    subprocess.run(["mount", "-o", "remount,ro", disk.path], check=True)
    line = one_line(gaplan(*TRAIN, "--out", os.path.join(disk.path, "run")))
    assert "is not writable: the file system is read-only" in line, line


def test_a_report_into_a_read_only_folder_is_one_line(small_disk):
    """gaplan report wrote nothing there and said so in a traceback: removing the temp file it never made raised EROFS
    in atomic_write's cleanup, over the one-line error."""
    disk = small_disk("ro-report", 20)
    shutil.copytree(os.path.join(REPO_ROOT, "reports", "probe-tiny-gpt2-default"), disk.path, dirs_exist_ok=True)
    subprocess.run(["mount", "-o", "remount,ro", disk.path], check=True)
    done = gaplan("report", disk.path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "the file system is read-only" in one_line(done), done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("how", ["fsize", "tmpfs"])
def test_every_writer_s_disk_fault_is_told_apart_from_a_bug(how, tmp_path, request):
    """torch.save, safetensors, distributed checkpoint, save_pretrained and plain writes fail for real; each
    exception is read as the disk fault it is, and two real bugs are not."""
    if how == "tmpfs":
        folder = request.getfixturevalue("small_disk")("full", 1).path
        args, expected = [folder], errno.ENOSPC
    else:
        folder = str(tmp_path)
        args, expected = [folder, str(1 << 20)], errno.EFBIG
    done = subprocess.run([sys.executable, os.path.join(SCRIPTS, "writer_faults.py"), *args], capture_output=True,
                          text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for writer in ("torch.save", "safetensors", "dcp.save", "save_pretrained", "open/write"):
        assert found[writer]["raised"] is not None and found[writer]["errno"] == expected, (writer, found)
    assert found["a bug"]["errno"] is None and found["a runtime bug"]["errno"] is None


def _fsdp_with_limited_rank_1(run, limit):
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
         os.path.join(SCRIPTS, "limited_rank.py"), "1", str(limit), *TRAIN, "--parallel", "fsdp",
         "--checkpoint-every", "1", "--out", run], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("gaplan: ")]
    assert len(lines) == 2, done.stderr[-3000:]  # one line from each rank, none left hanging
    ranks_own = done.stderr.split("failed (exitcode")[0]  # what follows is torchrun's report of the exit codes
    assert "Traceback" not in ranks_own, done.stderr[-3000:]
    assert not [f for f in os.listdir(run) if "shards" in f], os.listdir(run)  # no partial set of shards left
    assert not os.path.exists(os.path.join(run, "checkpoint.pt")) and logged_steps(run) == []
    return lines


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_under_fsdp_a_rank_that_cannot_write_its_shards_stops_every_rank_and_no_partial_shards_remain(tmp_path):
    """2 ranks, FSDP2; rank 1 alone has a file-size limit. Below its shards, every rank stops before writing any;
    just above their payload (the check passes, the write with its headers does not), distributed checkpoint fails
    on rank 1 and raises on both, and the shards already written are removed."""
    lines = _fsdp_with_limited_rank_1(str(tmp_path / "before"), 4 << 20)
    own = next(line for line in lines if "file size limit" in line)
    assert "cannot write the shards of" in own and "is 4.00 MiB" in own, lines
    assert any("another rank could not write the shards of" in line for line in lines), lines

    payload = float(own.split("it needs ")[1].split(" MiB")[0])  # rank 1's shards, to 0.01 MiB
    assert "checked before training" in own, own  # the first checkpoint's shards, known before step 1
    lines = _fsdp_with_limited_rank_1(str(tmp_path / "during"), int(payload * 2**20) + (40 << 10))
    assert any("cannot write the shards of" in line and "file size limit" in line for line in lines), lines
    assert any("rank 1 could not write the shards of" in line for line in lines), lines
