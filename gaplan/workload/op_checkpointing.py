"""Op-level selective activation checkpointing (``--grad-checkpointing ops``), torchtitan's policy on torch's API.

Every block runs under ``torch.utils.checkpoint`` with a ``context_fn`` from
``torch.utils.checkpoint.create_selective_checkpoint_contexts``: for each op of the block's forward, the policy says
whether its output is saved for backward or recomputed. The policy is torchtitan's op-level one
(``torchtitan/distributed/activation_checkpoint.py``, ``_save_list`` and ``_custom_policy``): the outputs of the
matrix products are saved, but every second one, and the outputs of the attention kernels; everything else
(norms, activations, elementwise ops) is recomputed. torchtitan's models have no biases, so it counts ``aten.mm``;
here ``aten.addmm`` (a linear layer with a bias, GPT-2's ``Conv1D``) counts as one too.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_aten = torch.ops.aten
MATMULS = frozenset({_aten.mm.default, _aten.addmm.default})
ATTENTION = frozenset(getattr(_aten, name).default for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    if hasattr(_aten, name))


def op_policy() -> Callable[..., CheckpointPolicy]:
    """A fresh policy for one checkpointed call: its forward and its recomputation count matmuls apart, so both
    save the same ones."""
    matmuls: collections.Counter[str] = collections.Counter()

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in MATMULS:
            matmuls[mode] += 1
            return CheckpointPolicy.PREFER_RECOMPUTE if matmuls[mode] % 2 == 0 else CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.MUST_SAVE if func in ATTENTION else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def op_level_contexts() -> tuple[Any, Any]:
    """``torch.utils.checkpoint``'s ``context_fn`` for the op-level policy."""
    return create_selective_checkpoint_contexts(op_policy())
