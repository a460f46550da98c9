"""The chunked loss (``loss="chunked[:TOKENS]"``): the LM head and cross-entropy a chunk of positions at a time.

A language model's head makes ``[B, T, V]`` logits, and the loss adds fp32 copies of them (the log-softmax and its
gradient): at V = 32k-128k more than the blocks hold on small and mid-size models. Here the model runs with its
output head passed through, so it returns the head's input, the ``[B, T, H]`` hidden states; the positions are then
taken ``TOKENS`` at a time (across the micro-batch's samples), each chunk's logits made by the head itself, upcast and
reduced to a summed cross-entropy under ``torch.utils.checkpoint``: only the chunk's scalar is kept, and backward
makes the chunk's logits again. At most one chunk's logits exist at a time, in forward and in backward.

It is the plain loss's number: the same targets (the causal shift, ``shift_labels``, ``IGNORE_INDEX``), summed, and
divided by the same ``num_items_in_batch`` (:func:`gaplan.workload.loss.normalized_loss`); only the order of fp32
sums differs. The price: one more head product per position in backward.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from gaplan.core.constants import MiB
from gaplan.core.errors import GaplanError
from gaplan.core.tasks import IGNORE_INDEX
from gaplan.workload.loss import loss_targets

# ``chunked`` without TOKENS: chunks whose fp32 logits take at most this much (a power of two of positions), so the
# loss's memory no longer grows with the micro-batch: 128 positions at V = 32,000, 32 at Llama 3's 128,256.
DEFAULT_CHUNK_LOGITS_BYTES = 16 * MiB


def default_chunk_tokens(vocab_size: int) -> int:
    """Positions a chunk when ``chunked`` names none: a power of two whose fp32 logits fit the default bytes."""
    fits = max(1, DEFAULT_CHUNK_LOGITS_BYTES // (4 * max(vocab_size, 1)))
    return 2 ** int(math.log2(fits))


def output_head(model: nn.Module) -> nn.Module:
    """The model's output head (``get_output_embeddings``), through a DDP or peft wrapper; a one-line error when the
    model has none, or adds to the head's output (BART's ``final_logits_bias``)."""
    inner = getattr(model, "module", model) if isinstance(model, nn.parallel.DistributedDataParallel) else model
    getter = getattr(inner, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if not isinstance(head, nn.Module):
        raise GaplanError(f"loss chunked needs a model with an output head (get_output_embeddings); "
                          f"{type(inner).__name__} has none: use loss plain")
    if any(name.endswith("final_logits_bias") for name, _ in inner.named_buffers()):
        raise GaplanError(f"loss chunked: {type(inner).__name__} adds a bias to its head's output (final_logits_bias), "
                          "which a chunk of the head alone would leave out: use loss plain")
    return head


@contextlib.contextmanager
def head_passed_through(head: nn.Module) -> Iterator[tuple[list[torch.Tensor], Callable[..., torch.Tensor]]]:
    """Inside, ``head`` returns its input unchanged. Yields the list of what it was given and the head's own forward
    (an instance attribute set by someone else, such as accelerate's hooks, is kept and put back)."""
    seen: list[torch.Tensor] = []
    own_forward = head.forward
    previous = head.__dict__.get("forward")

    def passthrough(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(hidden)
        return hidden

    head.forward = passthrough  # an instance attribute: nn.Module.__call__ finds it before the class's forward
    try:
        yield seen, own_forward
    finally:
        if previous is None:
            del head.forward
        else:
            head.forward = previous


def _chunk_loss(head_forward: Callable[..., torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head_forward(hidden)
    return F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_token_loss(module: nn.Module, inputs: Mapping[str, Any], batch: Mapping[str, Any], task: str,
                       chunk_tokens: int) -> torch.Tensor:
    """The summed cross-entropy of one micro-batch (as :func:`gaplan.workload.loss.summed_token_loss` of the model's
    logits), the head and the loss run ``chunk_tokens`` positions at a time and recomputed in backward."""
    head = output_head(module)
    with head_passed_through(head) as (seen, head_forward):
        output = module(**inputs)
    hidden = output.logits
    if not seen or hidden is not seen[-1]:
        raise GaplanError(f"loss chunked: {type(getattr(module, 'module', module)).__name__} changes its logits after "
                          "the output head (a scale, a bias or a softcap), which a chunk of the head alone would leave "
                          "out: use loss plain")
    flat = hidden.reshape(-1, hidden.shape[-1])
    targets = loss_targets(batch, task).reshape(-1).to(flat.device)
    if targets.shape[0] != flat.shape[0]:
        raise GaplanError(f"loss chunked: {targets.shape[0]} targets for {flat.shape[0]} positions")
    # The head's forward, called directly for each chunk (its module hooks ran once, in the model's call), inside
    # _Chunks' call: torch's MemTracker, which the estimate traces with, takes a module called again outside any
    # parent for a new iteration, and a LoRA head calls its adapters and base layer (modules) once a chunk. One
    # instance for all calls: the tracker keeps a weak reference to it until backward, which a fresh one per call
    # does not outlive ("Module is None. Skipping PRE_BW hook").
    return _CHUNKS(functools.partial(_chunk_loss, head_forward), flat, targets, chunk_tokens)


class _Chunks(nn.Module):
    """The chunks' summed losses, each under ``checkpoint``; a module so that what it calls has a parent."""

    def forward(self, step: Callable[..., torch.Tensor], flat: torch.Tensor, targets: torch.Tensor,
                chunk_tokens: int) -> torch.Tensor:
        total = None
        for hidden_chunk, target_chunk in zip(flat.split(chunk_tokens), targets.split(chunk_tokens), strict=True):
            loss = checkpoint(step, hidden_chunk, target_chunk, use_reentrant=False)
            total = loss if total is None else total + loss
        return total


_CHUNKS = _Chunks()
