"""The CUDA attention backend the estimate assumes, call by call (gaplan.estimate.attention)."""

from __future__ import annotations

import pytest

from gaplan.estimate.attention import cuda_sdpa_backend

BF16, FP16, FP32 = "torch.bfloat16", "torch.float16", "torch.float32"


@pytest.mark.parametrize("dtype, head, mask, grouped, backend", [
    (BF16, 64, False, False, "flash"),
    (FP16, 256, False, True, "flash"),  # flash broadcasts grouped-query heads
    (BF16, 512, False, False, "efficient"),  # flash stops at 256
    (BF16, 64, True, False, "efficient"),  # a mask tensor: not flash
    (FP32, 64, False, False, "efficient"),  # fp32: not flash
    (FP32, 64, False, True, "math"),  # fp32 with grouped-query heads: no fused kernel
    (BF16, 64, True, True, "math"),
    (BF16, 512, False, True, "math"),
    (FP32, 30, False, False, "math"),  # memory-efficient wants a head size that is a multiple of 4 (8 for half)
])
def test_pytorchs_cuda_rule(dtype, head, mask, grouped, backend):
    assert cuda_sdpa_backend(dtype, head, mask, grouped) == backend


def gqa_folder(path, kv_heads: int) -> str:
    import transformers

    transformers.LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=kv_heads, vocab_size=256,
                             max_position_embeddings=512).save_pretrained(path)
    return str(path)


@pytest.mark.slow
def test_an_fp32_grouped_query_model_is_traced_through_math_on_cuda_and_keeps_its_probabilities(tmp_path):
    """fp32 with 2 key/value heads for 4 query heads: math on CUDA, which keeps the seq x seq probabilities; with 4
    key/value heads the same model takes memory-efficient. The slopes differ by the probabilities, 2 layers x 4 heads x
    seq^2 x 4 bytes a sample, less what the fewer key/value heads save (their projections: 2 x seq x 64 x 4 bytes a
    layer, 6% of it here)."""
    from gaplan.estimate import estimate
    from gaplan.workload.spec import WorkloadSpec

    seq = 256
    slopes, kernels = {}, {}
    for kv in (2, 4):
        result = estimate(WorkloadSpec(model=gqa_folder(tmp_path / str(kv), kv), seq_len=seq), target="a10g",
                          effective_batch=8, sizes=[1, 2])
        slopes[kv] = result.line[1]
        kernels[kv] = next(a for a in result.assumptions if a.topic == "attention").values["kernel"]
    assert kernels == {2: "math", 4: "efficient"}
    probabilities = 2 * 4 * seq * seq * 4
    assert 0.9 * probabilities <= slopes[2] - slopes[4] <= 1.1 * probabilities, slopes
    bf16 = estimate(WorkloadSpec(model=str(tmp_path / "2"), seq_len=seq, dtype="bf16"), target="a10g",
                    effective_batch=8, sizes=[1, 2])
    attention = next(a for a in bf16.assumptions if a.topic == "attention")
    assert attention.values["kernel"] == "flash" and "flash (head size 32, bfloat16" in attention.text
