"""FSDP2 training under torchrun on CPU (gloo): the sharded run trains the same weights as one process."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from gaplan.cli.main import main

from ..conftest import REPO_ROOT, free_port
from ..tolerances import assert_close_at_scale, relative_difference

# 30 samples over 2 ranks: 15 each, in micro-batches of 4, 4, 4 and 3 (uneven); SyntheticCorpus pads varied lengths.
FSDP_STEPS = ["train", "--seq-len", "32", "--effective-batch", "30", "--steps", "2", "--seed", "0", "--threads", "1",
              "--quiet"]


def torchrun(*args: str, port: int, timeout: int = 300, restarts: int = 0) -> subprocess.CompletedProcess:
    runner = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    assert runner, "torchrun comes with torch"
    # A restart re-forms the process group only with the c10d rendezvous and a store of the ranks' own: the
    # shared or static store hands restarted ranks the dead ranks' addresses (gloo: "connectFullMesh failed").
    rendezvous = (["--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--max-restarts", str(restarts)]
                  if restarts else ["--master-port", str(port)])
    env = dict(os.environ, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1") if restarts else None
    return subprocess.run([runner, "--nproc-per-node", "2", *rendezvous, "-m", "gaplan", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def one_process(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result


def fsdp_against_one_process(tmp_path, extra: list[str], port: int, sharded_only: tuple[str, ...] = ()) -> dict:
    """Train 2 steps FSDP over 2 ranks at micro-batch 4, and in one process at micro-batch 30; the weights' differences."""
    sharded = torchrun(*FSDP_STEPS, *extra, *sharded_only, "--parallel", "fsdp", "--micro-batch", "4",
                       "--out", str(tmp_path / "fsdp"), "--save-weights", str(tmp_path / "fsdp.st"), port=port)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    one_process(*FSDP_STEPS, *extra, "--micro-batch", "30", "--out", str(tmp_path / "one"),
                "--save-weights", str(tmp_path / "one.st"))
    a, b = load_file(tmp_path / "fsdp.st"), load_file(tmp_path / "one.st")
    assert a.keys() == b.keys()
    return {key: relative_difference(a[key], b[key]) for key in a}


