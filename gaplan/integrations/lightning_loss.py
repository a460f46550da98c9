"""The token-exact loss for a LightningModule: :class:`TokenExactLoss`, a callback.

Lightning divides the loss ``training_step`` returns by ``accumulate_grad_batches`` and DDP averages the gradients
over the ranks, so a per-micro-batch *mean* loss weighs each token by one over its micro-batch's count. With this
callback ``training_step`` returns the *summed* token loss (:func:`gaplan.workload.loss.summed_token_loss`); the
callback counts each micro-batch's targets, sums them over the step and the ranks, and before the optimizer step
(and before Lightning clips) multiplies the gradients by ``accumulate_grad_batches x world_size / targets``: the
gradient of ``sum / num_items_in_batch`` over the whole step and all ranks. A last, shorter step of an epoch is
exact too (its own targets).

    def training_step(self, batch, batch_idx):
        return summed_token_loss(self(**batch).logits, batch, "causal-lm")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytorch_lightning import Callback

from gaplan.core.tasks import CAUSAL_LM
from gaplan.workload.loss import count_targets


class TokenExactLoss(Callback):
    """Rescale each optimizer step's gradient to ``sum / num_items_in_batch`` over the step and all ranks.

    Args:
        task: how a batch's targets are counted (``causal-lm`` shifts the labels; others count labels that are
            not -100; ``custom`` counts samples).
        count: ``(batch) -> int`` instead, for a batch of your own shape.
    """

    def __init__(self, task: str = CAUSAL_LM, count: Callable[[Any], int] | None = None) -> None:
        self.count = count or (lambda batch: count_targets(batch, task))
        self.step_items = 0  # this rank's targets since the last optimizer step

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.step_items += self.count(batch)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        import torch

        local = torch.tensor(self.step_items, dtype=torch.float64, device=trainer.strategy.root_device)
        items = float(trainer.strategy.reduce(local, reduce_op="sum")) if trainer.world_size > 1 else self.step_items
        self.step_items = 0
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if grads and items > 0:
            torch._foreach_mul_(grads, trainer.accumulate_grad_batches * trainer.world_size / items)
