"""QLoRA workloads: the base in bitsandbytes' nf4 (double quantization) on the CPU, the adapters token-exact on it."""

import pytest
import torch

peft = pytest.importorskip("peft")
bnb = pytest.importorskip("bitsandbytes")

from gaplan import GaplanError  # noqa: E402
from gaplan.training.checkpoint import model_state  # noqa: E402
from gaplan.workload.build import build_workload, full_precision_twin  # noqa: E402
from gaplan.workload.quantize import is_quantized  # noqa: E402
from gaplan.workload.spec import WorkloadSpec  # noqa: E402

from .adapter_runs import assert_accumulated_adapter_grads_equal_one_batch, assert_same_weights, cut_and_resumed  # noqa: E402, I001


def qlora_spec(**fields):
    return WorkloadSpec(**{"model": "tiny-llama", "seq_len": 32, "lora": True, "quantize": "4bit", **fields})


def base_layers(model):
    return {name: module for name, module in model.named_modules() if isinstance(module, bnb.nn.Linear4bit)}


@pytest.mark.parametrize("model, layers, kept", [("tiny-llama", 28, "lm_head"), ("tiny-gpt2", 16, "lm_head")])
def test_every_linear_layer_of_the_base_but_the_head_is_nf4_and_encodes_its_full_precision_weight(model, layers, kept):
    """tiny-llama's 4 x 7 projections (nn.Linear), tiny-gpt2's 4 x 4 Conv1D (transposed first, as transformers
    quantizes them); each layer computes with its dequantized weight, bitsandbytes' nf4 of the full-precision one."""
    spec = qlora_spec(model=model)
    quantized, full = build_workload(spec, seed=0), full_precision_twin(build_workload(spec, seed=0), seed=0)
    assert is_quantized(quantized.model) and not is_quantized(full.model)
    found = base_layers(quantized.model)
    assert len(found) == layers
    assert type(quantized.model.get_submodule(f"base_model.model.{kept}")) is torch.nn.Linear
    originals = dict(full.model.named_modules())
    for name, layer in found.items():
        weight = layer.weight
        assert weight.dtype == torch.uint8 and weight.quant_type == "nf4" and weight.compress_statistics, name
        assert weight.numel() * 2 == layer.in_features * layer.out_features, name  # two 4-bit codes per byte
        dequantized = bnb.functional.dequantize_4bit(weight.data, weight.quant_state)
        original = originals[name].weight.detach()
        original = original.T if type(originals[name]).__name__ == "Conv1D" else original
        assert dequantized.shape == original.shape, name
        # What bitsandbytes' own quantization of the full-precision weight gives, exactly; and near that weight
        # (0.09 of its norm, 0.24 for tiny-llama's down_proj on bitsandbytes' CPU backend: a transposed or another
        # layer's weight is ~1.4 away).
        codes, state = bnb.functional.quantize_4bit(original.contiguous(), quant_type="nf4", compress_statistics=True)
        assert torch.equal(dequantized, bnb.functional.dequantize_4bit(codes, state)), name
        error = (dequantized - original).norm() / original.norm()
        assert error < 0.3, f"{name}: relative error {error:.3f}"
        x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(0))
        expected = x @ dequantized.T + (layer.bias if layer.bias is not None else 0)
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5, msg=name)
    assert all(not p.requires_grad for n, p in quantized.model.named_parameters() if "lora_" not in n)
    static = sum(p.numel() * p.element_size() for p in quantized.model.parameters())
    assert static < 0.7 * sum(p.numel() * p.element_size() for p in full.model.parameters())


def test_accumulated_adapter_gradients_on_a_4_bit_base_equal_one_full_batch():
    assert_accumulated_adapter_grads_equal_one_batch(qlora_spec(lora_dropout=0.0, lora_targets="all-linear"))


