"""Encoder-decoder (seq2seq-lm) specifics of a workload: its target length, and the decoder's inputs by the model's
own shift (the seq2seq-lm component's, :mod:`gaplan.data.tasks.seq2seq_lm`)."""

from __future__ import annotations

from gaplan.data.tasks.registry import task_component
from gaplan.data.tasks.seq2seq_lm import decoder_inputs
from gaplan.workload.spec import WorkloadSpec, default_target_len

__all__ = ["decoder_inputs", "target_length"]


def target_length(spec: WorkloadSpec, task: str, seq_len: int) -> int | None:
    """A seq2seq-lm workload's target (decoder) length: ``spec.target_len``, else half the source; None otherwise."""
    spec.check_target_len(task)
    if not task_component(task).has_target:
        return None
    return spec.target_len or default_target_len(seq_len)
