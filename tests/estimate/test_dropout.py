"""Dropout on the ``cuda`` device model is traced as ATen's fused kernel runs it on a GPU: a bool mask kept for
backward, not the CPU's noise tensor of the input's dtype (gaplan.estimate.dropout)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gaplan.estimate import trace_steps
from gaplan.estimate.device import DeviceModel
from gaplan.workload.spec import WorkloadSpec


def saved_by(fn, x: torch.Tensor) -> list[tuple[torch.dtype, int]]:
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((t.dtype, t.numel())) or t, lambda t: t):
        fn(x * 1)
    return saved


def test_cuda_dropout_keeps_a_bool_mask_and_cpu_dropout_its_noise():
    x = torch.randn(64, 32, requires_grad=True)
    with DeviceModel("cuda").dropout():
        assert saved_by(lambda t: F.dropout(t, 0.1, training=True), x) == [(torch.bool, 64 * 32)]
        assert saved_by(lambda t: torch.nn.Dropout(0.1)(t), x) == [(torch.bool, 64 * 32)]
        assert saved_by(lambda t: torch.dropout(t, 0.1, True), x) == [(torch.bool, 64 * 32)]
        assert saved_by(lambda t: F.dropout(t, 0.1, training=False), x) == []  # eval: the input itself
    with DeviceModel("cpu").dropout():
        assert saved_by(lambda t: F.dropout(t, 0.1, training=True), x) == [(torch.float32, 64 * 32)]


def test_lora_dropout_costs_its_mask_and_its_output_on_cuda():
    """tiny-llama, LoRA on every linear layer, fp32: each adapted layer's dropout keeps at most its output (4 bytes an
    element, what lora_A saves) and a bool mask (1 byte) that p=0 does not; the CPU's dropout kept an fp32 noise
    tensor (4 bytes) instead of the mask. The peak's activations grow by 2.76 bytes an element of the adapters'
    inputs with the fix, 5.50 without it (the peak is not at the end of the forward, so not all of them count)."""
    batch, seq, layers, hidden, inner = 2, 128, 4, 256, 688  # the tiny-llama preset
    elements = batch * seq * layers * (6 * hidden + inner)  # q, k, v, o, gate, up take the hidden size, down inner

    def activations(dropout: float) -> int:
        spec = WorkloadSpec(model="tiny-llama", seq_len=seq, lora=True, lora_dropout=dropout,
                            lora_targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
        (row,) = trace_steps(spec, [batch], device_kind="cuda", threads=1)
        return row.activations

    per_element = (activations(0.1) - activations(0.0)) / elements
    assert 1 < per_element < 4, per_element