def test_a_qlora_checkpoint_holds_the_adapters_and_a_cut_run_resumes_to_the_uninterrupted_weights_bitwise(tmp_path):
    reference, saved, resumed = cut_and_resumed(qlora_spec(seq_len=16, lora_dropout=0.0), tmp_path)
    assert saved["step"] == 2 and saved["model"] and all("lora_" in key for key in saved["model"])
    assert set(saved["model"]) == set(model_state(reference))
    assert_same_weights(resumed, reference)


def test_a_checkpoint_of_other_adapters_is_one_line():
    from gaplan.training.checkpoint import load_model_state

    workload = build_workload(qlora_spec(lora_targets="q_proj"), seed=0)
    other = model_state(build_workload(qlora_spec(lora_targets="q_proj,v_proj"), seed=0).model)
    with pytest.raises(GaplanError, match="the checkpoint's adapters are not this model's: .*v_proj.* not in the model"):
        load_model_state(workload.model, other)


def test_qlora_without_bitsandbytes_or_with_one_older_than_its_cpu_backend_is_one_line(monkeypatch):
    """A stand-in for the installed version (importlib.metadata): the message, not bitsandbytes, is under test."""
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    with pytest.raises(GaplanError, match=r"needs bitsandbytes: pip install 'gaplan\[qlora\]'"):
        qlora_spec().validate().check_device("cpu")
    monkeypatch.setattr(metadata, "version", lambda name: "0.45.5")
    with pytest.raises(GaplanError, match="on the CPU needs bitsandbytes >= 0.46 .installed: 0.45.5"):
        qlora_spec().validate().check_device("cpu")
    qlora_spec().validate().check_device("cuda:0")  # 0.45 runs nf4 on CUDA


FROZEN_BASE = "examples.frozen_base"
FROZEN_LAYERS = {"blocks.0.up.linear", "blocks.0.down", "blocks.1.up.linear", "blocks.1.down", "head"}


@pytest.mark.parametrize(("maker", "dtype"), [("make", torch.float32), ("make_bf16", torch.bfloat16)])
def test_a_function_models_frozen_linear_layers_are_nf4_in_their_own_dtype_and_its_adapters_stay(maker, dtype):
    """A module:function model with its own adapters (examples/frozen_base.py): every frozen nn.Linear, the head
    included, becomes bitsandbytes' nf4 of its full-precision weight, computing in that weight's dtype; the adapters
    and the frozen embedding and norms stay as built."""
    spec = WorkloadSpec(model=f"{FROZEN_BASE}:{maker}", quantize="nf4")
    quantized = build_workload(spec, seed=0)
    full = full_precision_twin(quantized, seed=0)
    assert is_quantized(quantized.model) and not is_quantized(full.model)
    found = base_layers(quantized.model)
    assert set(found) == FROZEN_LAYERS
    originals = dict(full.model.named_modules())
    for name, layer in found.items():
        assert layer.compute_dtype == dtype and layer.weight.quant_type == "nf4", name
        assert not layer.weight.compress_statistics, name  # nf4: no double quantization
        original = originals[name].weight.detach()
        codes, state = bnb.functional.quantize_4bit(original.contiguous(), quant_type="nf4", compress_statistics=False)
        dequantized = bnb.functional.dequantize_4bit(layer.weight.data, layer.weight.quant_state)
        assert dequantized.dtype == dtype and torch.equal(dequantized, bnb.functional.dequantize_4bit(codes, state))
    trainable = {n for n, p in quantized.model.named_parameters() if p.requires_grad}
    assert trainable == {f"blocks.{i}.up.lora_{m}" for i in range(2) for m in "ab"}
    assert not any(p.requires_grad for layer in found.values() for p in layer.parameters())
    assert type(quantized.model.embed) is torch.nn.Embedding and quantized.model.embed.weight.dtype == dtype


