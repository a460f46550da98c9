"""Checkpointed blocks recomputed under the torch-function modes of their forward (gaplan.estimate.recompute)."""

from __future__ import annotations

import pytest

from gaplan.core.checkpointing import ON
from gaplan.estimate import trace_steps
from gaplan.workload.build import WorkloadSpec


def _upcasting_softmax_mode(seen: list[str]):
    """A torch-function mode that runs softmax in float32 under autocast, as the CUDA device model does."""
    import torch
    from torch.overrides import TorchFunctionMode

    class _Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", None) == "softmax" and torch.is_autocast_enabled("cpu"):
                seen.append("softmax")
                args = (args[0].float(), *args[1:])
            return func(*args, **(kwargs or {}))

    return _Mode()


def test_the_recomputation_runs_under_the_forwards_torch_function_modes():
    """A mode that handles ``Tensor.backward`` is off for the whole backward, the recomputation included: without
    the forward's modes re-entered, the recomputed softmax is fp16 where the saved one was fp32 (torch's
    CheckpointError)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    from gaplan.estimate.recompute import recompute_under_forward_modes

    linear = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    seen: list[str] = []
    with recompute_under_forward_modes(), _upcasting_softmax_mode(seen), torch.autocast("cpu", dtype=torch.float16):
        y = checkpoint(lambda t: torch.nn.functional.softmax(linear(t), dim=-1) * 2, x, use_reentrant=False)
        y.sum().backward()
    assert seen == ["softmax", "softmax"]  # the forward, then the recomputation
    assert x.grad is not None and x.grad.dtype == torch.float32


def bert_folder(path) -> str:
    """A two-layer BERT: the smallest model whose eager attention keeps its probabilities for backward."""
    import transformers

    transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                            vocab_size=256, max_position_embeddings=64).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("dtype", ["fp16", pytest.param("bf16", marks=pytest.mark.heavy)])
def test_eager_attention_with_autocast_and_checkpointing_traces_for_cuda(dtype, tmp_path):
    """BERT's eager attention: the probabilities are fp32 under CUDA autocast (softmax is on its fp32 list), in the
    forward and in the recomputation alike; checkpointing keeps less than no checkpointing."""
    spec = dict(model=bert_folder(tmp_path), seq_len=64, attention="eager", dtype=dtype)
    (checkpointed,) = trace_steps(WorkloadSpec(**spec, grad_checkpointing=ON), [2], device_kind="cuda")
    (kept,) = trace_steps(WorkloadSpec(**spec), [2], device_kind="cuda")
    assert checkpointed.activations < kept.activations
