"""QLoRA's frozen base as the estimate models it: bitsandbytes' 4-bit nf4 weights with double quantization.

The trace runs the LoRA model with its base in ``--weights-dtype``; this takes the quantized layers' weights
from their traced bytes to 4-bit bytes, and gives the trace the dequantized copy a 4-bit layer makes for each of its
products, forward and backward (bitsandbytes' ``MatMul4Bit`` dequantizes, multiplies, and lets the copy go): a
workspace counted at that product's moment, over what is live then. The layers are those gaplan's QLoRA quantizes
(:func:`gaplan.workload.quantize.quantized_layers`, transformers' rule): every ``nn.Linear`` and GPT-2 ``Conv1D``
of the base but the output head, not the adapters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NF4_BLOCK = 64  # weights per absmax (bitsandbytes' nf4 default)
NESTED_BLOCK = 256  # absmaxes per fp32 scale of the second quantization (double quant)
# Per weight, with double quantization (--quantize 4bit): a 4-bit code, an 8-bit absmax per block, and an fp32 scale
# per NESTED_BLOCK absmaxes.
BYTES_PER_WEIGHT = 0.5 + 1 / NF4_BLOCK + 4 / (NF4_BLOCK * NESTED_BLOCK)
# Without it (--quantize nf4): a 4-bit code and an fp32 absmax per block (bitsandbytes' quantize_4bit with
# compress_statistics=False: ``absmax = torch.zeros((blocks,), dtype=torch.float32)``, kept as it is).
BYTES_PER_WEIGHT_NF4 = 0.5 + 4 / NF4_BLOCK
BYTES_PER_WEIGHT_OF = {"4bit": BYTES_PER_WEIGHT, "nf4": BYTES_PER_WEIGHT_NF4}


@dataclass(frozen=True)
class QuantizedBase:
    """What 4-bit quantization changes in a traced LoRA model's memory."""

    layers: int  # linear layers quantized
    traced_bytes: int  # their weights as traced (in --weights-dtype)
    quantized_bytes: int  # the same weights in 4-bit nf4 (with double quantization for --quantize 4bit)
    dequantized_bytes: int  # the largest layer's weight in the compute dtype: held while that layer computes
    # The traced weights' storages (views share them) -> the bytes of that layer's dequantized copy.
    copies: dict[int, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def saved_bytes(self) -> int:
        return self.traced_bytes - self.quantized_bytes

    def dequantized_copy(self, func: Any, args: tuple) -> int:
        """The workspace of ``func(*args)`` in the trace: a product of a 4-bit layer's weight holds its dequantized
        copy while it runs. A weight autocast has cast first is not matched: the traced cast is that copy."""
        from gaplan.estimate.device import product_operands

        operands = product_operands(func, args)
        return 0 if operands is None else max(self.copies.get(m.untyped_storage()._cdata, 0) for m in operands)


def quantized_base(model: Any, compute_bytes: int, quantize: str = "4bit") -> QuantizedBase:
    """The 4-bit accounting of ``model``'s frozen linear layers (a PeftModel: adapters and heads excluded)."""
    from gaplan.workload.quantize import quantized_layers

    weights = [module.weight for module in quantized_layers(model).values()]
    return QuantizedBase(layers=len(weights), traced_bytes=sum(w.numel() * w.element_size() for w in weights),
                         quantized_bytes=int(sum(w.numel() for w in weights) * BYTES_PER_WEIGHT_OF[quantize]),
                         dequantized_bytes=max((w.numel() for w in weights), default=0) * compute_bytes,
                         copies={w.untyped_storage()._cdata: w.numel() * compute_bytes for w in weights})
