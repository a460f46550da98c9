"""``gaplan probe --parallel fsdp --world-size W``: bad input, and the edge is exact under torchrun on CPU.

Exactness: the probe's B* (every trial: 2 ranks in one gloo group, each under the budget) trains two optimizer
steps under ``torchrun --nproc-per-node 2 ... --enforce-memory-limit`` with the same per-rank budget, and B*+1
runs out of memory on some rank (under FSDP an out-of-memory rank stops the run with one line: its peers wait in
an all-gather, so no smaller retry is possible mid-step).
"""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from gaplan.cli.main import main

from ..conftest import REPO_ROOT, free_port

SMALL = ["--model", "tiny-gpt2", "--seq-len", "16", "--memory-limit", "256MiB", "--device", "cpu", "--threads", "1"]


BAD_INPUT = [
    ("probe", ["--parallel", "fsdp"], "FSDP shards over at least 2 ranks; give --world-size 2 or more (got 1)"),
    ("probe", ["--parallel", "fsdp", "--world-size", "1"], "FSDP shards over at least 2 ranks"),
    ("probe", ["--parallel", "fsdp", "--world-size", "2", "--effective-batch", "3"], "not divisible by the world size"),
    ("probe", ["--parallel", "fsdp", "--world-size", "2", "--report"], "gaplan bench --parallel fsdp --world-size W"),
    ("bench", ["--parallel", "fsdp"], "FSDP shards over at least 2 ranks"),
    ("bench", ["--world-size", "2"], "--world-size applies to --parallel fsdp here"),
    ("bench", ["--parallel", "fsdp", "--world-size", "2", "--effective-batch", "3"], "not divisible by the world size"),
]


@pytest.mark.parametrize("command, args, message", BAD_INPUT)
def test_bad_input_is_one_line_exit_2(tmp_path, command, args, message):
    result = CliRunner().invoke(main, [command, *SMALL, "--quiet", *args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gaplan: ") and message in lines[0], result.stderr
    assert not (tmp_path / "out").exists(), "nothing may be written on bad input"


def _torchrun_train(micro_batch: int, out, port: int) -> subprocess.CompletedProcess:
    # Per-rank sizes [B, B]: two micro-steps of B, as the probe's trials.
    args = ["train", *SMALL, "--parallel", "fsdp", "--micro-batch", str(micro_batch),
            "--effective-batch", str(4 * micro_batch), "--steps", "2", "--enforce-memory-limit", "--json", "--quiet",
            "--out", str(out)]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")  # as the probe's worker: a sharp, repeatable edge
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", str(port), "-m", "gaplan", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_the_fsdp_edge_is_exact_under_torchrun(tmp_path):
    """The probed edge holds under torchrun up to the address layout, as in one process (test_probe.py): on CPU one
    sample's fit depends on where the mappings land (a CI run probed 58 and a torchrun at 58 ran out of memory at
    step 2; other runs probed 57 and trained it). So B*-1 trains two optimizer steps and B*+2 runs out of memory."""
    probed = CliRunner().invoke(main, ["probe", *SMALL, "--parallel", "fsdp", "--world-size", "2", "--json", "--quiet",
                                       "--out", str(tmp_path / "probe")], catch_exceptions=False)
    assert probed.exit_code == 0, probed.output
    data = json.loads(probed.stdout)
    edge = data["max_micro_batch"]
    outcomes = {t["micro_batch"]: t["fits"] for t in data["trials"]}
    assert outcomes[edge] is True and outcomes[edge + 1] is False, outcomes
    # The record says what was probed: the layout (in the workload), the world size, the ranks of every trial.
    record = json.loads((tmp_path / "probe" / "plan.json").read_text())
    assert record["workload"]["parallel"] == "fsdp" and record["world_size"] == 2 and record["trial_ranks"] == 2
    assert record["plan"]["world_size"] == 2
    print(f"FSDP W=2 probe: B* = {edge} in {len(data['trials'])} trials, {data['wall_seconds']:.0f} s")

    fits = _torchrun_train(edge - 1, tmp_path / "fits", free_port())
    assert fits.returncode == 0, fits.stderr[-3000:]
    summary = json.loads(fits.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["plan"]["micro_batch"] == edge - 1 and summary["plan"]["world_size"] == 2

    over = _torchrun_train(edge + 2, tmp_path / "over", free_port())
    assert over.returncode != 0, "B*+2 must run out of memory on some rank"
    assert "ran out of memory at step" in over.stderr and f"at micro-batch {edge + 2} under FSDP" in over.stderr, \
        over.stderr[-3000:]
