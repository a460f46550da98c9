"""A language model with a frozen base and its own low-rank adapters, through the ``module:function`` hook.

    gaplan estimate --model examples.frozen_base:make --quantize nf4 --json
    gaplan probe --model examples.frozen_base:make --quantize nf4 --memory-limit 1GiB

The adapters are the model's own (two small matrices beside each frozen ``nn.Linear``, as LitGPT's LoRA layers hold
them), not peft's, so ``--lora`` does not apply; ``--quantize`` puts every frozen ``nn.Linear`` in bitsandbytes'
4-bit nf4 (the output head included, as Lightning Fabric's ``BitsandbytesPrecision`` converts every ``nn.Linear``),
each computing in its weight's dtype. ``make_bf16`` builds the same model in bf16, as a bf16-true run holds it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gaplan import CustomWorkload

VOCAB, HIDDEN, LAYERS, RANK, SEQ = 512, 128, 2, 8, 64


class AdaptedLinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update ``B @ A`` (B starts at zero)."""

    def __init__(self, inputs: int, outputs: int) -> None:
        super().__init__()
        self.linear = nn.Linear(inputs, outputs).requires_grad_(False)
        self.lora_a = nn.Parameter(torch.randn(RANK, inputs) / inputs**0.5)
        self.lora_b = nn.Parameter(torch.zeros(outputs, RANK))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + F.linear(F.linear(x, self.lora_a), self.lora_b)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN).requires_grad_(False)
        self.up = AdaptedLinear(HIDDEN, 4 * HIDDEN)
        self.down = nn.Linear(4 * HIDDEN, HIDDEN).requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class AdaptedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN).requires_grad_(False)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False).requires_grad_(False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_batch(size: int) -> dict[str, torch.Tensor]:
    return {"ids": torch.randint(0, VOCAB, (size, SEQ))}


def lm_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The next-token loss, a per-batch mean (gaplan divides it by the accumulation steps)."""
    logits = model(batch["ids"][:, :-1])
    return F.cross_entropy(logits.float().flatten(0, 1), batch["ids"][:, 1:].flatten())


def make() -> CustomWorkload:
    return CustomWorkload(model=AdaptedLM(), make_batch=make_batch, loss=lm_loss, loss_is_scaled_for_ga=False)


def make_bf16() -> CustomWorkload:
    return CustomWorkload(model=AdaptedLM().to(torch.bfloat16), make_batch=make_batch, loss=lm_loss,
                          loss_is_scaled_for_ga=False)
