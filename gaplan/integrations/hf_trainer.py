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
* ``label_smoothing_factor`` is refused at construction, in one line: gaplan's loss is plain cross-entropy;
* ``noise_scale=True`` (the default) measures the gradient noise scale of every optimizer step from its
  micro-batches' gradients (:mod:`gaplan.training.noise_scale`, as ``gaplan train`` does) and logs ``noise_scale``,
  ``grad_sq`` and ``grad_var`` with the loss. The step's gradient is read after the last micro-batch's backward (DDP
  has reduced it) and before the Trainer clips it. Not measured, and said once in the log, under fp16's loss
  scaling (the Trainer unscales inside its clipping), FSDP or DeepSpeed (sharded gradients). The Trainer's default
  sampler and ``plan=``'s draw each step without replacement from one epoch's permutation, and the reading is
  corrected for it (:mod:`gaplan.data.loader_drawing`); on a sampler of another kind the reading assumes independent
  draws, and says so once in the log with the dataset's size (:mod:`gaplan.plan.draws`).

Defined on first use (:func:`trainer_class`), since it subclasses ``transformers.Trainer``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sized
from typing import Any

from gaplan.core.errors import GaplanError
from gaplan.plan.split import Plan

# Batch keys that are targets or bookkeeping, never model inputs.
NOT_INPUTS = ("labels", "shift_labels", "num_items_in_batch")


