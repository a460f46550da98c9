"""README claims about ``gaplan train`` on the command line, each checked where it can fail.

The learning rate given is kept (and the per-optimizer default), 10 steps by default, an absurd
effective batch refused fast, ``--data`` trains exactly the lines given, ``--warmup-steps``, the
plan.json of a ``--micro-batch`` run, and torchrun without ``--micro-batch``.
"""

import csv
import json
import math
import os
import resource
import signal
import subprocess
import sys
import time

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from gaplan.cli.main import main
from gaplan.data import TextCorpus, step_indices

from ..conftest import REPO_ROOT, SMALL_BUDGET, free_port
from ..tolerances import assert_close_at_scale

TINY = ["--seq-len", "16", "--quiet"]


def train(*args: str):
    result = CliRunner().invoke(main, ["train", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def log_rows(run_dir) -> list[dict]:
    with open(run_dir / "train_log.csv", newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, lr, expected", [
    ("adamw", "1e-4", 1e-4),  # the AdamW default is 1e-3: an explicit 1e-4 must not be taken for "not given"
    ("adamw", None, 1e-3),
    ("sgd", None, 1e-4),
])
def test_the_learning_rate_given_is_kept_and_the_default_is_per_optimizer(tmp_path, optimizer, lr, expected):
    out = tmp_path / "run"
    train("--micro-batch", "4", "--effective-batch", "8", "--steps", "1", "--optimizer", optimizer,
          *(["--lr", lr] if lr else []), *TINY, "--out", str(out))
    rows = log_rows(out)
    assert len(rows) == 1 and float(rows[0]["lr"]) == pytest.approx(expected, rel=1e-9)
    assert json.loads((out / "plan.json").read_text())["workload"]["optimizer"] == optimizer


@pytest.mark.slow
def test_train_runs_ten_steps_by_default(tmp_path):
    out = tmp_path / "run"
    result = train("--micro-batch", "4", "--effective-batch", "4", "--optimizer", "sgd", *TINY, "--json",
                   "--out", str(out))
    assert json.loads(result.stdout)["steps"] == 10
    assert [int(row["step"]) for row in log_rows(out)] == list(range(1, 11))


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))  # a regression fails here, not in the OOM killer


def test_an_absurd_effective_batch_is_refused_in_one_line_fast(tmp_path):
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "gaplan", "train", "--effective-batch", "1000000000000",
                             "--micro-batch", "4", *TINY, "--out", str(tmp_path / "run")], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=60, preexec_fn=_limit_memory)
    seconds = time.monotonic() - started
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gaplan: ") and "accumulation steps" in lines[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert seconds < 30, seconds


LINES = ["alpha beta", "the quick brown fox", "jumps over", "the lazy dog!", "zebra 42", "ünïcode line"]


def _tiny_gpt2_dir(path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=300, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
               attn_pdrop=0.0).save_pretrained(path)
    assert not any(name.startswith(("tokenizer", "vocab", "merges")) for name in os.listdir(path))
    return str(path)


def _one_sgd_step_by_hand(model_dir: str, lines: list[str], lr: float) -> dict[str, torch.Tensor]:
    """The weights after one SGD step on all ``lines`` as one batch: byte tokens + 1, mean over target tokens.

    Built independently of gaplan's data path; only the initial weights come from gaplan's builder.
    """
    from gaplan.workload.build import build_workload
    from gaplan.workload.spec import WorkloadSpec

    model = build_workload(WorkloadSpec(model=model_dir, seq_len=32, optimizer="sgd", lr=lr), "cpu", seed=0).model
    ids = [[1 + b for b in line.encode("utf-8")] for line in lines]
    longest = max(map(len, ids))
    input_ids = torch.tensor([row + [0] * (longest - len(row)) for row in ids])
    mask = (torch.arange(longest)[None, :] < torch.tensor([len(row) for row in ids])[:, None]).long()
    logits = model(input_ids=input_ids, attention_mask=mask).logits
    targets = input_ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                             targets.reshape(-1), ignore_index=-100, reduction="sum")
    (loss / (targets != -100).sum()).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_data_text_and_jsonl_train_exactly_the_lines_given(tmp_path):
    model_dir = _tiny_gpt2_dir(tmp_path / "model")
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("".join(json.dumps({"text": line, "id": n}) + "\n" for n, line in enumerate(LINES)),
                     encoding="utf-8")

    # Step 0 of an effective batch of len(LINES) samples is every line once, byte-tokenized (ids - 1 = bytes).
    corpora = [TextCorpus(str(path), 32, 300, model_dir) for path in (text, jsonl)]
    for corpus in corpora:
        assert len(corpus) == len(LINES) and corpus.tokenizer.startswith("bytes")
        step0 = [corpus[i] for i in step_indices(0, len(LINES), len(corpus))]
        assert sorted(bytes(t - 1 for t in s.ids).decode("utf-8") for s in step0) == sorted(LINES)
    assert corpora[0].samples == corpora[1].samples

    weights = {}
    for name, path in (("text", text), ("jsonl", jsonl)):
        train("--model", model_dir, "--data", str(path), "--tokenizer", "bytes", "--micro-batch", "2",
              "--effective-batch", str(len(LINES)),
              "--steps", "1", "--optimizer", "sgd", "--lr", "0.5", "--seq-len", "32", "--quiet",
              "--out", str(tmp_path / name), "--save-weights", str(tmp_path / f"{name}.st"))
        weights[name] = load_file(tmp_path / f"{name}.st")
    assert all(torch.equal(weights["text"][k], weights["jsonl"][k]) for k in weights["text"])
    # The trained step equals one SGD step on exactly these lines, computed by hand as one batch.
    expected = _one_sgd_step_by_hand(model_dir, LINES, 0.5)
    for key, value in weights["text"].items():
        assert_close_at_scale(value, expected[key], msg=key)
    # ... and not a step on the lines less one: the check can tell the data apart.
    fewer = _one_sgd_step_by_hand(model_dir, LINES[:-1], 0.5)
    assert any((weights["text"][k] - fewer[k]).abs().max() > 1e-4 * fewer[k].abs().max() for k in fewer)


