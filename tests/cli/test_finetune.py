"""The fine-tuning a new user runs: a Llama-style folder with weights and a tokenizer, a datasets folder, a save."""

import json
import os
import subprocess
import sys

import pytest
import torch

from ..model_folders import make_llama_folder

TEXTS = [f"sample {i}: the quick brown fox jumps over the lazy dog " * (1 + i % 7) for i in range(96)]


@pytest.mark.slow
@pytest.mark.heavy
def test_finetune_a_pretrained_folder_on_a_dataset_and_load_it_back(tmp_path):
    """gaplan train --model ./my-llama --data ./my-dataset --text-field content --effective-batch 64 --save-model ..."""
    import datasets
    import transformers
    from safetensors.torch import load_file

    make_llama_folder(str(tmp_path / "my-llama"))
    datasets.Dataset.from_dict({"content": TEXTS, "id": list(range(len(TEXTS)))}).save_to_disk(
        str(tmp_path / "my-dataset"))
    env = dict(os.environ, GAPLAN_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-m", "gaplan", "train", "--model", "./my-llama", "--data", "./my-dataset",
                           "--text-field", "content", "--effective-batch", "64", "--save-model", "./my-llama-ft",
                           "--steps", "2", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert "weights: " in done.stderr and "(pretrained)" in done.stderr
    assert summary["steps"] == 2 and summary["plan"]["effective_batch"] == 64
    assert "my-llama" in summary["data"]["tokenizer"]
    assert summary["data"]["read"] == len(TEXTS)

    # The saved folder loads with transformers alone: the fine-tuned weights, and the folder's tokenizer.
    tuned = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "my-llama-ft"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "my-llama-ft"))
    original = load_file(str(tmp_path / "my-llama" / "model.safetensors"))
    state = tuned.state_dict()
    assert set(original) <= set(state)
    assert any(not torch.equal(original[k], state[k]) for k in original), "two AdamW steps changed nothing"
    assert tokenizer("the quick brown fox")["input_ids"] == \
        transformers.AutoTokenizer.from_pretrained(str(tmp_path / "my-llama"))("the quick brown fox")["input_ids"]


def test_a_model_saved_from_byte_tokens_says_it_holds_no_tokenizer(tmp_path):
    """--tokenizer bytes has no transformers tokenizer to save: the folder held none, and the line said it loads with
    AutoTokenizer.from_pretrained, which gave a GPT-2 tokenizer of length 1 that reads "abc" as []."""
    from click.testing import CliRunner

    from gaplan.cli.main import main

    (tmp_path / "data.txt").write_text("".join(f"line {i} of a few bytes\n" for i in range(40)))
    result = CliRunner().invoke(main, ["train", "--seq-len", "16", "--effective-batch", "4", "--steps", "1",
                                       "--threads", "1", "--data", str(tmp_path / "data.txt"), "--tokenizer", "bytes",
                                       "--out", str(tmp_path / "run"), "--save-model", str(tmp_path / "ft"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tokenizer_saved"] is False
    assert ("no tokenizer is in it: the run's data was bytes, a token per byte, and AutoTokenizer would load one that "
            "does not read as the run did") in result.stderr
    assert (tmp_path / "ft" / "config.json").exists() and not (tmp_path / "ft" / "tokenizer.json").exists()
