"""seq2seq-lm: an encoder-decoder (T5, BART, Pegasus); the loss is over the decoder's target tokens, the decoder's
inputs are the targets by the model's own shift."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gaplan.core.tasks import IGNORE_INDEX, SEQ2SEQ_LM
from gaplan.data.tasks.component import LOSS_CHUNKED, TARGET_FIELD, TARGET_LEN, TaskComponent


def decoder_inputs(module: Any, labels: Any) -> Any:
    """The decoder's inputs for ``labels``, by the model's own shift (``prepare_decoder_input_ids_from_labels``:
    the start token, then the labels less the last, -100 made the pad token), through DDP's and peft's wrappers."""
    while not hasattr(module, "prepare_decoder_input_ids_from_labels") and hasattr(module, "module"):
        module = module.module
    return module.prepare_decoder_input_ids_from_labels(labels=labels)


class Seq2SeqLM(TaskComponent):
    name = SEQ2SEQ_LM
    auto_class = "AutoModelForSeq2SeqLM"
    peft_task_type = "SEQ_2_SEQ_LM"
    encoder_decoder = True
    reads = TARGET_FIELD
    options = frozenset({LOSS_CHUNKED, TARGET_LEN, TARGET_FIELD})
    has_target = True

    def add_labels(self, batch: dict[str, Any], samples: Sequence[Any], seed: int, mask_id: int | None) -> None:
        """The targets padded with -100 to the longest target."""
        import torch

        labels = torch.full((len(samples), max(len(s.target) for s in samples)), IGNORE_INDEX, dtype=torch.long)
        for row, sample in enumerate(samples):
            labels[row, : len(sample.target)] = torch.tensor(sample.target, dtype=torch.long)
        batch["labels"] = labels

    def fake_labels(self, ids: Any, generator: Any, vocab_size: int, num_labels: int, target_len: int | None) -> Any:
        import torch

        return torch.randint(0, vocab_size, (ids.shape[0], target_len or ids.shape[1]), generator=generator)

    def model_inputs(self, module: Any, batch: Mapping[str, Any], inputs: dict[str, Any]) -> None:
        if "decoder_input_ids" not in inputs:  # a collator given the model (DataCollatorForSeq2Seq) made them already
            inputs["decoder_input_ids"] = decoder_inputs(module, batch["labels"])
