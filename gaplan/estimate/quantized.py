"""QLoRA's frozen base as the estimate models it: bitsandbytes' 4-bit nf4 weights with double quantization.

The trace runs the LoRA model with its base in ``--weights-dtype``; this takes the quantized layers' weights
from their traced bytes to 4-bit bytes, and adds the dequantized compute copy a 4-bit layer makes in forward and in
backward, of one layer at a time (the largest counts). The layers are those gaplan's QLoRA quantizes
(:func:`gaplan.workload.quantize.quantized_layers`, transformers' rule): every ``nn.Linear`` and GPT-2 ``Conv1D``
of the base but the output head, not the adapters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NF4_BLOCK = 64  # weights per absmax (bitsandbytes' nf4 default)
NESTED_BLOCK = 256  # absmaxes per fp32 scale of the second quantization (double quant)
# Per weight: a 4-bit code, an 8-bit absmax per block, and an fp32 scale per NESTED_BLOCK absmaxes.
BYTES_PER_WEIGHT = 0.5 + 1 / NF4_BLOCK + 4 / (NF4_BLOCK * NESTED_BLOCK)


@dataclass(frozen=True)
class QuantizedBase:
    """What 4-bit quantization changes in a traced LoRA model's memory."""

    layers: int  # linear layers quantized
    traced_bytes: int  # their weights as traced (in --weights-dtype)
    quantized_bytes: int  # the same weights in 4-bit nf4 with double quantization
    dequantized_bytes: int  # the largest layer's weight in the compute dtype: held while that layer computes

    @property
    def saved_bytes(self) -> int:
        return self.traced_bytes - self.quantized_bytes


def quantized_base(model: Any, compute_bytes: int) -> QuantizedBase:
    """The 4-bit accounting of ``model``'s frozen linear layers (a PeftModel: adapters and heads excluded)."""
    from gaplan.workload.quantize import quantized_layers

    weights = [module.weight for module in quantized_layers(model).values()]
    return QuantizedBase(layers=len(weights), traced_bytes=sum(w.numel() * w.element_size() for w in weights),
                         quantized_bytes=int(sum(w.numel() for w in weights) * BYTES_PER_WEIGHT),
                         dequantized_bytes=max((w.numel() for w in weights), default=0) * compute_bytes)
