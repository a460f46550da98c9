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

By default the micro-batch divides the effective batch (:func:`gaplan.plan.split.make_even_plan`): one loader batch
size, ``micro x accumulate x world == effective`` exactly, and one warning when that is under B* (what is given up,
and the effective batches that split evenly at B*). ``uneven=True`` trains gaplan's plan at B* itself (``12 x14,
11 x8``): your ``train_dataloader`` takes :func:`loader_options` (the plan's
:class:`~gaplan.data.plan_sampler.PlanBatchSampler` once the probe has run, your ``batch_size`` before)::

    def train_dataloader(self):
        return DataLoader(self.data, collate_fn=collate,
                          **loader_options(self.trainer, len(self.data), self.batch_size))

On CPU the trials fork. On CUDA the Trainer has initialized
the card before any callback runs (``strategy.setup_environment()`` sets the device), and such a process cannot
fork: the trials are spawned, and get your module pickled as Lightning's ``ddp_spawn`` sends it (without its
trainer: ``configure_optimizers`` must not need one), the precision plugin, and the largest samples with the
loader's ``collate_fn``; a ``make_batch`` you pass must be picklable then. One line says what is not.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from pytorch_lightning import Callback
from pytorch_lightning.utilities.rank_zero import rank_zero_info

from gaplan.core.errors import GaplanError
from gaplan.core.fork import failure_line, run_in_child
from gaplan.core.lines import trial_line
from gaplan.core.units import parse_bytes
from gaplan.data.longest import DEFAULT_SCAN, LargestBatches, largest_first
from gaplan.plan.split import Plan, even_trade_message, make_even_plan, make_plan
from gaplan.probing.loop import LoopProbeResult, probe_loop


