"""Encoder-decoder (seq2seq-lm) specifics of a workload: its target length, and the decoder's inputs by the model's
own shift."""

from __future__ import annotations

import torch
from torch import nn

from gaplan.core.tasks import SEQ2SEQ_LM
from gaplan.workload.spec import WorkloadSpec, default_target_len


def target_length(spec: WorkloadSpec, task: str, seq_len: int) -> int | None:
    """A seq2seq-lm workload's target (decoder) length: ``spec.target_len``, else half the source; None otherwise."""
    spec.check_target_len(task)
    if task != SEQ2SEQ_LM:
        return None
    return spec.target_len or default_target_len(seq_len)


def decoder_inputs(module: nn.Module, labels: torch.Tensor) -> torch.Tensor:
    """The decoder's inputs for ``labels``, by the model's own shift (``prepare_decoder_input_ids_from_labels``:
    the start token, then the labels less the last, -100 made the pad token), through DDP's and peft's wrappers."""
    while not hasattr(module, "prepare_decoder_input_ids_from_labels") and hasattr(module, "module"):
        module = module.module
    return module.prepare_decoder_input_ids_from_labels(labels=labels)