@functools.lru_cache(maxsize=2)
def trainer_class(base: str | type = "Trainer") -> type:
    """Define ``GaplanTrainer`` over transformers' ``Trainer`` on first use, importing transformers and torch; over
    another of its trainers by name (``"Seq2SeqTrainer"``: ``GaplanSeq2SeqTrainer``, its generation in evaluation
    kept), or over a ``Trainer`` subclass itself (TRL's ``SFTTrainer``: ``GaplanSFTTrainer``, its own tokenizing and
    collator kept, its loss replaced by gaplan's)."""
    import torch
    import transformers
    from torch import nn
    from transformers.utils import logging

    from gaplan.data.loader_drawing import loader_drawing
    from gaplan.data.plan_sampler import PlanBatchSampler
    from gaplan.data.tasks.infer import infer_task
    from gaplan.data.tasks.registry import task_component, task_names
    from gaplan.plan.draws import unknown_drawing
    from gaplan.training.noise_scale import NoiseScaleMeter
    from gaplan.workload.loss import batch_size, count_step_targets, count_targets, summed_token_loss

    logger = logging.get_logger("gaplan")

    parent = getattr(transformers, base) if isinstance(base, str) else base
    if not (isinstance(parent, type) and issubclass(parent, transformers.Trainer)):
        raise GaplanError(f"GaplanTrainer extends a transformers.Trainer; {base!r} is not one")

    class GaplanTrainer(parent):
        """A ``Trainer`` with gaplan's token-exact loss under gradient accumulation (see
        :mod:`gaplan.integrations.hf_trainer`).

        Args:
            task: ``causal-lm``, ``masked-lm``, ``classification`` or ``seq2seq-lm``; default: from the model's class.
            noise_scale: measure and log the gradient noise scale of each step.
            plan: train this :class:`~gaplan.plan.split.Plan` (B* itself, uneven too: ``12 x14, 11 x8``): its split
                set in the arguments and its micro-batches fed by :class:`~gaplan.data.plan_sampler.PlanBatchSampler`
                (a dataset with ``__len__``; the last samples that do not fill a step are left out).
            Everything else as ``transformers.Trainer``. Batches need ``labels`` (or ``shift_labels``).
        """

        def __init__(self, *args: Any, task: str | None = None, noise_scale: bool = True, plan: Plan | None = None,
                     **kwargs: Any) -> None:
            if plan is not None and not isinstance(plan, Plan):  # a plan file's path, a number
                raise GaplanError(f"plan must be a gaplan Plan (gaplan.make_plan(...), or "
                                  f"gaplan.runs.probe_result.load_probe(path).plan for a plan.json), got {plan!r}")
            if plan is not None:  # the plan's split in the arguments, before the Trainer builds its Accelerator
                args, kwargs = _with_plan_arguments(plan, args, kwargs)
            super().__init__(*args, **kwargs)
            self.gaplan_plan = plan
            self.gaplan_loader: Any = None  # the training loader, once built (its sampler is how samples are drawn)
            if plan is not None and self.args.world_size != plan.world_size:
                raise GaplanError(f"the plan is for {plan.world_size} process(es); this Trainer runs "
                                  f"{self.args.world_size}")
            self.gaplan_noise_scale = noise_scale
            self.noise_meter: NoiseScaleMeter | None = None  # during train(), when measured
            self._noise_pending = False  # train() started and its meter not yet (see train)
            self._noise_samples = 0
            if task is not None and task not in task_names():
                raise GaplanError(f"unknown task {task!r}; choose one of {', '.join(task_names())}")
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

        def get_train_dataloader(self) -> torch.utils.data.DataLoader:
            """The Trainer's loader; with ``plan=``, the plan's micro-batches (uneven too) from
            :class:`~gaplan.data.plan_sampler.PlanBatchSampler`, seeded by ``args.seed``, sharded by ``prepare``."""
            if self.gaplan_plan is None:
                self.gaplan_loader = super().get_train_dataloader()
                return self.gaplan_loader
            if self.train_dataset is None:
                raise ValueError("Trainer: training requires a train_dataset.")
            dataset, collator = self.train_dataset, self.data_collator
            if isinstance(dataset, torch.utils.data.IterableDataset):
                raise GaplanError("GaplanTrainer(plan=...) samples by index: give a dataset with __len__, not a stream")
            if callable(getattr(dataset, "remove_columns", None)):  # a datasets.Dataset, as the Trainer treats it
                dataset = self._remove_unused_columns(dataset, description="Training")
            else:
                collator = self._get_collator_with_removed_columns(collator, description="Training")
            sampler = PlanBatchSampler(self.gaplan_plan, len(dataset), seed=self.args.seed)
            loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collator,
                                                 num_workers=self.args.dataloader_num_workers,
                                                 pin_memory=self.args.dataloader_pin_memory)
            self.gaplan_loader = self.accelerator.prepare(loader)
            return self.gaplan_loader

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
            model_inputs = {k: v for k, v in inputs.items() if k not in NOT_INPUTS}
            # What else the task's call needs (seq2seq-lm: the decoder's inputs by the model's own shift, unless
            # DataCollatorForSeq2Seq made them, given the model); the labels stay out of the call.
            task_component(self.gaplan_task).model_inputs(model, inputs, model_inputs)
            outputs = model(**model_inputs)
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

        # -- the gradient noise scale ------------------------------------------------------------------------

        def train(self, *args: Any, **kwargs: Any) -> Any:
            # The meter starts at the first training step, on the model that trains: with model_init, train()
            # replaces self.model first, and hooks on the one given to __init__ would never fire.
            self.noise_meter, self._noise_pending = None, self.gaplan_noise_scale
            self._noise_samples = 0
            try:
                return super().train(*args, **kwargs)
            finally:  # no hooks left on the model after training
                self._noise_pending = False
                if self.noise_meter is not None:
                    self.noise_meter.close()

        def _start_noise_meter(self, model: nn.Module) -> NoiseScaleMeter | None:
            why = ("fp16's loss scaling (the Trainer unscales inside its clipping)" if self.args.fp16 else
                   "FSDP (each rank holds a shard of every gradient)" if self.is_fsdp_enabled else
                   "DeepSpeed" if self.is_deepspeed_enabled else None)
            if why is not None:
                logger.warning(f"noise scale: not measured under {why}")
                return None
            reduce = None
            if self.accelerator.num_processes > 1:
                def reduce(values: list[float]) -> list[float]:  # one collective a step, over the ranks
                    total = torch.tensor(values, dtype=torch.float64, device=self.args.device)
                    return self.accelerator.reduce(total, reduction="sum").tolist()
            # The Trainer's loader draws each epoch's permutation (its RandomSampler, or plan='s PlanBatchSampler),
            # and each step ends with its epoch: the reading is corrected for it. Another sampler: unknown.
            drawing = loader_drawing(self.gaplan_loader)
            if drawing.known:
                logger.info(f"noise scale: {drawing.describe()}")
            else:
                size = len(self.train_dataset) if isinstance(self.train_dataset, Sized) else None
                logger.warning(f"noise scale: {unknown_drawing('the Trainer', size)}")
            return NoiseScaleMeter(model, reduce=reduce, drawing=drawing)

        def training_step(self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None,
                          *args: Any, **kwargs: Any) -> torch.Tensor:
            if self._noise_pending:
                self._noise_pending = False
                self.noise_meter = self._start_noise_meter(model)
            meter = self.noise_meter
            if meter is None:
                return super().training_step(model, inputs, num_items_in_batch, *args, **kwargs)
            items = count_targets(inputs, self.gaplan_task)
            samples = batch_size(inputs)
            self._noise_samples += samples
            # Without replacement, each micro-batch says its draws: all of one epoch's permutation (the sampler's
            # step never crosses an epoch), shared by the ranks.
            parts = ((0, samples),) if meter.drawing.without_replacement else None
            meter.start_micro_step()
            loss = super().training_step(model, inputs, num_items_in_batch, *args, **kwargs)
            # Its loss: the summed loss over the step's targets on all ranks (times the ranks, undoing DDP's average),
            # or its mean over the accumulation steps.
            if self.loss_is_scaled_for_ga and num_items_in_batch is not None:
                meter.end_micro_step(items, int(num_items_in_batch), self.accelerator.num_processes, parts=parts)
            else:
                meter.end_micro_step(items, items * self.current_gradient_accumulation_steps, parts=parts)
            if self.accelerator.sync_gradients:  # the step's last micro-batch: .grad is reduced, not yet clipped
                samples, self._noise_samples = self._noise_samples, 0
                meter.finish(samples)
            return loss

        def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
            reading = self.noise_meter.last if self.noise_meter is not None else None
            if reading is not None and "loss" in logs and reading.noise_scale is not None:
                logs = {**logs, "noise_scale": reading.noise_scale, "grad_sq": reading.grad_sq,
                        "grad_var": reading.grad_var, "noise_scale_items": reading.noise_scale_items}
            super().log(logs, *args, **kwargs)

    name = "GaplanTrainer" if parent is transformers.Trainer else f"Gaplan{parent.__name__}"
    GaplanTrainer.__module__ = "gaplan.integrations.transformers"
    GaplanTrainer.__qualname__ = GaplanTrainer.__name__ = name
    return GaplanTrainer


