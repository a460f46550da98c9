"""Resume anywhere (docs/resume.md): a run cut by kill -9 goes on with another micro-batch, on more or fewer ranks,
under DDP or FSDP, to the uninterrupted run's weights; an extended run goes on along its new cosine; a checkpoint is
data, and one that names a callable is refused unread."""

import contextlib
import csv
import fcntl
import json
import math
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from gaplan.cli.main import main
from gaplan.training.checkpoint import checkpoint_position, derived_rng_seed

from ..conftest import REPO_ROOT, free_port

STEPS = ["train", "--seq-len", "16", "--effective-batch", "16", "--steps", "6", "--seed", "0", "--threads", "1",
         "--checkpoint-every", "1", "--optimizer", "sgd", "--lr", "0.5", "--quiet", "--device", "cpu"]


def launch(ranks: int, args: list[str]) -> list[str]:
    """The command line of ``gaplan args`` on ``ranks`` processes (torchrun with gloo) or one."""
    if ranks == 1:
        return [sys.executable, "-m", "gaplan", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-port",
            str(free_port()), "-m", "gaplan", *args]


def logged_steps(run_dir) -> int:
    log = run_dir / "train_log.csv"
    return max(0, len(log.read_text().splitlines()) - 1) if log.exists() else 0


def killed_mid_run(ranks: int, args: list[str], run_dir, after: int = 2, checkpointed: bool = True) -> int:
    """Start the run, kill -9 its whole process group once ``after`` steps are logged; the steps its checkpoint
    holds (``after`` or one fewer; 0 for a run that writes none before its end, ``checkpointed`` False)."""
    cut = subprocess.Popen(launch(ranks, [*args, "--out", str(run_dir)]), cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while logged_steps(run_dir) < after and cut.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cut.poll() is None, f"the run ended before it could be cut: {cut.stderr.read()[-3000:]}"
    # torchrun starts its ranks in sessions of their own: killing its process group alone leaves them training on.
    for pid in descendants(cut.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os.killpg(cut.pid, signal.SIGKILL)
    cut.wait(timeout=60)
    cut.stderr.close()
    wait_until_released(run_dir)
    if not checkpointed:  # --checkpoint-every 0: none is written before the end
        return 0
    done, _ = checkpoint_position(str(run_dir))  # the log can hold one step more: the kill can fall before its checkpoint
    assert after - 1 <= done < 6
    return done


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (its children, theirs, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, queue = [], [root]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def wait_until_released(run_dir, timeout: float = 60.0) -> None:
    """A killed rank can still be exiting when torchrun is reaped: while it holds the run folder's lock a resume
    (rightly) refuses the folder as being written."""
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                assert time.monotonic() < deadline, f"{run_dir} still held {timeout} s after the kill"
                time.sleep(0.05)
    finally:
        os.close(fd)  # drops the lock taken to test it


def run(ranks: int, args: list[str]) -> subprocess.CompletedProcess:
    result = subprocess.run(launch(ranks, args), cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def max_difference(a_path, b_path) -> float:
    a, b = load_file(a_path), load_file(b_path)
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_a_new_micro_batch_on_resume_goes_on_to_the_uninterrupted_weights(tmp_path):
    """Cut at micro-batch 4 by kill -9, resumed with --micro-batch 2 (a smaller card): one line names both splits,
    the steps after the cut run at 2 x 8, and the weights equal the uninterrupted run's to 1e-5 (SGD)."""
    CliRunner().invoke(main, [*STEPS, "--micro-batch", "4", "--out", str(tmp_path / "whole"), "--save-weights",
                              str(tmp_path / "whole.st")], catch_exceptions=False)
    done = killed_mid_run(1, [*STEPS, "--micro-batch", "4"], tmp_path / "cut")
    result = CliRunner().invoke(main, ["train", "--resume", str(tmp_path / "cut"), "--micro-batch", "2",
                                       "--save-weights", str(tmp_path / "resumed.st")])
    assert result.exit_code == 0, result.output
    assert ("resumed on a new split (micro batch changed): effective batch 16 = micro-batch 4 x 4 accumulation steps"
            in result.stderr), result.stderr
    with open(tmp_path / "cut" / "train_log.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["micro_batch"]) for r in rows] == [4] * done + [2] * (6 - done)
    assert max_difference(tmp_path / "whole.st", tmp_path / "resumed.st") <= 1e-5


def test_a_run_killed_before_its_first_checkpoint_is_trained_again_from_the_start_by_resume(tmp_path):
    """--checkpoint-every 0 (the default) writes none before the end: cut by kill -9 after 2 steps, --resume said "no
    checkpoint.pt in it" and the same command again "continue it with gaplan train --resume", a loop with no way
    out. Now --resume trains it again from the start: its log holds each step once, its weights are the
    uninterrupted run's to the bit, and train.json keeps both commands."""
    default = [*STEPS, "--checkpoint-every", "0", "--micro-batch", "4"]
    CliRunner().invoke(main, [*default, "--out", str(tmp_path / "whole"), "--save-weights", str(tmp_path / "whole.st")],
                       catch_exceptions=False)
    killed_mid_run(1, default, tmp_path / "cut", checkpointed=False)
    assert not (tmp_path / "cut" / "checkpoint.pt").exists() and logged_steps(tmp_path / "cut") >= 2
    (tmp_path / "cut" / ".checkpoint.pt.tmp.99999").write_bytes(b"")  # a first checkpoint's write the kill cut off
    assert CliRunner().invoke(main, ["report", str(tmp_path / "cut")]).exit_code == 0  # its report says it stopped
    assert (f"logged (steps 1 to {logged_steps(tmp_path / 'cut')}) of 6: the run stopped there (`gaplan train --resume "
            f"{tmp_path / 'cut'}` goes on)") in (tmp_path / "cut" / "report.md").read_text()
    again = CliRunner().invoke(main, [*default, "--out", str(tmp_path / "cut")])
    assert again.exit_code == 2 and "continue it with gaplan train --resume" in again.output, again.output
    result = CliRunner().invoke(main, ["train", "--resume", str(tmp_path / "cut"), "--save-weights",
                                       str(tmp_path / "resumed.st")])
    assert result.exit_code == 0, result.output
    assert (f"no checkpoint.pt in {tmp_path / 'cut'}: the run stopped before its first checkpoint (--checkpoint-every N "
            "keeps one every N steps); training it again from the start") in result.stderr, result.stderr
    assert logged_steps(tmp_path / "cut") == 6 and not (tmp_path / "cut" / ".checkpoint.pt.tmp.99999").exists()
    assert max_difference(tmp_path / "whole.st", tmp_path / "resumed.st") == 0
    commands = json.loads((tmp_path / "cut" / "train.json").read_text())["commands"]
    assert len(commands) == 2 and commands[1].endswith(f"--resume {tmp_path / 'cut'}"), commands
    assert CliRunner().invoke(main, ["train", "--resume", str(tmp_path / "nothing")]).exit_code == 2


def test_extending_a_run_goes_on_along_the_cosine_over_its_new_steps(tmp_path):
    """4 steps, then --resume --steps 8: steps 5-8 take the rate of an 8-step cosine at their step (as HF Trainer
    re-creates its scheduler for a new max_steps), said in one line; --steps below the steps done is one line."""
    args = ["train", "--seq-len", "16", "--effective-batch", "8", "--micro-batch", "4", "--optimizer", "sgd", "--lr",
            "0.1", "--threads", "1", "--device", "cpu", "--quiet"]
    run_dir = tmp_path / "run"
    assert CliRunner().invoke(main, [*args, "--steps", "4", "--out", str(run_dir)]).exit_code == 0
    result = CliRunner().invoke(main, ["train", "--resume", str(run_dir), "--steps", "8"])
    assert result.exit_code == 0, result.output
    assert "learning rate at step 5: 0.055 on this run's schedule (the checkpoint's schedule had 0.01)" in result.stderr
    with open(run_dir / "train_log.csv") as handle:
        rates = [float(row["lr"]) for row in csv.DictReader(handle)]
    cosine = [0.1 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / 8))) for step in range(4, 8)]
    assert rates[4:] == pytest.approx(cosine, rel=1e-12) and rates[4:] == sorted(rates[4:], reverse=True)
    before = (run_dir / "train_log.csv").read_bytes()
    result = CliRunner().invoke(main, ["train", "--resume", str(run_dir), "--steps", "6"])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--steps 6 is below the 8 steps the run has done" in lines[0], result.stderr
    assert (run_dir / "train_log.csv").read_bytes() == before
    # train.json holds the new length, so a plain --resume of the extended run (done) compares with 8, not 4.
    assert json.loads((run_dir / "train.json").read_text())["options"]["steps"] == 8
    # and the command lines that made the run as it is: its start, then the resume that extended it (the report said
    # the last resume's command alone, which reproduced nothing)
    commands = json.loads((run_dir / "train.json").read_text())["commands"]
    assert len(commands) == 2 and "--steps 4" in commands[0] and f"--steps 8 --resume {run_dir}" in commands[1]
    assert CliRunner().invoke(main, ["report", str(run_dir)]).exit_code == 0
    assert f"**Reproduce with:** `{commands[0]}`, then `{commands[1]}`" in (run_dir / "report.md").read_text()
    files = {name: (run_dir / name).read_bytes() for name in os.listdir(run_dir)}
    result = CliRunner().invoke(main, ["train", "--resume", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"nothing to train: the run in {run_dir} has done its 8 steps (--steps above 8 extends it)\n"
    assert {name: (run_dir / name).read_bytes() for name in os.listdir(run_dir)} == files  # nothing written again
    # What the run exports is still written from a finished run (as a disk that was full at the end asks for).
    weights = tmp_path / "w.safetensors"
    result = CliRunner().invoke(main, ["train", "--resume", str(run_dir), "--save-weights", str(weights), "--quiet"])
    assert result.exit_code == 0, result.output
    assert weights.stat().st_size > 0 and (run_dir / "train_log.csv").read_bytes() == files["train_log.csv"]
    assert result.stdout.splitlines() == [  # said, as the plain resume says it (it printed nothing)
        f"nothing to train: the run in {run_dir} has done its 8 steps (--steps above 8 extends it)",
        f"weights written to {weights}"]


class _RunsACommand:
    """What a hostile checkpoint.pt holds: unpickling it calls os.system."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_that_names_a_callable_is_refused_unread_and_every_checkpoint_loads_safely(tmp_path):
    run_dir = tmp_path / "run"
    args = ["train", "--seq-len", "16", "--effective-batch", "8", "--micro-batch", "2", "--steps", "2", "--threads",
            "1", "--device", "cpu", "--quiet", "--batch-schedule", "adaptive", "--out", str(run_dir)]
    assert CliRunner().invoke(main, args).exit_code == 0
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)  # with the schedule's and noise's states
    assert state["step"] == 2 and state["loop_state"]["schedule"] and state["loop_state"]["noise"]
    marker = tmp_path / "ran"
    refusals = ((2, "holds more than tensors, numbers, strings and plain containers, and is refused unread (it could "
                    "run code: Trying to load unsupported GLOBAL posix.system"),
                (pickle.HIGHEST_PROTOCOL, "the checkpoint cannot be read (not a torch checkpoint the safe unpickler "
                                          "reads: Unsupported operand"))  # the safe unpickler stops before the name
    for protocol, said in refusals:
        with open(run_dir / "checkpoint.pt", "wb") as handle:
            pickle.dump({"step": 2, "model": _RunsACommand(str(marker))}, handle, protocol=protocol)
        result = CliRunner().invoke(main, ["train", "--resume", str(run_dir), "--steps", "4"])
        assert result.exit_code == 2
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and said in lines[0] and not marker.exists(), lines


def test_a_new_rank_s_random_state_is_derived_from_the_seed_the_rank_and_the_step():
    seeds = {derived_rng_seed(0, rank, 5) for rank in range(4)}
    assert len(seeds) == 4 and derived_rng_seed(0, 1, 5) == derived_rng_seed(0, 1, 5)
    assert derived_rng_seed(0, 1, 5) != derived_rng_seed(1, 1, 5) != derived_rng_seed(0, 1, 6)
    assert derived_rng_seed(0, 0, 0) == int.from_bytes(
        __import__("hashlib").sha256(b"gaplan-rng:0:0:0").digest()[:8], "little")


# (ranks cut on, ranks resumed on, the cut run's options, the resume's): DDP both ways, FSDP both ways, and across
# layouts: a sharded checkpoint onto one process, a one-process checkpoint onto FSDP.
FSDP = ["--parallel", "fsdp"]
MATRIX = [(1, 2, [], []), (2, 1, [], []), (2, 4, [], []), (4, 2, [], []), (2, 4, FSDP, []), (4, 2, FSDP, []),
          (2, 1, FSDP, ["--parallel", "ddp"]), (1, 2, [], FSDP)]


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("cut_on,resumed_on,cut_with,resumed_with", MATRIX,
                         ids=lambda v: "-".join(v).replace("--parallel-", "") if isinstance(v, list) else str(v))
def test_a_run_cut_on_some_ranks_resumes_on_others_to_the_uninterrupted_weights(tmp_path, cut_on, resumed_on,
                                                                                 cut_with, resumed_with):
    """SGD, micro-batch 2, kill -9 after 2 steps, --resume (with the new layout where it changes) on the other number
    of ranks: the weights of the uninterrupted one-process run to 1e-5 (the loss is token-exact for any split)."""
    run(1, [*STEPS, "--micro-batch", "2", "--out", str(tmp_path / "whole"), "--save-weights",
            str(tmp_path / "whole.st")])
    killed_mid_run(cut_on, [*STEPS, "--micro-batch", "2", *cut_with], tmp_path / "cut")
    run(resumed_on, ["train", "--resume", str(tmp_path / "cut"), *resumed_with, "--quiet", "--save-weights",
                     str(tmp_path / "resumed.st")])
    assert logged_steps(tmp_path / "cut") == 6
    assert max_difference(tmp_path / "whole.st", tmp_path / "resumed.st") <= 1e-5


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("cut_on,resumed_on,resumed_with", [(2, 4, []), (1, 2, FSDP)], ids=["ddp-2-4", "1-fsdp-2"])
def test_with_adamw_a_resume_elsewhere_is_as_close_as_a_fresh_run_there(tmp_path, cut_on, resumed_on, resumed_with):
    """AdamW divides by the root of its second moment, which amplifies fp32 rounding: the resumed run is compared
    with the uninterrupted one-process run next to a fresh run of the whole on the new layout (same seed, same
    samples). From one process onto FSDP its moments go through distributed checkpoint's state-dict API by name."""
    adamw = [a if a != "sgd" else "adamw" for a in STEPS]
    adamw[adamw.index("--lr") + 1] = "0.001"
    run(1, [*adamw, "--micro-batch", "2", "--out", str(tmp_path / "whole"), "--save-weights", str(tmp_path / "whole.st")])
    run(resumed_on, [*adamw, "--micro-batch", "2", *resumed_with, "--out", str(tmp_path / "fresh"), "--save-weights",
                     str(tmp_path / "fresh.st")])
    killed_mid_run(cut_on, [*adamw, "--micro-batch", "2"], tmp_path / "cut")
    run(resumed_on, ["train", "--resume", str(tmp_path / "cut"), *resumed_with, "--quiet", "--save-weights",
                     str(tmp_path / "resumed.st")])
    fresh = max_difference(tmp_path / "whole.st", tmp_path / "fresh.st")
    resumed = max_difference(tmp_path / "whole.st", tmp_path / "resumed.st")
    assert resumed <= max(fresh, 1e-6), (resumed, fresh)


@pytest.mark.slow
def test_a_new_budget_without_a_micro_batch_re_plans_for_it(tmp_path):
    """Started with --micro-batch 4; resumed with another --memory-limit and no --micro-batch: the old card's size is
    dropped and the run probes (or reuses a cached probe) for the new budget, then says both splits."""
    run_dir = tmp_path / "run"
    args = ["train", "--seq-len", "16", "--effective-batch", "8", "--micro-batch", "4", "--threads", "1", "--device",
            "cpu", "--quiet", "--steps", "2", "--out", str(run_dir)]
    assert CliRunner().invoke(main, args).exit_code == 0
    result = CliRunner().invoke(main, ["train", "--resume", str(run_dir), "--steps", "3", "--memory-limit", "400MiB",
                                       "--threads", "1"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.stderr.splitlines() if x.startswith("resumed on a new split"))
    assert line.startswith("resumed on a new split (memory limit changed): effective batch 8 = micro-batch 4 x 2")
    with open(run_dir / "train_log.csv") as handle:
        rows = list(csv.DictReader(handle))
    new = int(line.split("->")[1].split("micro-batch ")[1].split(" ")[0])
    assert [int(r["micro_batch"]) for r in rows] == [4, 4, new]


LORA_RUN, PLAIN_RUN, TOKENS_RUN = (["--micro-batch", "2", "--lora", "--lora-r", "4"], ["--micro-batch", "2"],
                                  ["--batch-by", "tokens", "--token-budget", "32"])


@pytest.mark.parametrize("started, again, said", [
    # the run's own values, given again, are the run's: accepted, though what they depend on is not given again
    # (--lora-r without --lora said "--lora is off"; --token-budget without --batch-by "needs --batch-by tokens")
    (LORA_RUN, ["--lora-r", "4"], None),
    (TOKENS_RUN, ["--token-budget", "32"], None),
    (PLAIN_RUN, ["--lr", "0.001"], None),  # AdamW's default rate, which the run was started with, said
    # another value is a contradiction that names both, as the command line says them
    (LORA_RUN, ["--lora-r", "8"], "--lora-r 8 contradicts the run's 4"),
    (TOKENS_RUN, ["--token-budget", "64"], "--token-budget 64 contradicts the run's 32"),
    (PLAIN_RUN, ["--lora"], "--lora on contradicts the run's off"),
    (PLAIN_RUN, ["--lr", "0.002"], "--lr 0.002 contradicts the run's default (it was started without one)"),
    (PLAIN_RUN, ["--plan", "p.json"], "--plan p.json contradicts the run's default"),  # the flag, not --plan-file
])
def test_a_value_given_again_on_resume_is_checked_against_the_runs_own(tmp_path, started, again, said):
    run_dir = str(tmp_path / "run")
    args = ["train", "--seq-len", "16", "--effective-batch", "2", "--steps", "1", "--threads", "1", "--quiet",
            "--no-noise-scale"]
    assert CliRunner().invoke(main, [*args, *started, "--out", run_dir]).exit_code == 0
    result = CliRunner().invoke(main, ["train", "--resume", run_dir, *again])
    if said is None:
        assert result.exit_code == 0 and result.stdout.startswith("nothing to train"), result.output
    else:
        assert result.exit_code == 2 and result.stderr.startswith(f"gaplan: --resume {run_dir}: {said}"), result.output


def test_a_run_with_relative_paths_resumes_and_repeats_from_another_directory(tmp_path, monkeypatch):
    """--data data.txt was recorded as given: from another directory --resume said "cannot read it", --data by its
    absolute path "contradicts the run's data.txt", and --config DIR/config.toml failed the same way."""
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir()
    elsewhere.mkdir()
    (start / "data.txt").write_text("".join(f"line {i} of a small corpus of text\n" for i in range(40)))
    monkeypatch.chdir(start)
    first = ["train", "--seq-len", "16", "--effective-batch", "4", "--micro-batch", "2", "--steps", "1", "--threads",
             "1", "--optimizer", "sgd", "--quiet", "--data", "data.txt", "--tokenizer", "bytes", "--out", "run"]
    assert CliRunner().invoke(main, first).exit_code == 0
    assert 'data = "' + str(start / "data.txt") + '"' in (start / "run" / "config.toml").read_text()
    monkeypatch.chdir(elsewhere)
    resumed = CliRunner().invoke(main, ["train", "--resume", str(start / "run"), "--steps", "2"])
    assert resumed.exit_code == 0, resumed.output
    again = CliRunner().invoke(main, ["train", "--resume", str(start / "run"), "--steps", "3", "--data",
                                      str(start / "data.txt")])
    assert again.exit_code == 0, again.output
    repeated = CliRunner().invoke(main, ["train", "--config", str(start / "run" / "config.toml"), "--out", "copy"])
    assert repeated.exit_code == 0, repeated.output
