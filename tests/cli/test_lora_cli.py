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
@pytest.mark.heavy
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


QLORA = ["train", "--model", "./my-llama", "--data", "./my-data.txt", "--lora", "--quantize", "4bit", "--lora-r", "4",
         "--lora-dropout", "0", "--lora-targets", "all-linear", "--micro-batch", "4", "--effective-batch", "8",
         "--quiet"]


@pytest.mark.heavy
@pytest.mark.slow
def test_qlora_trains_a_folders_adapters_on_its_4_bit_base_and_merges_them_into_its_full_precision_weights(
        tmp_path, llama_and_data):
    """QLoRA on the CPU (bitsandbytes' nf4): the adapter folder loads with peft on the full-precision base, the base
    folder is unchanged, and --merge adds the adapters to the folder's full-precision weights (not to 4-bit ones)."""
    pytest.importorskip("bitsandbytes")
    gaplan(tmp_path, *QLORA, "--steps", "2", "--out", "./straight", "--save-model", "./adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert not (tmp_path / "adapter" / "model.safetensors").exists(), "the adapter folder holds the adapter only"
    assert folder_digest(tmp_path / "my-llama") == llama_and_data
    logits, model = adapter_outputs(tmp_path, "adapter")
    assert any(p.abs().sum() > 0 for n, p in model.named_parameters() if "lora_B" in n)

    gaplan(tmp_path, *QLORA, "--steps", "2", "--out", "./merging", "--save-model", "./merged", "--merge")
    import transformers

    merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    assert not getattr(merged.config, "quantization_config", None), "the merged model is full precision"
    with torch.no_grad():
        merged_logits = merged(input_ids=torch.arange(1, 17).unsqueeze(0)).logits
    torch.testing.assert_close(merged_logits, logits, rtol=1e-4, atol=1e-4)
    assert folder_digest(tmp_path / "my-llama") == llama_and_data


@pytest.mark.heavy
@pytest.mark.slow
def test_a_qlora_run_stopped_by_sigterm_resumes_to_the_uninterrupted_adapters_bitwise(tmp_path, llama_and_data):
    """The checkpoint holds the adapters alone; --resume reads the 4-bit base from the folder again."""
    pytest.importorskip("bitsandbytes")
    import signal
    import time

    from safetensors.torch import load_file

    env = dict(os.environ, GAPLAN_CACHE_DIR=str(tmp_path / "cache"))
    run = [sys.executable, "-m", "gaplan", *QLORA, "--steps", "40"]
    gaplan(tmp_path, *QLORA, "--steps", "40", "--out", "./straight", "--save-model", "./adapter")
    cut = subprocess.Popen([*run, "--out", "./cut", "--checkpoint-every", "1"], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log, deadline = tmp_path / "cut" / "train_log.csv", time.monotonic() + 240
    while (not log.exists() or len(log.read_text().splitlines()) < 3) and cut.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    assert cut.poll() is None, "the run finished before it could be stopped"
    cut.send_signal(signal.SIGTERM)
    assert cut.wait(timeout=120) == 130, cut.stderr.read()
    cut.stderr.close()
    state = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert 2 <= state["step"] < 40 and all("lora_" in key for key in state["model"])
    gaplan(tmp_path, "train", "--resume", "./cut", "--quiet", "--save-model", "./resumed")
    straight = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    resumed = load_file(str(tmp_path / "resumed" / "adapter_model.safetensors"))
    assert straight and set(resumed) == set(straight)
    assert all(torch.equal(resumed[name], value) for name, value in straight.items())


@pytest.mark.parametrize("args, message", [
    (["--merge", "--save-model", "./x"], "--merge merges LoRA adapters into the base: add --lora"),
    (["--lora", "--merge"], "give --save-model DIR"),
    (["--lora", "--quantize", "4bit", "--parallel", "fsdp"], "--quantize 4bit with --parallel fsdp is not supported"),
    (["--lora", "--lora-config", "./nope.json"], "--lora-config ./nope.json"),
    (["--lora", "--merge", "--save-model", "./x", "--parallel", "fsdp"], "--merge with --parallel fsdp is not supported"),
])
def test_bad_lora_options_are_one_line_and_exit_2(tmp_path, args, message):
    done = gaplan(tmp_path, "train", "--micro-batch", "2", "--steps", "1", "--out", "./run", *args, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()


def test_the_launch_command_of_a_lora_plan_rebuilds_its_workload():
    from gaplan.cli.train import train_command
    from gaplan.core.checkpointing import ON
    from gaplan.plan.layouts import workload_flags
    from gaplan.workflows.parse_options import spec_from_flat
    from gaplan.workload.spec import WorkloadSpec

    spec = WorkloadSpec(model="tiny-llama", seq_len=64, weights_dtype="bf16", dtype="bf16", lora=True, lora_r=8,
                        lora_alpha=16.0, lora_dropout=0.0, lora_targets="q_proj,v_proj", grad_checkpointing=ON)
    words = workload_flags(spec.to_dict())
    assert "--lora" in words and "--lora-r" in words and "--lora-alpha" in words
    context = train_command.make_context("train", [*words, "--device", "cpu"])
    assert spec_from_flat(context.params) == spec
    assert "--lora" not in workload_flags(WorkloadSpec(model="tiny-llama").to_dict())


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_lora_over_two_ddp_ranks_and_over_fsdp2_trains_the_adapter_one_process_trains(tmp_path):
    """The same effective batch over one process, 2 DDP ranks and 2 FSDP2 ranks (gloo): the same adapter weights
    (the frozen base is sharded by fully_shard with the adapters, and saved as the adapter alone)."""
    from safetensors.torch import load_file

    from tests.conftest import free_port

    # SGD: the update is the gradient itself (Adam would amplify rounding in near-zero gradients to a whole lr).
    common = ["train", "--lora", "--lora-dropout", "0", "--optimizer", "sgd", "--lr", "0.5", "--seq-len", "32",
              "--micro-batch", "4", "--effective-batch", "16", "--steps", "2", "--device", "cpu", "--quiet"]
    gaplan(tmp_path, *common, "--out", "./one", "--save-model", "./one-adapter")
    for layout in ("ddp", "fsdp"):
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                               str(free_port()), "-m", "gaplan", *common, "--parallel", layout, "--out", f"./{layout}",
                               "--save-model", f"./{layout}-adapter"], cwd=tmp_path, capture_output=True, text=True,
                              env=dict(os.environ, GAPLAN_CACHE_DIR=str(tmp_path / "cache")), timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    one = load_file(str(tmp_path / "one-adapter" / "adapter_model.safetensors"))
    assert one and all("lora_" in name for name in one)
    for layout in ("ddp", "fsdp"):
        other = load_file(str(tmp_path / f"{layout}-adapter" / "adapter_model.safetensors"))
        assert set(other) == set(one), layout
        for name, value in one.items():
            torch.testing.assert_close(other[name], value, rtol=1e-5, atol=1e-6, msg=f"{layout} {name}")


@pytest.mark.heavy  # 20 s; the default run keeps the preset's 4-bit runs
def test_a_function_models_4_bit_run_checkpoints_its_own_adapters_alone_and_resumes(tmp_path):
    """examples/frozen_base.py with --quantize nf4: the checkpoint holds the model's adapter matrices (its 4-bit base
    is rebuilt from the function), and --resume goes on from it."""
    pytest.importorskip("bitsandbytes")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, GAPLAN_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=root)
    run = ["train", "--model", "examples.frozen_base:make_bf16", "--quantize", "nf4", "--micro-batch", "4",
           "--effective-batch", "8", "--checkpoint-every", "1", "--quiet", "--json"]
    for extra, steps in ((["--out", "run", "--steps", "3"], 3), (["--resume", "run", "--steps", "5"], 2)):
        done = subprocess.run([sys.executable, "-m", "gaplan", *run, *extra], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout)["steps"] == steps
        saved = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
        assert saved["step"] == 3 + (steps if extra[0] == "--resume" else 0)
        assert sorted(saved["model"]) == [f"blocks.{i}.up.lora_{m}" for i in range(2) for m in "ab"]
