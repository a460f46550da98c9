"""classification: one class label a sample, predicted from the whole sequence (a sequence classifier's head)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gaplan.core.tasks import CLASSIFICATION
from gaplan.data.tasks.component import LABEL_FIELD, TaskComponent


class Classification(TaskComponent):
    name = CLASSIFICATION
    auto_class = "AutoModelForSequenceClassification"
    peft_task_type = "SEQ_CLS"
    architecture_suffixes = ("ForSequenceClassification",)
    reads = LABEL_FIELD
    options = frozenset({LABEL_FIELD})
    has_class_label = True

    def add_labels(self, batch: dict[str, Any], samples: Sequence[Any], seed: int, mask_id: int | None) -> None:
        import torch

        batch["labels"] = torch.tensor([s.label for s in samples])

    def fake_labels(self, ids: Any, generator: Any, vocab_size: int, num_labels: int, target_len: int | None) -> Any:
        import torch

        return torch.randint(0, num_labels, (ids.shape[0],), generator=generator)
