"""Which kernel CUDA's ``scaled_dot_product_attention`` would take, call by call, and tracing it so.

A CPU trace runs SDPA through the CPU's flash kernel, which keeps what CUDA's fused kernels keep (the output and a
log-sum-exp, no seq x seq probabilities). On CUDA PyTorch picks a backend per call: flash for fp16/bf16 with a head
size up to 256 (a multiple of 8) and no mask tensor; else memory-efficient, which takes fp32 and masks but not the
grouped-query broadcast (``enable_gqa`` with fewer key/value heads); else math, which keeps the seq x seq
probabilities. transformers passes ``enable_gqa`` for a grouped-query model whenever the batch needs no mask, so an
fp32 Llama-style model trains through math on CUDA (pytorch/pytorch#181528 has the diagnosis). Under the ``cuda``
device model every SDPA call is decided here, and a math call is traced through ``aten._scaled_dot_product_attention_math``,
so its probabilities are counted.
"""

from __future__ import annotations

from typing import NamedTuple

HALF_DTYPES = ("torch.float16", "torch.bfloat16")


class AttentionCall(NamedTuple):
    """One SDPA call as CUDA would see it, and the backend it would take."""

    head_size: int
    dtype: str  # the dtype CUDA would run it in (autocast's, under mixed precision)
    mask: bool  # an attn_mask tensor was passed (is_causal alone is no mask)
    grouped: bool  # enable_gqa with fewer key/value heads than query heads
    backend: str  # "flash", "efficient" or "math"


def cuda_sdpa_backend(dtype: str, head_size: int, mask: bool, grouped: bool) -> str:
    """The backend PyTorch's CUDA SDPA takes for these inputs (flash, then memory-efficient, then math)."""
    half = dtype in HALF_DTYPES
    if half and head_size <= 256 and head_size % 8 == 0 and not mask:
        return "flash"
    if not grouped and head_size % (8 if half else 4) == 0:
        return "efficient"
    return "math"


class CudaAttention:
    """A torch-function mode that decides each SDPA call by :func:`cuda_sdpa_backend` and traces math calls as math.

    ``calls``: the distinct calls seen, added to the set given (the trace helper's, for the assumption)."""

    def __init__(self, calls: set[AttentionCall]) -> None:
        import torch
        import torch.nn.functional as F
        from torch.overrides import TorchFunctionMode

        owner = self
        self.calls = calls

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is not F.scaled_dot_product_attention:
                    return func(*args, **kwargs)
                return owner.attend(*args, **kwargs)

        self._mode = _Mode()
        self._sdpa = F.scaled_dot_product_attention
        self._math = torch.ops.aten._scaled_dot_product_attention_math

    def attend(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
        import torch

        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else query.dtype
        grouped = bool(enable_gqa) and key.shape[-3] != query.shape[-3]
        call = AttentionCall(int(query.shape[-1]), str(dtype), attn_mask is not None, grouped,
                             cuda_sdpa_backend(str(dtype), int(query.shape[-1]), attn_mask is not None, grouped))
        self.calls.add(call)
        if call.backend != "math":
            return self._sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                              scale=scale, enable_gqa=enable_gqa)
        if torch.is_autocast_enabled("cpu"):  # math runs in the autocast dtype, as SDPA does under CUDA autocast
            query, key, value = (t.to(dtype) for t in (query, key, value))
        output, _ = self._math(query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale,
                               enable_gqa=enable_gqa)
        return output

    def __enter__(self) -> CudaAttention:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)


def describe_calls(calls: set[AttentionCall]) -> str:
    """``flash (head size 64, torch.bfloat16, no mask)``, one clause per distinct call, for the assumption."""
    parts = []
    for call in sorted(calls, key=lambda c: (c.backend, c.head_size, c.dtype, c.mask, c.grouped)):
        what = [f"head size {call.head_size}", call.dtype.replace("torch.", ""), "a mask" if call.mask else "no mask"]
        if call.grouped:
            what.append("grouped-query heads")
        parts.append(f"{call.backend} ({', '.join(what)})")
    return "; ".join(parts)
