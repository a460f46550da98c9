"""README claims about ``gaplan probe`` on the command line, each checked where it can fail.

``--seed-from-estimate`` (two real trials), ``--emit hf``, ``--margin``, the trial table printed
once in a terminal, no leaked warnings with gradient checkpointing, and a CPU budget above the
machine's available memory refused in one line.
"""

import json
import os
import pty
import re
import subprocess
import sys
import time
import warnings
from collections import Counter

import pytest
from click.testing import CliRunner

from gaplan.cli.main import main
from gaplan.core.checkpointing import parse_checkpointing

from ..conftest import REPO_ROOT, SMALL_BUDGET

SMALL = ["--model", "tiny-gpt2", "--seq-len", "16", "--memory-limit", "256MiB", "--device", "cpu", "--threads", "1"]
# A capped search (E=3: no micro-batch above 3 is of use) that climbs from 1, not from the estimate's edge (which
# would try 3 alone): trials 1, 2, 3; quick, for claims about output.
CAPPED = [*SMALL, "--effective-batch", "3", "--optimizer", "sgd", "--no-seed-from-estimate"]
TRIAL_LINE = re.compile(r"^\s*micro-batch\s+(\d+)\s+(fits|OOM)\s+peak", re.MULTILINE)


def probe_json(*args: str) -> dict:
    result = CliRunner().invoke(main, ["probe", *args, "--json", "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.heavy
@pytest.mark.slow
def test_seed_from_estimate_needs_two_real_trials_on_the_default_workload(tmp_path):
    """README: on the default workload the estimate predicts the edge and the probe needs two real trials."""
    data = probe_json("--device", "cpu", "--seed-from-estimate", "--out", str(tmp_path / "seeded"))
    edge = data["max_micro_batch"]
    assert data["estimate_seed"] in (edge, edge + 1), data["estimate_seed"]
    assert data["trial_count"] == len(data["trials"]) == 2, [(t["micro_batch"], t["fits"]) for t in data["trials"]]
    # The two trials are the proof of exactness: B* trains two optimizer steps, B*+1 runs out of memory.
    outcomes = {t["micro_batch"]: t["fits"] for t in data["trials"]}
    assert outcomes == {edge: True, edge + 1: False}
    assert data["plan"]["micro_batch"] <= edge and sum(data["plan"]["micro_batch_sizes"]) == 256


@pytest.mark.heavy
@pytest.mark.slow
def test_seed_from_estimate_finds_the_plain_probes_edge(tmp_path, small_probe):
    """Seeded on the small workload, the CLI's answer is the plain search's B*, in no more trials.

    On this workload (seq 16, 256 MiB) the CPU estimate predicts 49 where 40 is the edge, so the
    seeded search walks down from 49: 8 trials here, not the README's two (which are measured on
    the default workload, above).
    """
    data = probe_json(*SMALL, "--search-cap", "4096", "--seed-from-estimate", "--out", str(tmp_path / "seeded"))
    # Two probes in fresh processes agree to one sample (heap layout moves the edge by one at most).
    assert abs(data["max_micro_batch"] - small_probe.max_micro_batch) <= 1
    assert data["estimate_seed"] is not None
    assert data["trial_count"] <= len(small_probe.trials), data["trial_count"]


@pytest.mark.heavy
@pytest.mark.slow
def test_emit_hf_prints_the_plans_training_arguments(tmp_path):
    """``--emit hf``: per_device_train_batch_size and gradient_accumulation_steps of the plan (2 x 3 for E=6, cap 2)."""
    args = [*SMALL, "--effective-batch", "6", "--search-cap", "2", "--optimizer", "sgd", "--emit", "hf"]
    data = probe_json(*args, "--out", str(tmp_path / "json"))
    plan = data["plan"]
    assert (plan["micro_batch"], plan["grad_accum_steps"]) == (2, 3), plan
    snippet = data["hf_snippet"]
    assert "per_device_train_batch_size=2," in snippet and "gradient_accumulation_steps=3," in snippet, snippet
    compile(snippet, "<hf_snippet>", "exec")  # code to paste: it must at least parse

    table = CliRunner().invoke(main, ["probe", *args, "--quiet", "--out", str(tmp_path / "table")])
    assert table.exit_code == 0, table.output
    assert "per_device_train_batch_size=2," in table.stdout and "gradient_accumulation_steps=3," in table.stdout
    assert table.stdout.index("largest micro-batch that fits") < table.stdout.index("per_device_train_batch_size")


@pytest.mark.heavy
@pytest.mark.slow
def test_margin_keeps_its_share_of_the_budget_free(tmp_path, small_probe):
    """``--margin 0.2``: trials run under 80% of the budget, B* is smaller, and no fitted peak enters the margin."""
    data = probe_json(*SMALL, "--search-cap", "4096", "--margin", "0.2", "--out", str(tmp_path / "margin"))
    assert data["margin"] == 0.2
    assert data["memory_limit_bytes"] == SMALL_BUDGET
    assert data["probe_limit_bytes"] == int(0.8 * SMALL_BUDGET)
    assert data["max_micro_batch"] < small_probe.max_micro_batch
    fitted = [t for t in data["trials"] if t["fits"]]
    assert fitted and all(t["peak_bytes"] <= data["probe_limit_bytes"] for t in fitted), fitted
    outcomes = {t["micro_batch"]: t["fits"] for t in data["trials"]}
    assert outcomes[data["max_micro_batch"]] is True and outcomes[data["max_micro_batch"] + 1] is False
    saved = json.loads((tmp_path / "margin" / "plan.json").read_text())
    assert saved["margin"] == 0.2 and saved["probe_limit_bytes"] == data["probe_limit_bytes"]


def _run_in_terminal(args: list[str], timeout: float = 240) -> str:
    """Run ``python -m gaplan ARGS`` with stdout and stderr on one pseudo-terminal; everything it printed."""
    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "gaplan", *args], cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                               stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the process closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
    assert process.wait(timeout=30) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def _trial_counts(text: str) -> dict[int, int]:
    counts: dict[int, int] = {}
    for match in TRIAL_LINE.finditer(text):
        counts[int(match.group(1))] = counts.get(int(match.group(1)), 0) + 1
    return counts


@pytest.mark.heavy
@pytest.mark.slow
def test_trial_table_prints_once_in_a_terminal_and_once_on_a_pipe(tmp_path):
    terminal = _run_in_terminal(["probe", *CAPPED, "--out", str(tmp_path / "tty")])
    plan = json.loads((tmp_path / "tty" / "plan.json").read_text())
    tried = [t["micro_batch"] for t in plan["trials"]]
    assert len(tried) >= 2
    assert _trial_counts(terminal) == Counter(tried), terminal  # every trial once (a sketched size, measured
    # again in full at the cap, twice)

    piped = subprocess.run([sys.executable, "-m", "gaplan", "probe", *CAPPED, "--out", str(tmp_path / "pipe")],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert piped.returncode == 0, piped.stderr
    tried = [t["micro_batch"] for t in json.loads((tmp_path / "pipe" / "plan.json").read_text())["trials"]]
    assert _trial_counts(piped.stdout) == Counter(tried), piped.stdout


def _saved_activation_bytes(grad_checkpointing: bool) -> tuple[int, object]:
    """Bytes autograd saves for backward in one forward of micro-batch 4 (then backward), and the model."""
    import torch

    from gaplan.workload.build import build_workload
    from gaplan.workload.spec import WorkloadSpec

    spec = WorkloadSpec(model="tiny-gpt2", seq_len=16, grad_checkpointing=parse_checkpointing(grad_checkpointing))
    workload = build_workload(spec,
                              "cpu")
    batch = workload.make_batch(4)
    saved = 0

    def pack(tensor):
        nonlocal saved
        saved += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = workload.raw_loss(workload.model, batch)
    loss.backward()
    assert all(p.grad is not None for p in workload.model.parameters() if p.requires_grad)
    return saved, workload.model


@pytest.mark.slow
def test_gradient_checkpointing_builds_a_checkpointed_model_without_warnings():
    """No FutureWarning/UserWarning reaches the user, and the model really recomputes its layers in backward."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checkpointed, model = _saved_activation_bytes(True)
        plain, _ = _saved_activation_bytes(False)
        flag = getattr(model, "is_activation_checkpointing", None)
    assert flag is True
    # Checkpointed layers keep only their inputs: far less is saved for backward than without.
    assert checkpointed < 0.6 * plain, (checkpointed, plain)


def test_a_budget_above_the_available_memory_is_refused(tmp_path):
    out = tmp_path / "x"
    result = CliRunner().invoke(main, ["probe", "--device", "cpu", "--memory-limit", "100TB", "--quiet",
                                       "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gaplan: ") and "available memory" in lines[0], result.stderr
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), result.exception
    assert not out.exists()
