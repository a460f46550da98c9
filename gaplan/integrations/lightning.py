"""gaplan for Lightning users: :class:`GaplanBatchSize`, a callback that probes your ``training_step`` and sets the
batch size and ``accumulate_grad_batches`` for a fixed effective batch.

Lightning's ``BatchSizeFinder`` refuses DDP, runs a few steps per size in your process (after an OOM there, memory
is not as it was), takes 5% off its answer and cannot keep the effective batch fixed. This callback, at
``on_fit_start``, probes a copy of your LightningModule with :func:`gaplan.probing.loop.probe_loop`: each trial is
a fresh process forked from yours, under the budget, at steady state (the optimizer from your
``configure_optimizers``, two optimizer steps of two micro-steps), the step run under the Trainer's precision
(``precision_plugin.train_step_context()``) on the largest samples of your training set. Under DDP every rank
probes its own device and all take the smallest edge. Then it sets your module's ``batch_size`` (as
``BatchSizeFinder`` does) and ``trainer.accumulate_grad_batches``::

    trainer = Trainer(callbacks=[GaplanBatchSize(effective_batch=256, memory_limit="8GiB"), TokenExactLoss()])

The micro-batch divides the effective batch (:func:`gaplan.plan.split.make_even_plan`): one loader batch size,
``micro x accumulate x world == effective`` exactly. Trials fork, and a process whose CUDA is initialized cannot
fork: on CUDA use :func:`gaplan.probe_loop` with importable functions (the callback says so in one line).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from pytorch_lightning import Callback

from gaplan.core.errors import GaplanError, one_line
from gaplan.data.longest import DEFAULT_SCAN, largest_batches, largest_first
from gaplan.plan.split import Plan, make_even_plan
from gaplan.probing.loop import LoopProbeResult, probe_loop
from gaplan.worker.fork import run_in_child

log = logging.getLogger(__name__)


class GaplanBatchSize(Callback):
    """Probe the LightningModule's own step at ``on_fit_start``; set its batch size and the accumulation steps.

    Args:
        effective_batch: samples per optimizer step over all ranks, kept fixed.
        memory_limit: each rank's budget, bytes or text (``"8GiB"``); default 1 GiB on CPU.
        batch_arg_name: the field that holds the batch size (on the module, its ``hparams`` or the datamodule).
        make_batch: ``(b) -> batch`` of ``b`` samples at your longest; default: the ``b`` largest of the first
            ``scan`` samples of your training set, collated by its DataLoader's ``collate_fn``.
        search_cap, threads, on_trial: :func:`gaplan.probing.loop.probe_loop`'s.

    After ``fit`` starts: ``plan`` (the split), ``max_micro_batch`` (B*, the smallest over the ranks) and
    ``result`` (this rank's probe).
    """

    def __init__(self, effective_batch: int, memory_limit: int | str | None = None, *,
                 batch_arg_name: str = "batch_size", make_batch: Callable[[int], Any] | None = None,
                 scan: int = DEFAULT_SCAN, search_cap: int | None = None, threads: int | None = None,
                 on_trial: Callable[[Any], None] | None = None) -> None:
        if not isinstance(effective_batch, int) or isinstance(effective_batch, bool) or effective_batch < 1:
            raise GaplanError(f"effective_batch must be a positive integer (got {effective_batch!r})")
        self.effective_batch = effective_batch
        self.memory_limit = memory_limit
        self.batch_arg_name = batch_arg_name
        self.make_batch = make_batch
        self.scan = scan
        self.search_cap = search_cap
        self.threads = threads
        self.on_trial = on_trial
        self.result: LoopProbeResult | None = None
        self.plan: Plan | None = None
        self.max_micro_batch: int | None = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        from pytorch_lightning.utilities.parsing import lightning_setattr

        check_probeable(trainer, pl_module, self.batch_arg_name)
        world = trainer.world_size
        make_batch = self.make_batch or training_set_batches(trainer, self.scan)
        error: Exception | None = None
        try:
            self.result = probe_loop(module_setup(trainer, pl_module), make_batch, training_micro_step(trainer),
                                     device="cpu", memory_limit=self.memory_limit,
                                     effective_batch=self.effective_batch, world_size=world,
                                     search_cap=self.search_cap, threads=self.threads, on_trial=self.on_trial)
            edge = self.result.max_micro_batch
        except Exception as exc:  # noqa: BLE001 - DoesNotFit or any other: the other ranks must hear of it first
            error, edge = exc, 0
        edge = smallest_over_ranks(trainer, edge)
        if error is not None:
            raise error
        if edge <= 0:
            raise GaplanError("another rank's probe failed (its own error is in its log); this rank's edge was "
                              f"{self.result.max_micro_batch if self.result else 'not measured'}")
        self.max_micro_batch = edge
        self.plan = make_even_plan(self.effective_batch, edge, world)
        if self.result is not None:
            self.result = replace(self.result, plan=self.plan)
        lightning_setattr(pl_module, self.batch_arg_name, self.plan.micro_batch)
        trainer.accumulate_grad_batches = self.plan.grad_accum_steps
        # A loader built already (by a callback before this one) holds the old batch size: make the loop build it
        # again, as Lightning's own BatchSizeFinder does.
        if trainer.fit_loop._combined_loader is not None:
            trainer.fit_loop._combined_loader = None
            trainer.fit_loop.setup_data()
        log.info("GaplanBatchSize: the largest micro-batch that fits is %d; %s", edge, self.plan.describe())


def check_probeable(trainer: Any, pl_module: Any, batch_arg_name: str) -> None:
    """One line for what the callback cannot do, before any trial."""
    from pytorch_lightning.utilities.parsing import lightning_hasattr

    if pl_module.device.type != "cpu":
        raise GaplanError(f"GaplanBatchSize probes on CPU only: its trials fork from the Trainer's process, which "
                          f"cannot fork once {pl_module.device.type} is initialized; on a GPU probe your step with "
                          f"gaplan.probe_loop and importable functions, then set batch size and "
                          f"accumulate_grad_batches from its plan")
    if not pl_module.automatic_optimization:
        raise GaplanError("GaplanBatchSize probes automatic optimization (training_step returns the loss); with "
                          "manual optimization probe your step with gaplan.probe_loop")
    if not trainer.fit_loop._data_source.is_module():
        raise GaplanError("GaplanBatchSize cannot set the batch size of dataloaders passed to fit(): build them in "
                          "your LightningModule's or LightningDataModule's train_dataloader() from a batch_size field")
    if not lightning_hasattr(pl_module, batch_arg_name):
        raise GaplanError(f"no field {batch_arg_name!r} on the model, its hparams or the datamodule: GaplanBatchSize "
                          f"sets the batch size there (batch_arg_name= names another)")


def module_setup(trainer: Any, pl_module: Any) -> Callable[[], tuple[Any, Any]]:
    """A trial's ``setup``: a copy of the module (its weights allocated under the budget) and its optimizer."""
    from pytorch_lightning.core.optimizer import _init_optimizers_and_lr_schedulers

    def setup() -> tuple[Any, Any]:
        # The copy shares the trainer (configure_optimizers and hooks may read it), not its weights; Lightning's
        # pickling drops the trainer, so it is attached again.
        model = copy.deepcopy(pl_module, memo={id(trainer): trainer})
        model.trainer = trainer
        # self.log needs the fit loop's results, which exist once training runs; logging is not training memory.
        model.log = model.log_dict = lambda *args, **kwargs: None
        optimizers, _ = _init_optimizers_and_lr_schedulers(model)
        return model, optimizers[0]

    return setup


def training_micro_step(trainer: Any) -> Callable[[Any, Any], None]:
    """A trial's ``micro_step``: the batch through your transfer hooks, ``training_step`` under the Trainer's
    precision, then backward."""
    def micro_step(model: Any, batch: Any) -> None:
        batch = model.on_before_batch_transfer(batch, 0)
        batch = model.transfer_batch_to_device(batch, model.device, 0)
        batch = model.on_after_batch_transfer(batch, 0)
        with trainer.precision_plugin.train_step_context():
            output = model.training_step(batch, 0)
        loss = output["loss"] if isinstance(output, Mapping) else output
        if loss is None:
            raise GaplanError("training_step returned None on the probe's batch (Lightning skips such a batch): "
                              "it must return the loss for the largest samples")
        loss.backward()

    return micro_step


def training_set_batches(trainer: Any, scan: int) -> Callable[[int], Any]:
    """``(b) -> batch``: the ``b`` largest samples of the training set, collated as its DataLoader collates."""
    loader = trainer.fit_loop._data_source.dataloader()
    dataset = getattr(loader, "dataset", None)

    def measure() -> dict:
        import torch

        torch.set_num_threads(1)  # a forked child cannot start OpenMP threads its parent started
        try:
            return {"order": largest_first(dataset, scan)}
        except (TypeError, ValueError) as exc:
            raise GaplanError(str(exc)) from None

    # In a child: the samples it makes and frees would leave heap in this process that the trials, forked from it,
    # fill without counting it (one sample too many at the edge, measured).
    message = run_in_child(measure)
    if "order" not in message:
        raise GaplanError(f"GaplanBatchSize cannot draw the probe's batches from train_dataloader(): "
                          f"{one_line(str(message.get('message', message)).strip().splitlines()[-1])}")
    return largest_batches(dataset, getattr(loader, "collate_fn", None), message["order"])


def smallest_over_ranks(trainer: Any, value: int) -> int:
    """The smallest ``value`` over the ranks (itself on one process)."""
    if trainer.world_size == 1:
        return value
    import torch

    return int(trainer.strategy.reduce(torch.tensor(value, device=trainer.strategy.root_device),
                                       reduce_op="min").item())
