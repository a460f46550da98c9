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

With ``noise_scale=True`` (the default) it also measures the gradient noise scale of every optimizer step from its
micro-batches' gradients (:mod:`gaplan.training.noise_scale`, as ``gaplan train`` does): a hook on each trainable
parameter sees a micro-batch's gradient before it is added to ``.grad``, and the step's rescaled gradient is read
before Lightning clips it. ``noise_scale``, ``grad_sq`` and ``grad_var`` are logged each step (``self.log``, so
every Lightning logger gets them) and kept in :attr:`TokenExactLoss.reading`. Not measured under FSDP or DeepSpeed
(sharded gradients), where the callback says so once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytorch_lightning import Callback

from gaplan.core.tasks import CAUSAL_LM
from gaplan.workload.loss import batch_size, count_targets


class TokenExactLoss(Callback):
    """Rescale each optimizer step's gradient to ``sum / num_items_in_batch`` over the step and all ranks.

    Args:
        task: how a batch's targets are counted (``causal-lm`` shifts the labels; others count labels that are
            not -100; ``custom`` counts samples).
        count: ``(batch) -> int`` instead, for a batch of your own shape.
        noise_scale: measure and log the gradient noise scale of each step.
    """

    def __init__(self, task: str = CAUSAL_LM, count: Callable[[Any], int] | None = None,
                 noise_scale: bool = True) -> None:
        self.count = count or (lambda batch: count_targets(batch, task))
        self.step_items = 0  # this rank's targets since the last optimizer step
        self.noise_scale = noise_scale
        self.meter = None  # the NoiseScaleMeter, during fit
        self.reading = None  # the latest step's NoiseReading
        self._batch_items = 0
        self._step_samples = 0
        self._batch_samples = 0

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        from gaplan.training.noise_scale import NoiseScaleMeter

        if not self.noise_scale:
            return
        sharded = type(trainer.strategy).__name__
        if "FSDP" in sharded or "DeepSpeed" in sharded:
            from pytorch_lightning.utilities import rank_zero_warn

            rank_zero_warn(f"noise scale: not measured under {sharded} (each rank holds a shard of every gradient)")
            return
        reduce = None
        if trainer.world_size > 1:
            def reduce(values: list[float]) -> list[float]:  # one collective a step, over the ranks
                import torch

                total = torch.tensor(values, dtype=torch.float64, device=trainer.strategy.root_device)
                return trainer.strategy.reduce(total, reduce_op="sum").tolist()
        self.meter = NoiseScaleMeter(pl_module, reduce=reduce)  # how it draws: known once the loader is (below)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """The loader is built now: where its sampler draws each epoch's permutation (gaplan's PlanBatchSampler,
        a shuffling DataLoader, Lightning's DistributedSampler) the reading is corrected for it; else it assumes
        independent draws and says so once."""
        if self.meter is None:
            return
        from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn

        from gaplan.data.loader_drawing import loader_drawing
        from gaplan.plan.draws import unknown_drawing

        self.meter.drawing = loader_drawing(trainer.train_dataloader)
        if self.meter.drawing.known:
            rank_zero_info(f"noise scale: {self.meter.drawing.describe()}")
        else:
            rank_zero_warn(f"noise scale: {unknown_drawing('Lightning')}")

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.meter is not None:  # no hooks left on the module after fit
            self.meter.close()
            self.meter = None

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.on_fit_end(trainer, pl_module)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._batch_items = self.count(batch)
        self.step_items += self._batch_items
        if self.meter is not None:
            try:
                self._batch_samples = batch_size(batch)
            except (TypeError, KeyError, IndexError, AttributeError, StopIteration):  # a batch of your own shape: its items
                self._batch_samples = self._batch_items
            self._step_samples += self._batch_samples

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self.meter is not None:
            self.meter.start_micro_step()

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self.meter is None:
            return
        # Lightning divided the summed loss by accumulate_grad_batches (and the hooks see this rank's gradient,
        # before DDP averages it), and fp16 multiplied it by the loss scale: back to its own mean gradient.
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        scale = float(scaler.get_scale()) if scaler is not None else 1.0
        # Without replacement (the plan's sampler), each micro-batch's samples are of one epoch's permutation,
        # shared by the ranks.
        parts = ((0, self._batch_samples),) if self.meter.drawing.without_replacement else None
        self.meter.end_micro_step(self._batch_items, trainer.accumulate_grad_batches, loss_scale=scale, parts=parts)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        import torch

        local = torch.tensor(self.step_items, dtype=torch.float64, device=trainer.strategy.root_device)
        items = float(trainer.strategy.reduce(local, reduce_op="sum")) if trainer.world_size > 1 else self.step_items
        self.step_items = 0
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if grads and items > 0:
            torch._foreach_mul_(grads, trainer.accumulate_grad_batches * trainer.world_size / items)
        if self.meter is not None:  # .grad: the step's mean gradient over all ranks (unscaled), not yet clipped
            samples, self._step_samples = self._step_samples, 0
            self.reading = self.meter.finish(samples)
            if self.reading is not None and self.reading.noise_scale is not None:
                pl_module.log_dict({"noise_scale": self.reading.noise_scale, "grad_sq": self.reading.grad_sq,
                                    "grad_var": self.reading.grad_var,
                                    "noise_scale_items": self.reading.noise_scale_items}, on_step=True, on_epoch=False,
                                   batch_size=samples)
