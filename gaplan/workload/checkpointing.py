"""Turning activation checkpointing on for all of a model's transformer blocks, or some (every:K, layers:N).

transformers enables it on every block: each decoder (and encoder) block is a ``GradientCheckpointingLayer`` whose
``gradient_checkpointing`` flag decides, at each forward, whether the block runs under ``torch.utils.checkpoint``.
For a selective choice, gaplan enables it as for ``on`` and then clears the flag of the blocks left out, so the
same code path (the checkpoint function, the input gradients it needs) serves both. ``ops`` enables it as for ``on``
with the op-level policy as the checkpoint's ``context_fn`` (:mod:`gaplan.workload.op_checkpointing`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gaplan.core.checkpointing import Checkpointing
from gaplan.core.errors import GaplanError

if TYPE_CHECKING:
    from torch import nn


def checkpointing_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's checkpointable blocks (transformers' ``GradientCheckpointingLayer``), in module order."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # a transformers before per-block layers: no block to choose
        return []
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def apply_checkpointing(model: nn.Module, checkpointing: Checkpointing, name: str) -> None:
    """Recompute the chosen blocks' activations in backward (non-reentrant, the variant that works with accumulation).

    ``name`` is the model as the user gave it, for the one-line errors: a model transformers cannot checkpoint, a
    selective choice on a model without per-block layers, K or N larger than its blocks.
    """
    if not checkpointing.enabled:
        return
    blocks = checkpointing_blocks(model)
    if checkpointing.selective and not (blocks and hasattr(model, "gradient_checkpointing_enable")):
        raise GaplanError(f"--grad-checkpointing {checkpointing}: {name} has no per-block checkpointing layers "
                          "(transformers' GradientCheckpointingLayer) to choose from; use on or off")
    if not hasattr(model, "gradient_checkpointing_enable"):
        raise GaplanError("--grad-checkpointing needs a transformers model (one with gradient_checkpointing_enable)")
    chosen = checkpointing.blocks(len(blocks))  # before enabling: a bad K or N changes nothing
    enable_checkpointing(model, op_level=checkpointing.op_level)
    for block, on in zip(blocks, chosen, strict=True):
        block.gradient_checkpointing = on


def enable_checkpointing(model: nn.Module, op_level: bool = False) -> None:
    """Checkpoint every block, non-reentrant (``op_level``: with the op-level policy).

    transformers 5 renamed ``gradient_checkpointing_enable`` (deprecated, warns) to
    ``activation_checkpointing_enable``; older versions only have the first. Both pass the kwargs to
    ``torch.utils.checkpoint.checkpoint``.
    """
    kwargs: dict = {"use_reentrant": False}
    if op_level:
        from gaplan.workload.op_checkpointing import op_level_contexts

        kwargs["context_fn"] = op_level_contexts
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
