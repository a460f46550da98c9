"""LoRA (peft) workloads: the base frozen, only the adapters in the optimizer, the loss token-exact on them."""

import json

import pytest
import torch

peft = pytest.importorskip("peft")

from gaplan import GaplanError  # noqa: E402
from gaplan.workload.build import build_workload  # noqa: E402
from gaplan.workload.lora import is_peft_model, read_adapter_config  # noqa: E402
from gaplan.workload.spec import WorkloadSpec  # noqa: E402

from .adapter_runs import assert_accumulated_adapter_grads_equal_one_batch, assert_same_weights, cut_and_resumed  # noqa: E402, I001


def lora_spec(**fields):
    return WorkloadSpec(**{"model": "tiny-gpt2", "seq_len": 32, "lora": True, **fields})


def test_the_base_is_frozen_and_only_the_adapters_are_optimized():
    workload = build_workload(lora_spec())
    model = workload.model
    assert is_peft_model(model)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    assert all("c_attn" in name for name in trainable)  # peft's default target for GPT-2
    optimized = {id(p) for group in workload.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in model.parameters() if p.requires_grad}
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    adapters = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    assert workload.static_bytes() == weights + 3 * adapters  # AdamW: a gradient and two states, adapters only


def test_all_linear_and_named_targets_and_a_bf16_base_with_fp32_adapters():
    llama = build_workload(lora_spec(model="tiny-llama", lora_targets="all-linear", weights_dtype="bf16"))
    names = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name, p in llama.model.named_parameters() if p.requires_grad}
    assert names == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert {p.dtype for p in llama.model.parameters() if p.requires_grad} == {torch.float32}
    assert {p.dtype for p in llama.model.parameters() if not p.requires_grad} == {torch.bfloat16}
    named = build_workload(lora_spec(model="tiny-llama", lora_targets="q_proj, o_proj", lora_r=4))
    shapes = {tuple(p.shape) for name, p in named.model.named_parameters() if "lora_A" in name}
    assert shapes == {(4, 256)}


def test_a_target_the_model_lacks_is_one_line():
    with pytest.raises(GaplanError, match="--lora on tiny-gpt2: Target modules") as caught:
        build_workload(lora_spec(lora_targets="q_proj"))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("fields, message", [
    (dict(lora_r=0), "lora_r must be a positive integer"),
    (dict(lora_alpha=0), "lora_alpha must be a positive number"),
    (dict(lora_alpha=float("inf")), r"lora_alpha must be a positive number \(got inf\)"),
    (dict(lora_dropout=1.0), r"lora_dropout must be in \[0, 1\)"),
    (dict(lora_dropout="0.1"), r"lora_dropout must be in \[0, 1\) \(got '0.1'\)"),  # was a TypeError
    (dict(lora_targets=" , "), "lora_targets names no module"),
    (dict(lora=False, quantize="4bit"), "add lora \\(or give a module:function model, whose frozen linear layers"),
    (dict(lora=False, lora_r=8), "lora_r sets LoRA adapters, and lora is off"),
    (dict(lora=False, lora_alpha=8.0, lora_targets="all-linear"), "lora_alpha, lora_targets set LoRA adapters"),
    (dict(quantize="8bit"), "unknown quantize"),
    (dict(model="tests.custom:build"), "does not apply to a module:function model"),
])
def test_bad_lora_settings_are_refused_before_anything_is_built(fields, message):
    """In Python the error names the argument as written (lora_r); the command line shows its flag (--lora-r)."""
    with pytest.raises(GaplanError, match=message) as caught:
        lora_spec(**fields).validate()
    assert "--" not in str(caught.value)


def test_accumulated_adapter_gradients_equal_one_full_batch_on_padded_uneven_micro_batches():
    assert_accumulated_adapter_grads_equal_one_batch(lora_spec(lora_dropout=0.0, lora_targets="all-linear"))


def test_an_adapter_config_file_or_folder_gives_the_lora_fields(tmp_path):
    peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]).save_pretrained(tmp_path)
    fields = read_adapter_config(str(tmp_path))
    assert fields["lora"] and (fields["lora_r"], fields["lora_alpha"], fields["lora_dropout"]) == (8, 16, 0.1)
    assert sorted(fields["lora_targets"].names) == ["q_proj", "v_proj"]
    assert read_adapter_config(str(tmp_path / "adapter_config.json")) == fields
    spec = WorkloadSpec(model="tiny-llama", **fields).validate()
    assert sorted(spec.lora_target_modules) == ["q_proj", "v_proj"]


@pytest.mark.parametrize("content, message", [
    ("{not json", "is not JSON"), (json.dumps({"peft_type": "IA3"}), "is not a LoRA adapter config"),
    # each was a traceback: a file that is not UTF-8, and values of the wrong JSON type
    (b"\xff\xfe\x00bad", "is not UTF-8 text: byte 0xff at offset 0"),
    ('{"r": 4, "lora_alpha": "Q\u00e9"}'.encode("latin-1").replace(b"\\u00e9", b"\xe9"), "is not UTF-8 text"),
    (json.dumps({"r": 4, "lora_dropout": "0.1"}), '"lora_dropout" must be a number \\(got "0.1"\\)'),
    (json.dumps({"r": "8"}), '"r" must be an integer \\(got "8"\\)'),
    (json.dumps({"r": 8.0}), '"r" must be an integer \\(got 8.0\\)'),
    (json.dumps({"lora_alpha": True}), '"lora_alpha" must be a number \\(got true\\)'),
    (json.dumps({"r": 4, "target_modules": 5}), '"target_modules" must be a module name or a list of them'),
])
def test_a_bad_adapter_config_is_one_line(tmp_path, content, message):
    path = tmp_path / "adapter_config.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(GaplanError, match=message):
        read_adapter_config(str(path))
    with pytest.raises(GaplanError, match="missing.json: no such file$"):
        read_adapter_config(str(tmp_path / "missing.json"))
    (tmp_path / "adapter").mkdir()  # a folder: the file it lacks is named
    with pytest.raises(GaplanError, match=r"adapter: no adapter_config.json in .*adapter$"):
        read_adapter_config(str(tmp_path / "adapter"))


def test_a_lora_run_cut_after_step_2_resumes_to_the_uninterrupted_weights_bitwise(tmp_path):
    reference, cut, resumed = cut_and_resumed(lora_spec(seq_len=16, lora_dropout=0.0), tmp_path)
    assert cut["step"] == 2
    assert_same_weights(resumed, reference)


@pytest.mark.parametrize("fields, message", [
    (dict(seq_len="16"), "seq_len must be an integer of at least 2 \\(got '16'\\)"),  # said "at least 2 (got 16)"
    (dict(seq_len=16.5), "seq_len must be an integer of at least 2 \\(got 16.5\\)"),
    (dict(target_len="8"), "target_len must be a positive integer \\(got '8'\\)"),
])
def test_a_value_of_another_type_is_said_as_its_type(fields, message):
    with pytest.raises(GaplanError, match=message):
        WorkloadSpec(model="tiny-t5", **fields).validate()
