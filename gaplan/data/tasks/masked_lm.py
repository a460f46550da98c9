"""masked-lm: 15% of the tokens replaced by the mask token and predicted (BERT)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from gaplan.core.tasks import IGNORE_INDEX, MASKED_LM
from gaplan.data.tasks.component import TaskComponent

MASK_FRACTION = 0.15


class MaskedLM(TaskComponent):
    name = MASKED_LM
    auto_class = "AutoModelForMaskedLM"
    architecture_suffixes = ("ForMaskedLM",)
    needs_mask_token = True

    def add_labels(self, batch: dict[str, Any], samples: Sequence[Any], seed: int, mask_id: int | None) -> None:
        """Masks :data:`MASK_FRACTION` of each sample's tokens (at least one, seeded per sample) by ``mask_id``."""
        import torch

        if mask_id is None:
            raise ValueError("masked LM needs a mask id: the tokenizer has no mask token")
        ids = batch["input_ids"]
        labels = torch.full_like(ids, IGNORE_INDEX)
        inputs = ids.clone()
        for row, sample in enumerate(samples):
            rng = random.Random(seed * 31 + hash(sample.ids) % 1_000_003)  # tuples of ints hash the same every run
            picks = [i for i in range(len(sample.ids)) if rng.random() < MASK_FRACTION] or [0]
            for i in picks:
                labels[row, i] = ids[row, i]
                inputs[row, i] = mask_id
        batch["input_ids"], batch["labels"] = inputs, labels

    def fake_labels(self, ids: Any, generator: Any, vocab_size: int, num_labels: int, target_len: int | None) -> Any:
        import torch

        labels = torch.full_like(ids, IGNORE_INDEX)
        masked = torch.rand(ids.shape, generator=generator) < MASK_FRACTION
        labels[masked] = ids[masked]
        return labels
