"""A model folder's own weights: loaded exactly (safetensors, bins, shards) or a random init on request; bad files: one line."""

import json
import os

import pytest
import torch
import transformers
from safetensors.torch import load_file

from gaplan.core.errors import GaplanError
from gaplan.workload.build import WorkloadSpec, build_workload
from gaplan.workload.loss import count_targets
from tests.model_folders import convert_to_bin, make_gpt2_folder, make_llama_folder, weights_files


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_llama_folder(tmp_path_factory.mktemp("llama") / "model")


def saved_state(folder):
    """Every tensor in the folder's safetensors files, by name."""
    state = {}
    for name in weights_files(folder):
        if name.endswith(".safetensors"):
            state.update(load_file(os.path.join(folder, name)))
    return state


def assert_same_weights(model, state):
    own = model.state_dict()
    for key, tensor in state.items():
        assert torch.equal(own[key], tensor), key
    assert set(state) <= set(own)


def first_step_loss(workload, batch):
    """The workload's own loss (a sum over targets) as a mean: what the first training step reports."""
    with torch.no_grad():
        return (workload.raw_loss(workload.model, batch) / count_targets(batch, workload.task)).item()


def test_pretrained_loads_the_folders_exact_weights_and_its_own_loss(llama):
    workload = build_workload(WorkloadSpec(model=llama, seq_len=32), "cpu", seed=0)
    assert workload.info["weights"] == "pretrained" and workload.info["weights_path"] == llama
    assert_same_weights(workload.model, saved_state(llama))
    assert {p.dtype for p in workload.model.parameters()} == {torch.float32}
    batch = workload.make_batch(4)
    reference = transformers.AutoModelForCausalLM.from_pretrained(llama, local_files_only=True).eval()
    with torch.no_grad():
        expected = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             labels=batch["labels"]).loss.item()
    pretrained = first_step_loss(workload, batch)
    assert pretrained == pytest.approx(expected, rel=1e-5)

    random = build_workload(WorkloadSpec(model=llama, seq_len=32, init="random"), "cpu", seed=0)
    assert random.info["weights"] == "random" and random.info["weights_path"] is None
    assert not torch.equal(random.model.model.embed_tokens.weight, workload.model.model.embed_tokens.weight)
    random_loss = first_step_loss(random, batch)
    print(f"\nfirst-step loss on the same batch of 4 x 32 tokens: pretrained folder {pretrained:.6f} "
          f"(transformers' from_pretrained: {expected:.6f}), --init random {random_loss:.6f}")
    assert random_loss != pytest.approx(pretrained, rel=1e-3)


def test_init_auto_without_weights_is_random_and_pretrained_is_an_error(tmp_path):
    folder = make_llama_folder(tmp_path / "config-only", with_weights=False, with_tokenizer=False)
    assert build_workload(WorkloadSpec(model=folder, seq_len=16), "cpu").info["weights"] == "random"
    with pytest.raises(GaplanError, match="--init pretrained: .* has no weights") as caught:
        build_workload(WorkloadSpec(model=folder, seq_len=16, init="pretrained"), "cpu")
    assert "\n" not in str(caught.value)
    with pytest.raises(GaplanError, match="--init pretrained"):  # the probe's static count checks it too
        build_workload(WorkloadSpec(model=folder, seq_len=16, init="pretrained"), "meta")
    with pytest.raises(GaplanError, match="needs a model folder with weights"):
        build_workload(WorkloadSpec(model="tiny-gpt2", init="pretrained"), "meta")


def test_sharded_safetensors_load(tmp_path):
    folder = make_llama_folder(tmp_path / "sharded", sharded=True, with_tokenizer=False)
    assert "model.safetensors.index.json" in weights_files(folder)
    assert len([n for n in os.listdir(folder) if n.endswith(".safetensors")]) > 2
    workload = build_workload(WorkloadSpec(model=folder, seq_len=16), "cpu")
    assert workload.info["weights"] == "pretrained"
    assert_same_weights(workload.model, saved_state(folder))


def test_pytorch_bin_loads(tmp_path):
    folder = make_llama_folder(tmp_path / "bin", with_tokenizer=False)
    state = saved_state(folder)
    convert_to_bin(folder)
    assert weights_files(folder) == ["pytorch_model.bin"]
    workload = build_workload(WorkloadSpec(model=folder, seq_len=16), "cpu")
    assert workload.info["weights"] == "pretrained"
    assert_same_weights(workload.model, state)


def test_tied_embeddings_load_tied(tmp_path):
    folder = make_gpt2_folder(tmp_path / "gpt2", with_tokenizer=False)
    model = build_workload(WorkloadSpec(model=folder, seq_len=16), "cpu").model
    assert model.lm_head.weight is model.transformer.wte.weight
    assert_same_weights(model, saved_state(folder))


def test_weights_dtype_bf16_loads_bf16_master_weights(llama):
    workload = build_workload(WorkloadSpec(model=llama, seq_len=16, weights_dtype="bf16"), "cpu")
    assert {p.dtype for p in workload.model.parameters()} == {torch.bfloat16}
    state = saved_state(llama)
    assert torch.equal(workload.model.lm_head.weight, state["lm_head.weight"].to(torch.bfloat16))
    fp32 = build_workload(WorkloadSpec(model=llama, seq_len=16), "meta")
    assert workload.static_bytes() * 2 == fp32.static_bytes()  # weights, gradients and AdamW states all halve


