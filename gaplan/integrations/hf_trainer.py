"""``GaplanTrainer``: a Hugging Face ``Trainer`` whose loss is token-exact under gradient accumulation.

Each micro-batch's loss is the *sum* of its token losses divided by ``num_items_in_batch``, the prediction targets
of all micro-batches of the optimizer step on all ranks, counted by gaplan's rule (causal LM:
``labels[..., 1:] != -100``, or ``shift_labels``). So the accumulated gradient is the large-batch gradient
whatever the padding. It follows the ``Trainer``'s own switches the way the ``Trainer`` does:

* ``compute_loss_func(outputs, labels, num_items_in_batch=...)`` is called with gaplan's count (the model is run
  without labels, as the ``Trainer`` runs it), and its loss taken as scaled for accumulation;
* ``model_accepts_loss_kwargs = False`` (set after construction, as transformers' own tests do) makes the loss
  each micro-batch's mean, divided by the accumulation steps: the ``Trainer``'s path without a count;
* evaluation counts each batch's targets by gaplan's rule too, so ``eval_loss`` is the exact mean over the
  shifted targets (the stock ``Trainer`` counts position 0 of a GPT-2 batch as a target);
* ``label_smoothing_factor`` is refused at construction, in one line: gaplan's loss is plain cross-entropy.

Defined on first use (:func:`trainer_class`), since it subclasses ``transformers.Trainer``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

from gaplan.core.errors import GaplanError

# Batch keys that are targets or bookkeeping, never model inputs.
NOT_INPUTS = ("labels", "shift_labels", "num_items_in_batch")


@functools.lru_cache(maxsize=1)
def trainer_class() -> type:
    """Define ``GaplanTrainer`` (importing transformers and torch) on first use."""
    import torch
    from torch import nn
    from transformers import Trainer

    from gaplan.core.tasks import TASKS
    from gaplan.integrations.transformers import infer_task
    from gaplan.workload.loss import count_step_targets, count_targets, summed_token_loss

    class GaplanTrainer(Trainer):
        """A ``Trainer`` with gaplan's token-exact loss under gradient accumulation (see
        :mod:`gaplan.integrations.hf_trainer`).

        Args:
            task: ``causal-lm``, ``masked-lm`` or ``classification``; default: from the model's class.
            Everything else as ``transformers.Trainer``. Batches need ``labels`` (or ``shift_labels``).
        """

        def __init__(self, *args: Any, task: str | None = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if task is not None and task not in TASKS:
                raise GaplanError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
            if self.label_smoother is not None:
                raise GaplanError(f"GaplanTrainer's loss is plain cross-entropy: label_smoothing_factor "
                                  f"{self.args.label_smoothing_factor} is not applied (use 0, or the stock Trainer)")
            self.gaplan_task = task or infer_task(self.model)
            # The loss is normalized by the step's count (the Trainer's meaning of this flag), whatever the model's
            # forward accepts: gaplan computes it from the logits. Set it to False to get the Trainer's mean path.
            self.model_accepts_loss_kwargs = True

        @property
        def loss_is_scaled_for_ga(self) -> bool:
            """Whether the step's targets are counted and ``compute_loss`` divides by them (then the Trainer must not
            divide by the steps): with ``model_accepts_loss_kwargs`` (gaplan's default) or a ``compute_loss_func``."""
            return bool(self.model_accepts_loss_kwargs or self.compute_loss_func is not None)

        @loss_is_scaled_for_ga.setter
        def loss_is_scaled_for_ga(self, value: Any) -> None:
            pass  # decided by the two switches above; a Trainer that assigns it keeps them in charge

        def get_batch_samples(self, epoch_iterator: Iterator, num_batches: int, *args: Any,
                              **kwargs: Any) -> tuple[list, int | None]:
            """The next ``num_batches`` micro-batches and their targets on all ranks (gaplan's count)."""
            batches: list = []
            for _ in range(num_batches):
                try:
                    batches.append(next(epoch_iterator))
                except StopIteration:
                    break
            return batches, self.count_items(batches) if self.loss_is_scaled_for_ga else None

        def _get_num_items_in_batch(self, batch_samples: list, device: Any) -> int | None:
            # The Trainer's own count (evaluation asks it too): gaplan's rule instead.
            return self.count_items(batch_samples) if self.loss_is_scaled_for_ga else None

        def count_items(self, batches: list) -> int | None:
            """``num_items_in_batch`` of one optimizer step: this rank's targets summed over all processes."""
            if not batches:
                return None
            if any("labels" not in b and "shift_labels" not in b for b in batches):
                raise GaplanError("GaplanTrainer needs labels (or shift_labels) in every training batch")
            count = count_step_targets(batches, self.gaplan_task)
            if self.accelerator.num_processes > 1:
                count = int(self.accelerator.gather(torch.tensor([count], device=self.args.device)).sum())
            return count

        def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                         num_items_in_batch: torch.Tensor | int | None = None) -> Any:
            if not self.loss_is_scaled_for_ga:
                num_items_in_batch = None  # the Trainer's path without a count: this micro-batch's mean
            outputs = model(**{k: v for k, v in inputs.items() if k not in NOT_INPUTS})
            if self.compute_loss_func is not None:
                loss = self.compute_loss_func(outputs, inputs["labels"], num_items_in_batch=num_items_in_batch)
            else:
                logits = outputs["logits"] if isinstance(outputs, Mapping) else outputs[0]
                summed = summed_token_loss(logits, inputs, self.gaplan_task)
                count = num_items_in_batch if num_items_in_batch is not None else count_targets(inputs, self.gaplan_task)
                loss = summed / max(count, 1) if isinstance(count, int) else summed / count
            if num_items_in_batch is not None:
                loss = loss * self.accelerator.num_processes  # the count is all ranks': undo DDP's average
            return (loss, outputs) if return_outputs else loss

    GaplanTrainer.__module__ = "gaplan.integrations.transformers"
    GaplanTrainer.__qualname__ = "GaplanTrainer"
    return GaplanTrainer
