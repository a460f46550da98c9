"""What a training task is, in one class: :class:`TaskComponent`. Each task subclasses it in a file of its own and
is listed once in :mod:`gaplan.data.tasks.registry`; nothing else in gaplan branches on a task's name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from gaplan.core.tasks import IGNORE_INDEX

if TYPE_CHECKING:
    import torch

# The options only some tasks take (their names as WorkloadSpec and DataSource spell them).
LOSS_CHUNKED = "loss_chunked"  # loss chunked: a language model's head over the vocabulary, run in chunks
TARGET_LEN = "target_len"  # the target (decoder) length
LABEL_FIELD = "label_field"  # the field a class label is read from
TARGET_FIELD = "target_field"  # the field a target text is read from
TASK_OPTIONS = (LOSS_CHUNKED, TARGET_LEN, LABEL_FIELD, TARGET_FIELD)


def batch_size(batch: Mapping[str, Any]) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    import torch

    first = next(v for v in batch.values() if isinstance(v, torch.Tensor))
    return int(first.shape[0])


class TaskComponent(ABC):
    """One training task: the model class it builds, the data it reads, its labels, its targets and its options.

    Class attributes (declarations, read without torch):
        name: the task's name (``--task``, plan.json's ``task``).
        selectable: whether ``--task`` may name it (``custom`` is what a ``module:function`` model trains as).
        auto_class: the transformers ``AutoModelFor*`` class that builds its model.
        peft_task_type: peft's ``task_type`` for LoRA adapters (it picks the wrapper class), or None.
        architecture_suffixes: a model class or config architecture whose name ends so is this task's model.
        encoder_decoder: an encoder-decoder config (``is_encoder_decoder``) is this task's model.
        reads: the data option naming the field read besides the text (``label_field``, ``target_field``), or None.
        options: which of :data:`TASK_OPTIONS` apply to it.
        needs_mask_token: its batches mask tokens, so the tokenizer needs a mask token.
        has_target: a sample is a source and a target (two lengths; the decoder's inputs come from the labels).
        has_class_label: a sample carries a class label.
    """

    name: ClassVar[str]
    selectable: ClassVar[bool] = True
    auto_class: ClassVar[str | None] = None
    peft_task_type: ClassVar[str | None] = None
    architecture_suffixes: ClassVar[tuple[str, ...]] = ()
    encoder_decoder: ClassVar[bool] = False
    reads: ClassVar[str | None] = None
    options: ClassVar[frozenset[str]] = frozenset()
    needs_mask_token: ClassVar[bool] = False
    has_target: ClassVar[bool] = False
    has_class_label: ClassVar[bool] = False

    @abstractmethod
    def add_labels(self, batch: dict[str, torch.Tensor], samples: Sequence[Any], seed: int,
                   mask_id: int | None) -> None:
        """Put the labels of ``samples`` into their padded ``batch`` (``input_ids``, ``attention_mask``); a task that
        changes the inputs (masked LM) changes them here."""

    @abstractmethod
    def fake_labels(self, ids: torch.Tensor, generator: torch.Generator, vocab_size: int, num_labels: int,
                    target_len: int | None) -> torch.Tensor:
        """The labels of a full-length random batch ``ids`` (what the probe and the estimate trace), drawn from
        ``generator``."""

    def model_inputs(self, module: Any, batch: Mapping[str, Any], inputs: dict[str, Any]) -> None:  # noqa: B027 - a hook most tasks leave as is
        """Add what the model's call needs besides the batch's inputs (the labels stay out: gaplan's loss is its own)."""

    def count_targets(self, batch: Mapping[str, Any]) -> int:
        """Prediction targets in one micro-batch, as the loss will count them: the labels that are not -100 (one
        item a sample for a batch without labels)."""
        if "labels" in batch:
            return int((batch["labels"] != IGNORE_INDEX).sum())
        return batch_size(batch)

    def count_step_targets(self, micro_batches: Iterable[Mapping[str, Any]]) -> int:
        """``num_items_in_batch`` of one optimizer step on this rank."""
        return sum(self.count_targets(mb) for mb in micro_batches)

    def loss_targets(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The target of each position of the logits (``IGNORE_INDEX`` where none), shaped like the labels."""
        return batch["labels"]