def _with_plan_arguments(plan: Plan, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The Trainer's ``(args, kwargs)`` with its ``TrainingArguments`` (the second positional one, or ``args=``) set to
    the plan's split: ``per_device_train_batch_size`` its largest micro-batch, ``gradient_accumulation_steps`` its
    micro-steps per optimizer step."""
    import dataclasses

    batch = dict(per_device_train_batch_size=plan.micro_batch, gradient_accumulation_steps=plan.grad_accum_steps,
                 auto_find_batch_size=False)
    if len(args) > 1:
        return (args[0], dataclasses.replace(args[1], **batch), *args[2:]), kwargs
    if kwargs.get("args") is None:
        raise GaplanError("GaplanTrainer(plan=...) needs the TrainingArguments (args=) to set the plan's split in")
    return args, {**kwargs, "args": dataclasses.replace(kwargs["args"], **batch)}


# The trainers gaplan's loss extends by name: transformers' by their name there, TRL's (an optional extra) by import.
TRAINER_BASES = {"GaplanTrainer": "Trainer", "GaplanSeq2SeqTrainer": "Seq2SeqTrainer", "GaplanSFTTrainer": "trl"}


def named_trainer(name: str) -> type | None:
    """``GaplanTrainer``, ``GaplanSeq2SeqTrainer`` or ``GaplanSFTTrainer`` (over TRL's ``SFTTrainer``, imported
    here: ``pip install trl``), built on first use; None for another name."""
    base = TRAINER_BASES.get(name)
    if base is None:
        return None
    if base == "trl":
        try:
            from trl import SFTTrainer
        except ImportError as exc:
            raise GaplanError("GaplanSFTTrainer extends TRL's SFTTrainer: pip install trl") from exc
        return trainer_class(SFTTrainer)
    return trainer_class(base)


def __getattr__(name: str) -> Any:
    """The trainers of :data:`TRAINER_BASES`, importable from here too (the module that defines them), as from
    :mod:`gaplan.integrations.transformers`: built on first access."""
    found = named_trainer(name)
    if found is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return found