@pytest.mark.slow
@pytest.mark.distributed
def test_two_fsdp_ranks_equal_one_process_with_sgd(tmp_path):
    sharded = torchrun(*FSDP_STEPS, "--optimizer", "sgd", "--lr", "0.1", "--parallel", "fsdp", "--micro-batch", "4",
                       "--out", str(tmp_path / "fsdp"), "--save-weights", str(tmp_path / "fsdp.st"), "--json",
                       port=free_port())
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    summary = json.loads(sharded.stdout.strip().splitlines()[-1])
    assert summary["plan"]["world_size"] == 2 and summary["plan"]["micro_batch_sizes"] == [4, 4, 4, 3], summary
    one_process(*FSDP_STEPS, "--optimizer", "sgd", "--lr", "0.1", "--micro-batch", "30", "--out", str(tmp_path / "one"),
                "--save-weights", str(tmp_path / "one.st"))
    a, b = load_file(tmp_path / "fsdp.st"), load_file(tmp_path / "one.st")
    assert a.keys() == b.keys()
    for key in a:
        assert_close_at_scale(a[key], b[key], msg=key)


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("extra, sharded_only, rtol", [
    # AdamW divides by sqrt(v): a gradient element near 0 is mostly fp32 reduction-order noise, and its update is
    # still ~lr, so the noise (1e-7 of the gradient) reaches the weights as ~1e-4 of their scale (measured 2.3e-4).
    # tiny-llama: GPT-2's key bias has a gradient exactly 0 in theory (softmax ignores a constant): all noise.
    (["--model", "tiny-llama", "--optimizer", "adamw", "--lr", "1e-3"], (), 1e-3),
    # torch's AdamW by its fused kernel and one parameter at a time: FSDP2's DTensor shards take both.
    (["--model", "tiny-llama", "--optimizer", "adamw-fused", "--lr", "1e-3"], (), 1e-3),
    (["--model", "tiny-llama", "--optimizer", "adamw-forloop", "--lr", "1e-3"], (), 1e-3),
    (["--optimizer", "sgd", "--lr", "0.1", "--grad-checkpointing", "on"], (), 1e-5),
    (["--optimizer", "sgd", "--lr", "0.1"], ("--grad-sync", "every"), 1e-5),
    # bf16: FSDP computes with bf16 copies of the weights (MixedPrecisionPolicy), one process with bf16 autocast
    # (which keeps layer norms in fp32): the same arithmetic only up to bf16 rounding (8 bits of mantissa).
    (["--optimizer", "sgd", "--lr", "0.1", "--dtype", "bf16"], (), 2e-2),
], ids=["adamw", "adamw-fused", "adamw-forloop", "checkpointing", "sync-every", "bf16"])
def test_two_fsdp_ranks_equal_one_process(tmp_path, extra, sharded_only, rtol):
    differences = fsdp_against_one_process(tmp_path, extra, port=free_port(), sharded_only=sharded_only)
    worst = max(differences, key=differences.get)
    assert differences[worst] < rtol, (worst, differences[worst])


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_sigterm_under_fsdp_checkpoints_shards_and_resume_is_bitwise(tmp_path):
    """SIGTERM to torchrun: both ranks stop at one step boundary, write their shards (distributed checkpoint) and
    exit 130; --resume loads the shards and ends bitwise equal to an uninterrupted run."""
    common = ["train", "--seq-len", "32", "--effective-batch", "30", "--steps", "6", "--seed", "0", "--threads", "1",
              "--quiet", "--optimizer", "adamw", "--parallel", "fsdp", "--micro-batch", "4", "--checkpoint-every", "1"]
    whole = torchrun(*common, "--out", str(tmp_path / "whole"), "--save-weights", str(tmp_path / "whole.st"),
                     port=free_port())
    assert whole.returncode == 0, whole.stderr[-3000:]
    runner = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    cut_dir = tmp_path / "cut"
    cut = subprocess.Popen([runner, "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "gaplan", *common,
                            "--out", str(cut_dir)], cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
    log = cut_dir / "train_log.csv"
    deadline = time.monotonic() + 240
    while (not log.exists() or len(log.read_text().splitlines()) < 3) and cut.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cut.poll() is None, "the run finished before it could be interrupted"
    cut.send_signal(signal.SIGTERM)
    _, stderr = cut.communicate(timeout=120)
    done = len(log.read_text().splitlines()) - 1
    assert 2 <= done < 6, stderr[-3000:]
    shards = [p.name for p in cut_dir.iterdir() if "checkpoint-shards" in p.name]
    assert shards == [f"checkpoint-shards-step{done:08d}"], (shards, stderr[-3000:])
    resumed = torchrun("train", "--resume", str(cut_dir), "--quiet", "--save-weights", str(tmp_path / "resumed.st"),
                       port=free_port())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = load_file(tmp_path / "whole.st"), load_file(tmp_path / "resumed.st")
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed sharded run differs from the uninterrupted one"


@pytest.mark.slow
def test_fsdp_without_torchrun_is_one_line(tmp_path):
    out = tmp_path / "never"
    result = CliRunner().invoke(main, ["train", "--parallel", "fsdp", "--micro-batch", "2", "--effective-batch", "4",
                                       "--steps", "1", "--seq-len", "16", "--quiet", "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "torchrun --nproc-per-node N" in lines[0], result.stderr
    assert not out.exists()


def test_cpu_offload_and_grad_sync_need_fsdp(tmp_path):
    for args, message in ((["--cpu-offload"], "--cpu-offload needs --parallel fsdp"),
                          (["--grad-sync", "every"], "--grad-sync every needs --parallel fsdp")):
        result = CliRunner().invoke(main, ["train", *args, "--quiet", "--out", str(tmp_path / "never")])
        assert result.exit_code == 2, result.output
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "never").exists()


@pytest.mark.slow
@pytest.mark.parametrize("command", [["train", "--device", "cpu"], ["probe", "--world-size", "2"]],
                         ids=["train-cpu", "probe-auto"])
def test_cpu_offload_on_a_cpu_run_is_one_line(tmp_path, command):
    """Offloading moves shards off a GPU: on the CPU there is nothing to move (torch's CPUOffloadPolicy would fail
    with "Cannot access accelerator device"). The probe resolves --device auto in its worker and says the same."""
    result = CliRunner().invoke(main, [*command, "--parallel", "fsdp", "--cpu-offload", "--quiet",
                                       "--out", str(tmp_path / "never")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "on --device cpu they are on the CPU already" in lines[0], result.stderr
    assert not (tmp_path / "never").exists()


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_an_oom_under_fsdp_stops_every_rank_with_one_line_instead_of_hanging(tmp_path):
    """A real OOM (the CPU budget enforced) inside a sharded step: the failing rank says why, torchrun stops the
    other, which would otherwise wait in the all-gather forever."""
    result = torchrun("train", "--seq-len", "64", "--effective-batch", "512", "--micro-batch", "256", "--steps", "1",
                      "--optimizer", "sgd", "--threads", "1", "--parallel", "fsdp", "--memory-limit", "200MiB",
                      "--enforce-memory-limit", "--quiet", "--out", str(tmp_path / "oom"), port=free_port(), timeout=240)
    assert result.returncode != 0
    assert "ran out of memory at step 1" in result.stderr and "under FSDP" in result.stderr, result.stderr[-3000:]


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_an_oom_under_fsdp_with_a_torchrun_restart_is_redone_at_half_the_micro_batch(tmp_path):
    """--max-restarts 1: the rank that runs out of memory at micro-batch 96 (B* is about 57 at 256 MiB) leaves 48
    for the restarted ranks, which train the same steps at 48; the weights equal a run at 48 from the start."""
    common = ["train", "--seq-len", "16", "--effective-batch", "192", "--steps", "2", "--optimizer", "sgd",
              "--threads", "1", "--parallel", "fsdp", "--memory-limit", "256MiB", "--enforce-memory-limit", "--json"]
    restarted = torchrun(*common, "--micro-batch", "96", "--out", str(tmp_path / "restarted"),
                         "--save-weights", str(tmp_path / "restarted.st"), port=free_port(), timeout=400, restarts=1)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert "ran out of memory at step 1" in restarted.stderr and "restarted by torchrun" in restarted.stderr
    summary = json.loads(restarted.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["plan"]["micro_batch"] == 48, summary["plan"]
    fallbacks = summary["oom_fallbacks"]  # one per rank that ran out of memory (both may, in the same forward)
    assert 1 <= len(fallbacks) <= 2 and all("redone with micro-batch 48 x 2" in line for line in fallbacks), fallbacks
    assert not list((tmp_path / "restarted").glob("oom-restart.rank*.json")), "the markers are removed"
    direct = torchrun(*common, "--micro-batch", "48", "--out", str(tmp_path / "direct"),
                      "--save-weights", str(tmp_path / "direct.st"), port=free_port())
    assert direct.returncode == 0, direct.stderr[-3000:]
    a, b = load_file(tmp_path / "restarted.st"), load_file(tmp_path / "direct.st")
    assert all(torch.equal(a[k], b[k]) for k in a), "the restarted run trained other weights"


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_without_a_restart_the_oom_under_fsdp_says_how_to_get_one(tmp_path):
    result = torchrun("train", "--seq-len", "16", "--effective-batch", "192", "--micro-batch", "96", "--steps", "1",
                      "--optimizer", "sgd", "--threads", "1", "--parallel", "fsdp", "--memory-limit", "256MiB",
                      "--enforce-memory-limit", "--quiet", "--out", str(tmp_path / "oom"), port=free_port())
    assert result.returncode != 0
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --rdzv-backend c10d" in result.stderr, result.stderr[-3000:]
    assert not list((tmp_path / "oom").glob("oom-restart.rank*.json")), "no marker without a restart to read it"