class GaplanBatchSize(Callback):
    """Probe the LightningModule's own step at ``on_fit_start``; set its batch size and the accumulation steps.

    Args:
        effective_batch: samples per optimizer step over all ranks, kept fixed.
        memory_limit: each rank's budget, bytes or text (``"8GiB"``); default on CPU this process's own
            ``gaplan.cpu_budget``, else 1 GiB.
        batch_arg_name: the field that holds the batch size (on the module, its ``hparams`` or the datamodule).
        make_batch: ``(b) -> batch`` of ``b`` samples at your longest; default: the ``b`` largest of the first
            ``scan`` samples of your training set, collated by its DataLoader's ``collate_fn``.
        search_cap, threads, on_trial, start: :func:`gaplan.probing.loop.probe_loop`'s.
        uneven: train gaplan's plan at B* (fed by :func:`loader_options` in your ``train_dataloader``), not the
            largest even split under it.

    After ``fit`` starts: ``plan`` (the split it trains), ``max_micro_batch`` (B*, the smallest over the ranks) and
    ``result`` (this rank's probe: ``result.plan`` gaplan's plan at B*, ``result.split`` the split it trains).
    """

    def __init__(self, effective_batch: int, memory_limit: int | str | None = None, *,
                 batch_arg_name: str = "batch_size", make_batch: Callable[[int], Any] | None = None,
                 scan: int = DEFAULT_SCAN, search_cap: int | None = None, threads: int | None = None,
                 on_trial: Callable[[Any], None] | None = None, start: str = "auto", uneven: bool = False) -> None:
        if not isinstance(effective_batch, int) or isinstance(effective_batch, bool) or effective_batch < 1:
            raise GaplanError(f"effective_batch must be a positive integer (got {effective_batch!r})")
        self.effective_batch = effective_batch
        self.memory_limit = parse_bytes(memory_limit) if memory_limit is not None else None  # refused here, not later
        self.batch_arg_name = batch_arg_name
        self.make_batch = make_batch
        if not isinstance(scan, int) or scan < 1:  # 0 read as "the training set is empty"
            raise GaplanError(f"scan is how many training samples to read for the longest, 1 or more (got {scan!r})")
        self.scan = scan
        self.search_cap = search_cap
        self.threads = threads
        self.on_trial = on_trial
        self.start = start
        self.uneven = uneven
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
            self.result = probe_loop(ModuleSetup(trainer, pl_module), make_batch,
                                     TrainingMicroStep(trainer.precision_plugin), device=module_device(pl_module),
                                     memory_limit=self.memory_limit, effective_batch=self.effective_batch,
                                     world_size=world, search_cap=self.search_cap, threads=self.threads,
                                     on_trial=self._on_trial, start=self.start, progress=False)
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
        full = make_plan(self.effective_batch, edge, world)
        self.plan = full if self.uneven else make_even_plan(self.effective_batch, edge, world)
        if self.plan != full:
            warnings.warn(even_trade_message(full, self.plan, "a DataLoader with one batch_size",
                                             "GaplanBatchSize(..., uneven=True) with loader_options in your "
                                             "train_dataloader trains the plan itself"), stacklevel=2)
        if self.result is not None:
            self.result = replace(self.result, plan=full, split=self.plan)
        lightning_setattr(pl_module, self.batch_arg_name, self.plan.micro_batch)
        trainer.accumulate_grad_batches = self.plan.grad_accum_steps
        # A loader built already (by a callback before this one) holds the old batch size: make the loop build it
        # again, as Lightning's own BatchSizeFinder does.
        if trainer.fit_loop._combined_loader is not None:
            trainer.fit_loop._combined_loader = None
            trainer.fit_loop.setup_data()
        rank_zero_info(f"GaplanBatchSize: the largest micro-batch that fits is {edge}; {self.plan.describe()}")

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """With ``uneven``, the plan is trained only through :func:`loader_options`: a loader of one ``batch_size``
        would train ``micro-batch x steps`` samples a step, not the plan's effective batch (refused, not trained)."""
        if not self.uneven or self.plan is None or len(set(self.plan.micro_batch_sizes)) == 1:  # even: any loader
            return
        from gaplan.data.plan_sampler import PlanBatchSampler

        loaders = getattr(trainer.fit_loop._combined_loader, "flattened", None) or []
        if loaders and not any(isinstance(getattr(loader, "batch_sampler", None), PlanBatchSampler)
                               for loader in loaders):
            raise GaplanError(f"GaplanBatchSize(..., uneven=True) trains {self.plan.describe()} only through "
                              "loader_options in your train_dataloader; its DataLoader takes one batch_size, so a "
                              f"step would train {self.plan.micro_batch * self.plan.grad_accum_steps} samples, not "
                              f"{self.plan.effective_batch // self.plan.world_size}")

    def _on_trial(self, trial: Any) -> None:
        """Each trial in Lightning's own log (shown by default, as BatchSizeFinder's sizes are), then yours."""
        rank_zero_info(f"GaplanBatchSize:{trial_line(trial)}")
        if self.on_trial is not None:
            self.on_trial(trial)


def loader_options(trainer: Any, num_samples: int, batch_size: int, **sampler_options: Any) -> dict[str, Any]:
    """``DataLoader`` keyword arguments for your ``train_dataloader``: ``batch_sampler``, the plan of the trainer's
    ``GaplanBatchSize(..., uneven=True)`` (this rank's micro-batches), once its probe has run; else ``batch_size``
    (before the probe, or without such a callback). ``sampler_options`` go to
    :class:`~gaplan.data.plan_sampler.PlanBatchSampler` (``shuffle``, ``seed``). Under DDP build the Trainer with
    ``use_distributed_sampler=False``: the sampler gives each rank its own share."""
    from gaplan.data.plan_sampler import PlanBatchSampler

    for callback in getattr(trainer, "callbacks", None) or []:
        if isinstance(callback, GaplanBatchSize) and callback.uneven and callback.plan is not None:
            rank = trainer.global_rank if callback.plan.world_size > 1 else None
            return {"batch_sampler": PlanBatchSampler(callback.plan, num_samples, rank=rank, **sampler_options)}
    return {"batch_size": batch_size}


