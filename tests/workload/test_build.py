"""Workloads built from a model directory: weights stay fp32 whatever the config's dtype says."""

import torch
import transformers

from gaplan.workload.build import WorkloadSpec, build_workload


def test_a_float16_config_still_trains_fp32_weights(tmp_path):
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
                                      architectures=["LlamaForCausalLM"], dtype="float16")
    config.save_pretrained(tmp_path)
    workload = build_workload(WorkloadSpec(model=str(tmp_path), seq_len=16, dtype="bf16"), "cpu")
    assert {p.dtype for p in workload.model.parameters()} == {torch.float32}  # bf16 is autocast, not the weights
    assert workload.task == "causal-lm" and workload.seq_len == 16
