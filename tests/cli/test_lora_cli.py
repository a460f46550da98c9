"""LoRA from the command line: train a local Llama folder's adapters, save them for peft, merge them, resume."""

import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

from ..model_folders import make_llama_folder

peft = pytest.importorskip("peft")

LINES = [f"line {i}: the quick brown fox jumps over the lazy dog " * (1 + i % 5) for i in range(64)]


def folder_digest(path):
    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(path)):
        for name in sorted(files):
            digest.update(name.encode())
            with open(os.path.join(root, name), "rb") as stream:
                digest.update(stream.read())
    return digest.hexdigest()


def gaplan(tmp_path, *args, check=True):
    env = dict(os.environ, GAPLAN_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-m", "gaplan", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture
def llama_and_data(tmp_path):
    make_llama_folder(str(tmp_path / "my-llama"))
    (tmp_path / "my-data.txt").write_text("\n".join(LINES) + "\n")
    return folder_digest(tmp_path / "my-llama")


def adapter_outputs(tmp_path, adapter):
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "my-llama"))
    model = peft.PeftModel.from_pretrained(base, str(tmp_path / adapter)).eval()
    ids = torch.arange(1, 17).unsqueeze(0)
    with torch.no_grad():
        return model(input_ids=ids).logits, model


@pytest.mark.slow
def test_train_lora_saves_an_adapter_peft_loads_and_leaves_the_base_folder_as_it_was(tmp_path, llama_and_data):
    done = gaplan(tmp_path, "train", "--model", "./my-llama", "--data", "./my-data.txt", "--lora", "--lora-r", "4",
                  "--lora-targets", "all-linear", "--micro-batch", "4", "--effective-batch", "8", "--steps", "2",
                  "--save-model", "./adapter", "--json")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and "adapter saved to" in done.stderr
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert not (tmp_path / "adapter" / "model.safetensors").exists(), "the adapter folder holds the adapter only"
    assert folder_digest(tmp_path / "my-llama") == llama_and_data
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["peft_type"] == "LORA"

    logits, model = adapter_outputs(tmp_path, "adapter")
    trained = {n: p for n, p in model.named_parameters() if "lora_B" in n}
    assert trained and any(p.abs().sum() > 0 for p in trained.values()), "two AdamW steps left B at its zero init"

    # --merge writes the full model; it loads with transformers alone and gives the adapter's outputs.
    gaplan(tmp_path, "train", "--model", "./my-llama", "--data", "./my-data.txt", "--lora", "--lora-r", "4",
           "--lora-targets", "all-linear", "--micro-batch", "4", "--effective-batch", "8", "--steps", "2",
           "--save-model", "./merged", "--merge", "--json")
    import transformers

    merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    with torch.no_grad():
        merged_logits = merged(input_ids=torch.arange(1, 17).unsqueeze(0)).logits
    torch.testing.assert_close(merged_logits, logits, rtol=1e-4, atol=1e-4)
    assert folder_digest(tmp_path / "my-llama") == llama_and_data


@pytest.mark.parametrize("args, message", [
    (["--merge", "--save-model", "./x"], "--merge merges LoRA adapters into the base: add --lora"),
    (["--lora", "--merge"], "give --save-model DIR"),
    (["--lora", "--quantize", "4bit", "--device", "cpu"], "needs CUDA"),
    (["--lora", "--lora-config", "./nope.json"], "--lora-config ./nope.json"),
])
def test_bad_lora_options_are_one_line_and_exit_2(tmp_path, args, message):
    done = gaplan(tmp_path, "train", "--micro-batch", "2", "--steps", "1", "--out", "./run", *args, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()