def test_a_broken_tokenizer_is_an_error_not_a_fallback_to_bytes(tmp_path):
    model_dir = _tiny_gpt2_dir(tmp_path / "model")
    (tmp_path / "model" / "tokenizer.json").write_text("{}")
    data = tmp_path / "corpus.txt"
    data.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["train", "--model", model_dir, "--data", str(data), "--micro-batch", "2",
                                       "--effective-batch", "2", "--steps", "1", "--seq-len", "32", "--quiet",
                                       "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "tokenizer" in lines[0] and "cannot be loaded" in lines[0], result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "run" / "train_log.csv").exists()


@pytest.mark.slow
def test_warmup_steps_raise_the_learning_rate_then_it_decays(tmp_path):
    out = tmp_path / "run"
    train("--micro-batch", "4", "--effective-batch", "4", "--optimizer", "sgd", "--lr", "0.1", "--warmup-steps", "2",
          "--steps", "4", *TINY, "--out", str(out))
    lrs = [float(row["lr"]) for row in log_rows(out)]
    # Linear warm-up over 2 steps (0.1 * 1/2, 0.1 * 2/2), then cosine from 0.1 down towards 10% of it.
    cosine_half = 0.1 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lrs == pytest.approx([0.05, 0.1, 0.1, cosine_half], rel=1e-9)


@pytest.mark.slow
def test_a_micro_batch_plan_records_what_is_known_and_reports_no_probe(tmp_path):
    out = tmp_path / "run"
    train("--micro-batch", "4", "--effective-batch", "8", "--steps", "1", "--optimizer", "sgd", *TINY,
          "--out", str(out))
    plan = json.loads((out / "plan.json").read_text())
    assert plan["probed"] is False and plan["trials"] == []
    assert 5.0e6 < plan["param_count"] < 6.0e6  # tiny-gpt2: 5.5M parameters, counted from the built model
    assert plan["task"] == "causal-lm" and plan["seq_len"] == 16
    assert plan["memory_limit_bytes"] is None
    assert (plan["plan"]["micro_batch"], plan["plan"]["grad_accum_steps"]) == (4, 2)

    report = CliRunner().invoke(main, ["report", str(out)])
    assert report.exit_code == 0, report.output
    text = (out / "report.md").read_text()
    assert "No probe ran" in text
    assert " 0 B" not in text and "Task: ?" not in text and "unknown parameters" not in text, text
    # Rebuilt from the options given, not from sys.argv (pytest's here); the default rate said as such.
    assert f"`gaplan train --seq-len 16 --optimizer sgd --effective-batch 8 --micro-batch 4 --steps 1 --out {out} --quiet`" \
        in text, text
    assert "optimizer sgd (lr 0.0001, the optimizer's default)" in text


TORCHRUN_TRAIN = ["train", "--seq-len", "16", "--memory-limit", "256MiB", "--device", "cpu", "--effective-batch", "8",
                  "--steps", "1", "--optimizer", "sgd", "--threads", "1", "--json", "--quiet"]


def _torchrun(args: list[str], cache_dir, port: int, timeout: float = 500) -> subprocess.CompletedProcess:
    env = dict(os.environ, GAPLAN_CACHE_DIR=str(cache_dir))
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", str(port), *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _summary(stdout: str) -> dict:
    objects = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert len(objects) == 1, stdout  # rank 0 alone prints the summary
    return objects[0]


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_without_micro_batch_probes_and_trains(tmp_path):
    """One probe per node: the node's first process probes (no micro-batch above E/W = 4 is of use), the other
    waits; both train the plan; the probe is cached once."""
    out = tmp_path / "ddp"
    done = _torchrun(["-m", "gaplan", *TORCHRUN_TRAIN, "--out", str(out)], tmp_path / "cache", free_port())
    assert done.returncode == 0, done.stderr[-4000:]
    summary = _summary(done.stdout)
    plan = summary["plan"]
    assert summary["steps"] == 1
    assert plan["world_size"] == 2 and plan["effective_batch"] == 8
    assert plan["micro_batch"] * plan["grad_accum_steps"] * 2 == 8
    record = json.loads((out / "plan.json").read_text())
    assert record["probed"] is True and record["trials"], "the run's plan.json must come from a real probe"
    assert plan["micro_batch"] <= record["max_micro_batch"] <= 4
    cached = list((tmp_path / "cache" / "plans").glob("*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["max_micro_batch"] == record["max_micro_batch"]


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_nodes_plan_with_the_smallest_b_star(tmp_path, monkeypatch):
    """Two nodes (two torchrun launches of one process each, on this machine): node 0 probes for real (B* 4 under
    the cap), node 1 finds its own cached B* of 2; every rank trains with the smaller, 2."""
    from gaplan.core.trial import Trial
    from gaplan.plan.split import make_plan
    from gaplan.probing.cache import plan_cache_path
    from gaplan.runs.probe_result import ProbeResult, save_probe
    from gaplan.workload.spec import WorkloadSpec

    spec = WorkloadSpec(model="tiny-gpt2", seq_len=16, optimizer="sgd")
    node1 = tmp_path / "cache1"
    monkeypatch.setenv("GAPLAN_CACHE_DIR", str(node1))
    path = plan_cache_path(spec, "cpu", SMALL_BUDGET, 1, ddp=True)  # what node 1 looks up (`--threads 1`, DDP)
    monkeypatch.delenv("GAPLAN_CACHE_DIR")
    two = ProbeResult(workload=spec, device="cpu", memory_limit_bytes=SMALL_BUDGET, margin=0.0,
                      probe_limit_bytes=SMALL_BUDGET, budget_is_default=False, max_micro_batch=2, capped=False,
                      trials=[Trial(2, True, 100 * 2**20), Trial(3, False)], plan=make_plan(8, 2, 2),
                      param_count=5_500_000, static_bytes=84 * 2**20, task="causal-lm", seq_len=16, wall_seconds=1.0)
    save_probe(two, path)
    out = tmp_path / "ddp"
    nodes, port = [], str(free_port())  # one rendezvous for both nodes
    for node, cache in ((0, tmp_path / "cache0"), (1, node1)):
        env = dict(os.environ, GAPLAN_CACHE_DIR=str(cache))
        nodes.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank",
             str(node), "--master-addr", "127.0.0.1", "--master-port", port, "-m", "gaplan", *TORCHRUN_TRAIN,
             "--out", str(out)], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [(node.wait(timeout=500), *node.communicate()) for node in nodes]
    for code, _, err in results:
        assert code == 0, err[-4000:]
    plan = _summary(results[0][1])["plan"]
    assert (plan["micro_batch"], plan["grad_accum_steps"], plan["world_size"]) == (2, 2, 2), plan
    node0 = [json.loads(p.read_text()) for p in (tmp_path / "cache0" / "plans").glob("*.json")]
    assert len(node0) == 1 and node0[0]["max_micro_batch"] == 4 and node0[0]["trials"], "node 0 probed for real"
    assert json.loads((out / "plan.json").read_text())["plan"]["micro_batch"] == 2


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    """SIGTERM to rank 1 alone: the ranks agree at the next step boundary, rank 0 checkpoints once, nobody hangs."""
    import time

    out = tmp_path / "ddp"
    env = dict(os.environ, GAPLAN_CACHE_DIR=str(tmp_path / "cache"))
    run = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                            str(free_port()), "-m", "gaplan", "train", "--seq-len", "16", "--device", "cpu",
                            "--micro-batch", "2",
                            "--effective-batch", "8", "--steps", "500", "--optimizer", "sgd", "--threads", "1",
                            "--quiet", "--out", str(out)], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    log = out / "train_log.csv"
    deadline = time.monotonic() + 240
    while (not log.exists() or len(log.read_text().splitlines()) < 3) and time.monotonic() < deadline:
        time.sleep(0.1)
    rank1 = _process_with_env(run.pid, "RANK=1")
    assert rank1 is not None and run.poll() is None, "rank 1 not found or the run ended early"
    os.kill(rank1, signal.SIGTERM)
    run.communicate(timeout=180)  # a rank left waiting in a collective would hang here
    import torch

    state = torch.load(out / "checkpoint.pt", weights_only=True)
    logged = len(log.read_text().splitlines()) - 1
    assert 2 <= state["step"] == logged < 500, (state["step"], logged)  # both ranks stopped at that step
    assert run.returncode != 0  # rank 0 exits 130 after its checkpoint


def _process_with_env(parent: int, entry: str) -> int | None:
    """The descendant of ``parent`` whose environment holds ``entry`` (torchrun's worker of that rank)."""
    children = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as handle:
                if int(handle.read().rsplit(")", 1)[1].split()[1]) == parent:  # field 4: the parent's pid
                    children.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    for child in children:
        try:
            with open(f"/proc/{child}/environ", "rb") as handle:
                if entry.encode() in handle.read().split(b"\0"):
                    return child
        except OSError:
            continue
        found = _process_with_env(child, entry)
        if found is not None:
            return found
    return None