def test_meta_and_probe_builds_read_no_weights(llama, monkeypatch):
    import gaplan.workload.build as workload_module

    def no_loading(*args, **kwargs):
        raise AssertionError("weights were read")

    monkeypatch.setattr(workload_module, "load_pretrained", no_loading)
    meta = build_workload(WorkloadSpec(model=llama, seq_len=16), "meta")
    assert {p.device.type for p in meta.model.parameters()} == {"meta"}
    assert meta.info["weights"] == "random" and meta.static_bytes() > 0
    trial = build_workload(WorkloadSpec(model=llama, seq_len=16), "cpu", load_weights=False)
    assert trial.info["weights"] == "random"
    assert {p.device.type for p in trial.model.parameters()} == {"cpu"}


def test_old_plan_files_without_the_new_keys_get_the_defaults():
    old = {"model": "tiny-gpt2", "task": None, "seq_len": 16, "dtype": "fp32", "optimizer": "adamw", "lr": None,
           "grad_checkpointing": False}
    spec = WorkloadSpec.from_dict(old)
    assert (spec.init, spec.weights_dtype, spec.trust_remote_code) == ("auto", "fp32", False)
    assert WorkloadSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("bad, match", [
    (dict(init="warm"), "unknown init .warm."),
    (dict(weights_dtype="fp8"), "unknown weights dtype"),
    (dict(weights_dtype="fp16", dtype="fp16"), "loss scaler"),
    (dict(model="examples.custom_model:make_cnn", weights_dtype="bf16"), "does not apply"),
])
def test_spec_checks(bad, match):
    with pytest.raises(GaplanError, match=match):
        WorkloadSpec(**bad).validate()


def test_corrupted_safetensors_is_one_line_naming_the_file(tmp_path):
    folder = make_llama_folder(tmp_path / "corrupt", with_tokenizer=False)
    path = os.path.join(folder, "model.safetensors")
    with open(path, "r+b") as handle:
        handle.write(b"\xff" * 64)  # the header length and the start of the JSON header
    with pytest.raises(GaplanError) as caught:
        build_workload(WorkloadSpec(model=folder, seq_len=16), "cpu")
    message = str(caught.value)
    assert "\n" not in message and path in message and "not a valid safetensors file" in message
    with open(path, "r+b") as handle:  # a truncated file: the header promises more data than there is
        handle.truncate(os.path.getsize(path) // 2)
    with pytest.raises(GaplanError, match="not a valid safetensors file"):
        build_workload(WorkloadSpec(model=folder, seq_len=16), "cpu")
    # The probe's builds read no weights, so a bad file is found by the training build, not by them.
    assert build_workload(WorkloadSpec(model=folder, seq_len=16), "meta").info["weights"] == "random"


def test_corrupted_bin_is_one_line_naming_the_file(tmp_path):
    folder = convert_to_bin(make_llama_folder(tmp_path / "corrupt-bin", with_tokenizer=False))
    path = os.path.join(folder, "pytorch_model.bin")
    with open(path, "r+b") as handle:
        handle.truncate(100)
    with pytest.raises(GaplanError) as caught:
        build_workload(WorkloadSpec(model=folder, seq_len=16), "cpu")
    assert "\n" not in str(caught.value) and path in str(caught.value)


def test_weights_of_another_shape_are_one_line_naming_the_file_and_tensor(tmp_path):
    folder = make_llama_folder(tmp_path / "mismatch", with_tokenizer=False)
    config_path = os.path.join(folder, "config.json")
    with open(config_path) as handle:
        config = json.load(handle)
    config["intermediate_size"] = 96
    with open(config_path, "w") as handle:
        json.dump(config, handle)
    with pytest.raises(GaplanError) as caught:
        build_workload(WorkloadSpec(model=folder, seq_len=16), "cpu")
    message = str(caught.value)
    assert "\n" not in message
    assert os.path.join(folder, "model.safetensors") in message and "mlp" in message
    assert "[64, 128]" in message and "[64, 96]" in message and "do not match the config" in message


def test_weights_with_fewer_layers_than_the_config_are_an_error(tmp_path):
    folder = make_llama_folder(tmp_path / "layers", with_tokenizer=False)
    config_path = os.path.join(folder, "config.json")
    with open(config_path) as handle:
        config = json.load(handle)
    config["num_hidden_layers"] = 3
    with open(config_path, "w") as handle:
        json.dump(config, handle)
    with pytest.raises(GaplanError, match=r"has no model\.layers\.2\..* do not match the config"):
        build_workload(WorkloadSpec(model=folder, seq_len=16), "cpu")
    config["num_hidden_layers"] = 1
    with open(config_path, "w") as handle:
        json.dump(config, handle)
    with pytest.raises(GaplanError, match=r"has model\.layers\.1\..* no place for"):
        build_workload(WorkloadSpec(model=folder, seq_len=16), "cpu")


def test_a_classifier_on_a_causal_lm_checkpoint_gets_a_new_head(llama):
    workload = build_workload(WorkloadSpec(model=llama, seq_len=16, task="classification"), "cpu")
    assert workload.info["weights"] == "pretrained"
    state = saved_state(llama)
    assert torch.equal(workload.model.model.embed_tokens.weight, state["model.embed_tokens.weight"])