def check_probeable(trainer: Any, pl_module: Any, batch_arg_name: str) -> None:
    """One line for what the callback cannot do, before any trial."""
    from pytorch_lightning.utilities.parsing import lightning_hasattr

    if pl_module.device.type not in ("cpu", "cuda"):
        raise GaplanError(f"GaplanBatchSize probes on CPU and CUDA (this module is on {pl_module.device.type})")
    if not pl_module.automatic_optimization:
        raise GaplanError("GaplanBatchSize probes automatic optimization (training_step returns the loss); with "
                          "manual optimization probe your step with gaplan.probe_loop")
    if not trainer.fit_loop._data_source.is_module():
        raise GaplanError("GaplanBatchSize cannot set the batch size of dataloaders passed to fit(): build them in "
                          "your LightningModule's or LightningDataModule's train_dataloader() from a batch_size field")
    if not lightning_hasattr(pl_module, batch_arg_name):
        raise GaplanError(f"no field {batch_arg_name!r} on the model, its hparams or the datamodule: GaplanBatchSize "
                          f"sets the batch size there (batch_arg_name= names another)")


class ModuleSetup:
    """A trial's ``setup``: a copy of the module (its weights allocated under the budget) and its optimizer.

    Picklable for a spawned trial (on CUDA, where the Trainer's process cannot fork): the module goes as Lightning
    pickles it (without its trainer, as ``ddp_spawn`` sends it), and the spawned child trains that copy."""

    def __init__(self, trainer: Any, pl_module: Any) -> None:
        self.trainer = trainer
        self.module = pl_module

    def __getstate__(self) -> dict:
        return {"trainer": None, "module": self.module}

    def __call__(self) -> tuple[Any, Any]:
        from pytorch_lightning.core.optimizer import _configure_optimizers, _init_optimizers_and_lr_schedulers

        if self.trainer is None:  # a spawned trial: the unpickled module is this process's own copy already
            model = self.module
            optimizers = _configure_optimizers(model.configure_optimizers())[0]
        else:
            # The copy shares the trainer (configure_optimizers and hooks may read it), not its weights; Lightning's
            # pickling drops the trainer, so it is attached again.
            model = copy.deepcopy(self.module, memo={id(self.trainer): self.trainer})
            model.trainer = self.trainer
            optimizers = _init_optimizers_and_lr_schedulers(model)[0]
        # self.log needs the fit loop's results, which exist once training runs; logging is not training memory.
        model.log = model.log_dict = _no_log
        return model, optimizers[0]


def _no_log(*args: Any, **kwargs: Any) -> None:
    return None


class TrainingMicroStep:
    """A trial's ``micro_step``: the batch through your transfer hooks, ``training_step`` under the Trainer's
    precision plugin (``train_step_context()``), then backward. Picklable with the plugin, for a spawned trial."""

    def __init__(self, precision_plugin: Any) -> None:
        self.precision_plugin = precision_plugin

    def __call__(self, model: Any, batch: Any) -> None:
        batch = model.on_before_batch_transfer(batch, 0)
        batch = model.transfer_batch_to_device(batch, model.device, 0)
        batch = model.on_after_batch_transfer(batch, 0)
        with self.precision_plugin.train_step_context():
            output = model.training_step(batch, 0)
        loss = output["loss"] if isinstance(output, Mapping) else output
        if loss is None:
            raise GaplanError("training_step returned None on the probe's batch (Lightning skips such a batch): "
                              "it must return the loss for the largest samples")
        loss.backward()


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
                          f"{failure_line(message)}")
    return LargestBatches(dataset, getattr(loader, "collate_fn", None), message["order"])


def module_device(pl_module: Any) -> str:
    """``cpu`` or ``cuda:N``: where the Trainer put this rank's module."""
    device = pl_module.device
    return "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"


def smallest_over_ranks(trainer: Any, value: int) -> int:
    """The smallest ``value`` over the ranks (itself on one process)."""
    if trainer.world_size == 1:
        return value
    import torch

    return int(trainer.strategy.reduce(torch.tensor(value, device=trainer.strategy.root_device),
                                       reduce_op="min").item())