def test_accumulated_adapter_gradients_of_a_function_models_4_bit_base_equal_one_batch():
    """Two micro-batches of 4 give the function model's adapters the gradient of one batch of 8 (its loss is a
    per-batch mean: gaplan averages the two)."""
    from gaplan.training.step import accumulate_gradients

    spec = WorkloadSpec(model=f"{FROZEN_BASE}:make", quantize="4bit")

    def adapter_grads(splits):
        workload = build_workload(spec, seed=0)
        with torch.no_grad():
            for name, p in workload.model.named_parameters():
                if "lora_b" in name:  # B starts at zero: a seeded non-zero B gives A a gradient too
                    p.normal_(0, 0.02, generator=torch.Generator().manual_seed(len(name)))
        torch.manual_seed(1)
        batch = workload.make_batch(8)
        starts = [sum(splits[:i]) for i in range(len(splits))]
        batches = [{k: v[s:s + n] for k, v in batch.items()} for s, n in zip(starts, splits, strict=True)]
        accumulate_gradients(workload.model, batches, workload.raw_loss, workload.task, workload.loss_is_scaled_for_ga)
        return {n: p.grad.clone() for n, p in workload.model.named_parameters() if p.requires_grad}

    full, split = adapter_grads([8]), adapter_grads([4, 4])
    assert set(full) == set(split) and len(full) == 4
    for name, grad in full.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(split[name], grad, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize(("fields", "message"), [
    (dict(model=f"{FROZEN_BASE}:make", quantize="nf4", parallel="fsdp"), "quantize nf4 with parallel fsdp"),
    (dict(model="tiny-llama", quantize="nf4"), "add lora \\(or give a module:function model"),
])
def test_quantize_without_lora_is_a_function_models_and_on_one_card(fields, message):
    with pytest.raises(GaplanError, match=message):
        WorkloadSpec(**fields).validate()
    WorkloadSpec(model=f"{FROZEN_BASE}:make", quantize="nf4").validate()


def test_quantize_of_a_function_model_without_a_frozen_linear_layer_or_with_a_tied_one_is_one_line():
    with pytest.raises(GaplanError, match="this model has none: freeze its base"):
        build_workload(WorkloadSpec(model="examples.custom_model:make_cnn", quantize="nf4"), seed=0)
    from gaplan.workload.quantize import quantized_layers

    model = torch.nn.ModuleDict({"embed": torch.nn.Embedding(8, 4), "head": torch.nn.Linear(4, 8, bias=False)})
    model.head.weight = model.embed.weight  # tied, as a language model's head often is
    model.requires_grad_(False)
    with pytest.raises(GaplanError, match="embed.weight and head.weight are one weight"):
        quantized_layers(model, own=True)


def test_a_function_models_layer_under_two_names_is_one_4_bit_layer_and_a_training_bias_still_trains():
    """The rule is the function model's own (frozen nn.Linear), also for a transformers model it returns: a layer
    whose bias trains keeps that bias trainable; a layer reached by two names is replaced at both."""
    from gaplan.workload.quantize import quantize_frozen_linears

    shared = torch.nn.Linear(64, 64)
    shared.weight.requires_grad_(False)  # the bias trains
    model = torch.nn.ModuleDict({"a": shared, "b": torch.nn.Sequential(shared), "head": torch.nn.Linear(64, 8)})
    model = quantize_frozen_linears(model, torch.device("cpu"), "nf4")
    assert model["a"] is model["b"][0] and isinstance(model["a"], bnb.nn.Linear4bit)
    assert model["a"].bias.requires_grad and type(model["head"]) is torch.nn.Linear  # the head trains: not 4-bit
    x = torch.randn(2, 64)
    model["head"](model["b"](model["a"](x))).sum().backward()
    assert model["a"].bias.grad is not None


def test_a_transformers_model_a_function_returns_takes_the_function_models_rule():
    """Every frozen nn.Linear, the head included, and not a layer that trains: not transformers' rule."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from gaplan.workload.quantize import quantized_layers

    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, vocab_size=64))
    model.requires_grad_(False)
    model.model.layers[0].self_attn.q_proj.requires_grad_(True)
    names = set(quantized_layers(model, own=True))
    projections = {f"model.layers.0.{part}" for part in ("self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                                         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert names == projections | {"lm_head"}
