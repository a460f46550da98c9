"""``gaplan bench --batch-by tokens`` and training with the probed T*: end to end on a long-tailed corpus.

No timed assertions: the rates are whatever the machine gives; what is checked is what was run and written,
the padding (which the data and the packer fix), and that training a whole epoch with T* never runs out of memory.
"""

import json
import math
import os
import subprocess
import sys

import pandas as pd
import pytest
from click.testing import CliRunner

from gaplan.cli.main import main

from ..conftest import REPO_ROOT
from ..token_corpus import write_long_tailed

SMALL = ["--model", "tiny-gpt2", "--seq-len", "16", "--memory-limit", "160MiB", "--device", "cpu", "--threads", "1",
         "--tokenizer", "bytes"]


@pytest.mark.heavy
@pytest.mark.slow
def test_bench_by_tokens_writes_the_token_plan_and_the_samples_plan(tmp_path, monkeypatch):
    monkeypatch.setenv("GAPLAN_CACHE_DIR", str(tmp_path / "cache"))
    data = write_long_tailed(tmp_path / "corpus.txt", 200, 6, 16)
    out = tmp_path / "bench"
    result = CliRunner().invoke(main, ["bench", *SMALL, "--data", data, "--batch-by", "tokens", "--granule", "16",
                                       "--effective-batch", "32", "--rounds", "1", "--repeats", "1", "--json",
                                       "--quiet", "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    rows = pd.read_csv(out / "throughput.csv")
    assert list(rows["kind"]) == ["token-plan", "samples-plan"] and list(rows["batch_by"]) == ["tokens", "samples"]
    t_star = printed["token_budget"]["token_budget"]
    # The samples plan splits E evenly in micro-batches of at most B* (at the longest length).
    assert rows["token_budget"].iloc[0] == t_star and rows["micro_batch"].iloc[1] <= printed["samples_plan_micro_batch"]
    assert (rows["tokens_per_s"] > 0).all() and (rows["samples_per_s"] > 0).all() and rows["bounded"].all()
    # Packing sorted by length pads less than micro-batches of random samples, on the same steps of the same data.
    assert 0 <= rows["padding_fraction"].iloc[0] < rows["padding_fraction"].iloc[1] < 1
    assert (rows["micro_steps_mean"] >= 1).all()
    assert rows["tokens_ratio"].iloc[1] == 1.0 and printed["tokens_ratio"] == rows["tokens_ratio"].iloc[0]
    report = (out / "report.md").read_text()
    assert "### Token plan vs samples plan" in report and (out / "tokens.json").exists()


@pytest.mark.heavy
@pytest.mark.slow
def test_a_whole_epoch_with_the_probed_t_star_never_runs_out_of_memory(tmp_path):
    """Every micro-batch the packer builds from this data, over a whole epoch, fits the enforced budget at T*.

    It did not while MKL kept the GEMM workspace of earlier shapes (issue 13): a run of changing shapes held 13 MiB
    more of it than the probe's one-shape trials, and ran out of memory once at step 4 or 5 (gaplan.devices.mkl).
    """
    env = dict(os.environ, GAPLAN_CACHE_DIR=str(tmp_path / "cache"), MALLOC_MMAP_THRESHOLD_="65536")
    samples, effective = 300, 32
    data = write_long_tailed(tmp_path / "corpus.txt", samples, 8, 64)
    common = ["--model", "tiny-gpt2", "--seq-len", "64", "--memory-limit", "192MiB", "--device", "cpu",
              "--threads", "1", "--tokenizer", "bytes", "--data", data, "--batch-by", "tokens", "--quiet"]

    def gaplan(*args):
        return subprocess.run([sys.executable, "-m", "gaplan", *args], cwd=REPO_ROOT, env=env, capture_output=True,
                              text=True, timeout=900)

    probed = gaplan("probe", *common, "--json", "--out", str(tmp_path / "probe"))
    assert probed.returncode == 0, probed.stderr[-3000:]
    t_star = json.loads(probed.stdout)["token_budget"]["token_budget"]
    steps = math.ceil(samples / effective)  # every sample at least once
    trained = gaplan("train", *common, "--token-plan", str(tmp_path / "probe" / "tokens.json"), "--effective-batch",
                     str(effective), "--steps", str(steps), "--enforce-memory-limit", "--json",
                     "--out", str(tmp_path / "train"))
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = json.loads(trained.stdout)
    assert summary["steps"] == steps and summary["oom_fallbacks"] == [], summary
    assert summary["padding_fraction"] is not None
    assert json.loads((tmp_path / "train" / "train.json").read_text())["options"]["token_budget"] == t_star
