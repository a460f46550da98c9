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
        # the tensors' slope: without the allocator's segments, which need not grow with the micro-batch
        tensors = {r.micro_batch: r.peak_bytes - r.unfilled_segment_bytes for r in result.rows
                   if r.phase == "micro-steps"}
        assert f"{(tensors[2] - tensors[1]) / 2**20:.1f}" == shown, dtype


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
                                    r"activations: counted on the meta device", text).groups()
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_7B_CONFIG))
    with pytest.raises(DoesNotFit) as refused:
        estimate(WorkloadSpec(model=str(tmp_path), seq_len=int(seq)), target="h100-80gb")
    assert f"{refused.value.needed_bytes / 1e9:.1f}" == needed
    assert params == "6.7"  # tests/estimate/test_estimator.py::test_a_7b_model_is_estimated_without_allocating_it
    #                         holds the model's count between 6.7e9 and 6.8e9


def test_the_autograd_node_counts_are_the_traces(tmp_path):
    """estimate.md's heap paragraphs count a micro-step's autograd nodes on zoo models: GPT-2 205, T5 with LoRA 1,269,
    Llama 326 (full) and 600 (LoRA), BART 617. The count is the trace's (the CPU estimate's `cpu-process`
    assumption), independent of the machine; the heap bytes beside them are dated hand measurements."""
    from gaplan.estimate import estimate
    from gaplan.workload.spec import WorkloadSpec

    from .estimate.zoo import SEQ_LEN, zoo_configs

    text = flat("docs/estimate.md")
    gpt2, t5 = re.search(r"1\.5 MiB for GPT-2 \(([\d,]+) nodes per micro-step\) and 4\.7 MiB for T5 with LoRA "
                         r"\(([\d,]+) nodes\)", text).groups()
    llama, llama_lora = re.search(r"at ([\d,]+) nodes \(full\) and 1\.7-1\.8 MiB at ([\d,]+) \(LoRA\)", text).groups()
    bart = re.search(r"BART's full fine-tuning holds 1\.7 MiB more than its ([\d,]+) nodes", text).group(1)
    for (family, lora), shown in {("gpt2", False): gpt2, ("t5", True): t5, ("llama", False): llama,
                                  ("llama", True): llama_lora, ("bart", False): bart}.items():
        folder = tmp_path / f"{family}-{lora}"
        zoo_configs()[family].save_pretrained(folder)
        spec = WorkloadSpec(model=str(folder), seq_len=SEQ_LEN, lora=lora, lora_targets="all-linear" if lora else None)
        result = estimate(spec, device_kind="cpu", memory_limit=2**30, threads=2, effective_batch=16, search_cap=2)
        nodes = next(a for a in result.assumptions if a.topic == "cpu-process").values["graph_nodes"]
        assert f"{nodes:,}" == shown, (family, lora)
