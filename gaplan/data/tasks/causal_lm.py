"""causal-lm: next-token prediction (GPT-2, Llama); the labels are the inputs, shifted by one in the loss."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gaplan.core.tasks import CAUSAL_LM, IGNORE_INDEX
from gaplan.data.tasks.component import LOSS_CHUNKED, TaskComponent


class CausalLM(TaskComponent):
    name = CAUSAL_LM
    auto_class = "AutoModelForCausalLM"
    peft_task_type = "CAUSAL_LM"
    architecture_suffixes = ("ForCausalLM", "LMHeadModel")
    options = frozenset({LOSS_CHUNKED})

    def add_labels(self, batch: dict[str, Any], samples: Sequence[Any], seed: int, mask_id: int | None) -> None:
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)

    def fake_labels(self, ids: Any, generator: Any, vocab_size: int, num_labels: int, target_len: int | None) -> Any:
        return ids.clone()

    def count_targets(self, batch: Mapping[str, Any]) -> int:
        """Position 0 has no target (the labels shift), unless the batch carries ``shift_labels``."""
        if "shift_labels" in batch:
            return int((batch["shift_labels"] != IGNORE_INDEX).sum())
        return int((batch["labels"][..., 1:] != IGNORE_INDEX).sum())

    def loss_targets(self, batch: Mapping[str, Any]) -> Any:
        import torch.nn.functional as F

        if "shift_labels" in batch:
            return batch["shift_labels"]
        # Shift the labels, not the logits (as transformers does): slicing off the last position
        # makes the flattened logits a copy, and its backward another; that cost 10% of a tiny-gpt2 step.
        return F.pad(batch["labels"][..., 1:], (0, 1), value=IGNORE_INDEX)
