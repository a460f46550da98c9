"""One budget, one edge: gaplan probe's B* is the edge of gaplan train --enforce-memory-limit on full-length data.

B* trains two optimizer steps with no fallback; B*+1 runs out of memory and falls back (the loss stays exact).
"""

import json
import random
import subprocess
import sys

import pytest

LIMIT = "300MiB"
COMMON = ["--seq-len", "64", "--memory-limit", LIMIT, "--quiet", "--json"]


def gaplan(*args):
    completed = subprocess.run([sys.executable, "-m", "gaplan", *args], capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout)


@pytest.mark.heavy
@pytest.mark.slow
def test_the_probes_edge_is_the_edge_of_train_under_the_enforced_budget(tmp_path):
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    generator = random.Random(0)
    data = tmp_path / "long.txt"  # every line splits into full 64-byte samples: the probe's worst case
    data.write_text("\n".join(" ".join(generator.choice(words) for _ in range(400)) for _ in range(200)) + "\n")
    edge = gaplan("probe", *COMMON, "--out", str(tmp_path / "probe"))["max_micro_batch"]
    for micro_batch, falls_back in ((edge, False), (edge + 1, True)):
        summary = gaplan("train", *COMMON, "--micro-batch", str(micro_batch), "--effective-batch", str(2 * micro_batch),
                         "--steps", "2", "--enforce-memory-limit", "--data", str(data), "--tokenizer", "bytes",
                         "--out", str(tmp_path / f"train-{micro_batch}"))
        assert summary["steps"] == 2
        assert bool(summary["oom_fallbacks"]) == falls_back, (micro_batch, edge, summary["oom_fallbacks"])


@pytest.mark.slow
@pytest.mark.parametrize("limit, line", [
    ("50MiB", "gaplan: step 1: out of memory at micro-batch 1 (in the backward of micro-step 1 of 2), the smallest "
              "split of a step: it does not fit this budget; give more memory (--memory-limit)"),
    ("1KiB", "gaplan: out of memory while building tiny-gpt2: it does not fit here (give more memory)"),
])
def test_a_budget_that_micro_batch_1_does_not_fit_is_one_line_not_a_traceback(tmp_path, limit, line):
    """Nothing left to halve, or the model itself over the budget: one line, exit 2 (was Python's MemoryError)."""
    done = subprocess.run([sys.executable, "-m", "gaplan", "train", "--seq-len", "16", "--effective-batch", "2",
                           "--micro-batch", "1", "--steps", "1", "--enforce-memory-limit", "--memory-limit", limit,
                           "--quiet", "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=600)
    lines = [text for text in done.stderr.splitlines() if text.strip()]
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(line), done.stderr[-3000:]
