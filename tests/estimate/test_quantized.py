"""QLoRA's 4-bit base as the estimate models it: nf4 with or without double quantization, and the inputs an old
bitsandbytes' ``MatMul4Bit`` keeps (gaplan/estimate/quantized.py)."""

from __future__ import annotations

import pytest

from gaplan.estimate.estimator import make_tracer
from gaplan.estimate.quantized import BYTES_PER_WEIGHT, BYTES_PER_WEIGHT_NF4, QLoRARun
from gaplan.workload.build import WorkloadSpec, build_workload

pytest.importorskip("peft")

FIELDS = dict(model="tiny-llama", seq_len=64, lora=True, weights_dtype="bf16", dtype="bf16")


def test_nf4_without_double_quantization_is_an_fp32_absmax_per_64_weights():
    assert BYTES_PER_WEIGHT_NF4 == 0.5 + 4 / 64
    quantized, static = {}, {}
    for quantize in ("nf4", "4bit"):
        with make_tracer(WorkloadSpec(**FIELDS, quantize=quantize).validate(), "cuda", None, 1) as tracer:
            quantized[quantize], static[quantize] = tracer.quantized.quantized_bytes, tracer.static_bytes()
    weights = 4 * (4 * 256 * 256 + 3 * 256 * 688)  # tiny-llama's q, k, v, o and gate, up, down; not lm_head
    assert quantized["nf4"] == int(weights * BYTES_PER_WEIGHT_NF4)
    assert quantized["4bit"] == int(weights * BYTES_PER_WEIGHT)
    assert static["nf4"] - static["4bit"] == quantized["nf4"] - quantized["4bit"]


def test_bitsandbytes_before_0_43_2_keeps_the_4_bit_products_inputs():
    assert QLoRARun(bitsandbytes="0.42.0").keeps_inputs
    assert QLoRARun(bitsandbytes="0.43.1").keeps_inputs
    assert not QLoRARun(bitsandbytes="0.43.2").keeps_inputs
    assert not QLoRARun().keeps_inputs  # gaplan's own build needs 0.46.1


def test_an_old_bitsandbytes_keeps_each_input_that_needs_a_gradient_once_and_a_held_graph_adds_the_last_steps():
    spec = WorkloadSpec(**{**FIELDS, "seq_len": 256}, quantize="nf4")
    peaks = {}
    for name, run in [("own", None), ("0.42", QLoRARun(bitsandbytes="0.42.0")),
                      ("held", QLoRARun(bitsandbytes="0.42.0", graph_held_to_next_forward=True))]:
        with make_tracer(spec, "cuda", None, 1, run) as tracer:
            peaks[name] = tracer.micro_steps(8).tracked_total
            kept = tracer.kept_inputs.kept_bytes if tracer.kept_inputs is not None else None
        if name == "own":
            assert kept is None
        else:
            # Per token, in bf16: each block's o_proj input (256), MLP norm output (256, gate and up read it once)
            # and down_proj input (688); the attention norm output (256) in blocks 1-3 only: block 0's reads the
            # frozen embedding and needs no gradient (q, k and v read one tensor).
            assert kept == 8 * 256 * 2 * (4 * (256 + 256 + 688) + 3 * 256)
    assert peaks["0.42"] > peaks["own"]
    assert peaks["held"] > peaks["0.42"]


def test_nf4_builds_without_double_quantization():
    bnb = pytest.importorskip("bitsandbytes")
    import torch

    from gaplan.workload.quantize import quantization_config

    assert quantization_config(torch.bfloat16, "nf4").bnb_4bit_use_double_quant is False
    assert quantization_config(torch.bfloat16, "4bit").bnb_4bit_use_double_quant is True
    model = build_workload(WorkloadSpec(model="tiny-llama", seq_len=32, lora=True, quantize="nf4"), "cpu").model
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(layers) == 4 * 7
    assert all(not m.weight.quant_state.nested and m.weight.quant_type == "nf4" for m in layers)
