"""estimate.md's and gpu.md's figures that only a trace gives, re-traced: the CUDA allocator's unfilled shared
segments on tiny-gpt2, and a grouped-query Llama's activations a sample through math (fp32) and flash (bf16) on an
A10G. Fake tensors, so the same on every machine; each takes 5-7 s on 2 cores: heavy."""

from __future__ import annotations

import re

import pytest

from .test_docs_sources import flat

pytestmark = pytest.mark.heavy


def test_the_unfilled_segments_on_tiny_gpt2_are_todays():
    from gaplan.core.units import parse_bytes
    from gaplan.estimate import estimate
    from gaplan.workload.build import WorkloadSpec

    text = flat("docs/estimate.md")
    limit, shown = re.search(r"tiny-gpt2 at seq 32 on a 1 GiB card, `--memory-limit (\S+)`: ([\d.]+) MiB", text).groups()
    result = estimate(WorkloadSpec(model="tiny-gpt2", seq_len=32), memory_limit=parse_bytes(limit), effective_batch=256)
    unfilled = next(a for a in result.assumptions if a.topic == "allocator").values["unfilled_segment_bytes"]
    assert f"{unfilled / 2**20:.1f}" == shown
    assert f"the estimate adds {shown} MiB on tiny-gpt2 at seq 32" in flat("docs/gpu.md")


def test_a_grouped_query_llamas_activations_through_math_and_flash(tmp_path):
    import transformers

    from gaplan.estimate import estimate
    from gaplan.workload.spec import WorkloadSpec

    text = flat("docs/estimate.md")
    m = re.search(r"A (\d+)-layer Llama \(hidden (\d+), MLP (\d+), (\d+) heads, (\d+) key/value heads, vocab (\d+)\) at "
                  r"seq (\d+) on an A10G: ([\d.]+) MiB a sample in fp32 \(math\), ([\d.]+) MiB in bf16 \(flash\)", text)
    layers, hidden, mlp, heads, kv, vocab, seq = map(int, m.groups()[:7])
    transformers.LlamaConfig(hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                             max_position_embeddings=2 * seq).save_pretrained(tmp_path)
    for dtype, kernel, shown in (("fp32", "math", m.group(8)), ("bf16", "flash", m.group(9))):
        result = estimate(WorkloadSpec(model=str(tmp_path), seq_len=seq, dtype=dtype), target="a10g", effective_batch=8,
                          sizes=[1, 2])
        assert next(a for a in result.assumptions if a.topic == "attention").values["kernel"] == kernel
        assert f"{result.line[1] / 2**20:.1f}" == shown, dtype


def test_a_7b_shape_is_refused_on_an_h100_with_the_pages_bytes(tmp_path):
    """estimate.md: the Llama-2-7B shape at seq 128 in fp32 with AdamW needs 134.8 GB before activations on an H100
    80 GB (static bytes on the meta device: the same on every machine; ~5 s)."""
    import json

    from gaplan.core.errors import DoesNotFit
    from gaplan.estimate import estimate
    from gaplan.workload.build import WorkloadSpec

    from .estimate.test_estimator import LLAMA_7B_CONFIG

    text = flat("docs/estimate.md")
    params, seq, needed = re.search(r"A Llama-2-7B shape \(([\d.]+)B parameters, seq (\d+), fp32, AdamW\) is estimated "
                                    r"without allocating it: refused on an H100 80 GB \(([\d.]+) GB needed before "
                                    r"activations\)", text).groups()
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_7B_CONFIG))
    with pytest.raises(DoesNotFit) as refused:
        estimate(WorkloadSpec(model=str(tmp_path), seq_len=int(seq)), target="h100-80gb")
    assert f"{refused.value.needed_bytes / 1e9:.1f}" == needed
    assert params == "6.7"  # tests/estimate/test_estimator.py::test_a_7b_model_is_estimated_without_allocating_it
    #                         holds the model's count between 6.7e9 and 6.8e9
