"""The edge of ``trainer.train()`` itself: each probe trial builds the user's Trainer and trains two steps.

A trial is a fresh process forked from the caller (:mod:`gaplan.core.fork`) that takes the budget
(:func:`gaplan.devices.cpu.cpu_budget`'s semantics), builds the user's model under it (``model_init()``, the
Trainer's own hook, or a copy of the model given) so weights, gradients and optimizer states count (PEFT's frozen
base and its adapters as they are), builds ``trainer_class`` with the user's
``TrainingArguments`` (precision, ``optim``, ``gradient_checkpointing``), collator and a sample of the dataset at its
longest lengths, and calls ``trainer.train()`` for two optimizer steps of two micro-batches of ``b`` samples: the
Trainer's own ``training_step``, loss, optimizer and scheduler. B* fits there and B*+1 does not. This replaces
``auto_find_batch_size``, which halves on an OOM, tests one step, and keeps no effective batch.

A model given as an object was built in this process already, so its code's first-use costs (lazy imports,
caches: a few MiB for a PEFT GPT-2) are paid here and not in the trials, while a new process that builds it under
its budget pays them: at a tight budget that is one sample. ``model_init`` (a function that builds it) keeps the
trials as cold as a new process, provided this process has not built the model before.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

from gaplan.core.errors import DoesNotFit, GaplanError
from gaplan.core.fork import failure_line, run_in_child
from gaplan.core.trial import Trial
from gaplan.core.units import format_bytes
from gaplan.devices.card import cuda_initialized
from gaplan.plan.search import find_edge
from gaplan.plan.split import default_search_cap, make_plan
from gaplan.probing.loop import LoopProbeResult, forks_start_threads, resolve_budget, trial_from
from gaplan.probing.progress import TrialBar

MICRO_STEPS = OPTIMIZER_STEPS = 2

log = logging.getLogger(__name__)


def longest_samples(dataset: Any, count: int, length: Callable[[Any], int] | None = None) -> Any:
    """``count`` samples of ``dataset``, its longest first (cycled when it has fewer): the worst case of a step.

    ``length(sample)`` defaults to ``len(sample["input_ids"])``, else the length of its ``text`` (or ``messages``,
    for a dataset the trainer tokenizes itself). A ``datasets.Dataset`` stays one (``select``)."""
    return _cycled(dataset, _longest_first(dataset, length), count)


def _longest_first(dataset: Any, length: Callable[[Any], int] | None) -> list[int]:
    """The dataset's indices, longest sample first (read once per probe: every trial takes its first ones)."""
    if len(dataset) == 0:
        raise GaplanError("the training dataset is empty: nothing to probe with")
    measure = length or _sample_length
    return sorted(range(len(dataset)), key=lambda index: measure(dataset[index]), reverse=True)


def _cycled(dataset: Any, order: list[int], count: int) -> Any:
    indices = [order[i % len(order)] for i in range(count)]
    if callable(getattr(dataset, "select", None)):
        return dataset.select(indices)
    return [dataset[index] for index in indices]


def _sample_length(sample: Any) -> int:
    if isinstance(sample, dict):
        for key in ("input_ids", "text", "messages", "prompt"):
            if key in sample:
                return len(sample[key]) if key == "input_ids" else len(str(sample[key]))
    raise GaplanError("cannot tell a sample's length (no input_ids, text or messages): pass length=")


def probe_trainer(model: Any, args: Any, train_dataset: Any, *, effective_batch: int, data_collator: Any = None,
                  trainer_class: type | None = None, memory_limit: int | str | None = None,
                  world_size: int | None = None, search_cap: int | None = None,
                  length: Callable[[Any], int] | None = None, on_trial: Callable[[Trial], None] | None = None,
                  **trainer_kwargs: Any) -> LoopProbeResult:
    """The largest ``per_device_train_batch_size`` at which ``trainer_class(model, args, ...).train()`` trains at
    steady state under ``memory_limit`` (default on CPU this process's own ``gaplan.cpu_budget``, else 1 GiB;
    the card on CUDA), and the plan for
    ``effective_batch``. ``model``: the model, or a function that builds it (``model_init``: see the module's
    note). ``args``: the ``TrainingArguments`` (or TRL's config), or a function that builds them: on a CUDA
    machine building them sets the device, after which no trial can fork, so pass the function there.
    ``world_size``: default the launch's ``WORLD_SIZE``. ``trainer_kwargs`` go to the trainer as given
    (``processing_class``, ``compute_loss_func``, ``peft_config`` for TRL, ...)."""
    from transformers import Trainer

    trainer_class = trainer_class or Trainer
    # Read from the launch, not from args.world_size: building or asking TrainingArguments sets the CUDA device.
    world_size = launch_world_size() if world_size is None else world_size
    device = trainer_device(args)
    limit = resolve_budget(device, memory_limit)
    if cuda_initialized():
        import sys

        # peft imports bitsandbytes when it is installed, and that import initializes CUDA (it reads each card's
        # compute capability): importing peft inside model_init, which runs in the trials, keeps this process clean.
        cause = (" (bitsandbytes, imported here, did: import peft and bitsandbytes inside a model_init function, "
                 "which each trial runs)" if "bitsandbytes" in sys.modules else
                 " (TrainingArguments built here on a CUDA machine set the device: pass a function that builds them, "
                 "args=lambda: TrainingArguments(...), and build the model on the CPU or in model_init)")
        raise GaplanError("this process has initialized CUDA, so trials cannot fork from it: probe the Trainer "
                          f"before anything touches the GPU{cause}")
    cap = search_cap or default_search_cap(effective_batch, world_size)
    make_plan(effective_batch, cap, world_size)  # a bad batch fails here
    single_thread = not forks_start_threads()
    order = _longest_first(train_dataset, length)
    started = time.perf_counter()
    # The Trainer's own output in each trial ({'train_runtime': ...}, dataset progress bars, config warnings): once
    # in a file, not once per trial on screen; a failed trial's last lines are logged.
    output = os.path.join(tempfile.mkdtemp(prefix="gaplan-probe-trainer-"), "trials.log")

    # A progress bar as the Trainer's own, on by default and off with its disable_tqdm (arguments given as a function
    # are not built here: building them may set the CUDA device).
    quiet = bool(getattr(args, "disable_tqdm", False)) if not callable(args) else False

    def measure(micro_batch: int) -> Trial:
        sample = _cycled(train_dataset, order, micro_batch * MICRO_STEPS * OPTIMIZER_STEPS)
        message = run_in_child(lambda: _trial(model, args, sample, data_collator, trainer_class, trainer_kwargs,
                                              device, limit, micro_batch, single_thread),
                               output, f"--- gaplan trial: per_device_train_batch_size {micro_batch}\n")
        trial = trial_from(message, micro_batch, output)
        log.info("probe_trainer: batch size %d %s (%.1f s)", micro_batch,
                 "fits" if trial.fits else f"does not fit ({trial.error})", trial.seconds)
        bar.trial("batch size", micro_batch, trial.fits)
        if on_trial is not None:
            on_trial(trial)
        return trial

    with TrialBar("the Trainer", show=not quiet) as bar:
        result = find_edge(measure, limit, max_batch=cap)
    if result.edge == 0:
        raise DoesNotFit(f"the Trainer does not fit in {format_bytes(limit)} even at batch size 1 "
                         f"({result.trials[-1].error})")
    notes = ["each forked trial ran one thread (this process had run parallel torch ops)"] if single_thread else []
    notes.append(f"the trials' own output (the Trainer's and your code's) is in {output}")
    if not _is_init(model):
        notes.append("the model was built in this process, so the trials did not pay its first-use costs (lazy "
                     "imports, caches) that a new process pays under its budget; pass model_init for the exact edge")
    return LoopProbeResult(result.edge, result.capped, result.trials, make_plan(effective_batch, result.edge,
                                                                                world_size),
                           device, limit, time.perf_counter() - started, False, notes)


def launch_world_size() -> int:
    """The data-parallel processes of this launch (torchrun's and accelerate's ``WORLD_SIZE``; 1 without one)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def built_arguments(args: Any) -> Any:
    """``args`` as ``TrainingArguments``: given so, or built by the function given."""
    return args() if _is_init(args) else args


def trainer_device(args: Any) -> str:
    """Where the trials train: ``cpu`` when the arguments say ``use_cpu``, else CUDA when there is a card.

    A function that builds the arguments is called in a child, which answers ``use_cpu``: building them sets the
    CUDA device, and this process must stay able to fork."""
    from gaplan.devices.backend import resolve_device

    if _is_init(args):
        answer = run_in_child(lambda: {"use_cpu": bool(getattr(args(), "use_cpu", False))})
        if "use_cpu" not in answer:
            raise GaplanError(f"args(), the function that builds the TrainingArguments, failed: {failure_line(answer)}")
        use_cpu = answer["use_cpu"]
    else:
        use_cpu = bool(getattr(args, "use_cpu", False))
    return "cpu" if use_cpu else resolve_device("auto")


def _is_init(model: Any) -> bool:
    """A function that builds the model (the Trainer's ``model_init``), not a model."""
    return callable(model) and not hasattr(model, "parameters")


def _trial(model: Any, args: Any, sample: Any, collator: Any, trainer_class: type, trainer_kwargs: dict,
           device: str, limit: int | None, micro_batch: int, single_thread: bool) -> dict:
    """In the forked child: the budget, then the user's Trainer on a copy of their model, two steps, measured."""
    import torch
    from transformers import TrainerCallback

    from gaplan.devices.backend import is_out_of_memory, make_backend

    if single_thread:
        torch.set_num_threads(1)
    backend = make_backend(device)
    backend.activate(limit)
    meter = {"micro": 0, "peak": 0, "steps": [], "completed": 0}

    class Meter(TrainerCallback):
        def on_step_begin(self, *unused: Any, **kwargs: Any) -> None:
            backend.reset_peak()
            meter["began"] = time.perf_counter()

        def on_pre_optimizer_step(self, *unused: Any, **kwargs: Any) -> None:
            meter["micro"] = max(meter["micro"], backend.peak_bytes())  # the micro-steps, before the step

        def on_step_end(self, *unused: Any, **kwargs: Any) -> None:
            meter["peak"] = max(meter["peak"], backend.peak_bytes())
            meter["steps"].append(time.perf_counter() - meter["began"])
            meter["completed"] += 1

    started = time.perf_counter()
    error = None
    with tempfile.TemporaryDirectory(prefix="gaplan-trainer-trial-") as output_dir:
        trial_args = dataclasses.replace(
            built_arguments(args), output_dir=output_dir, per_device_train_batch_size=micro_batch,
            gradient_accumulation_steps=MICRO_STEPS, max_steps=OPTIMIZER_STEPS, num_train_epochs=1,
            save_strategy="no", eval_strategy="no", logging_strategy="no", report_to=[], disable_tqdm=True,
            auto_find_batch_size=False, load_best_model_at_end=False, push_to_hub=False, dataloader_num_workers=0)
        try:
            built = model() if _is_init(model) else copy.deepcopy(model)
            trainer = trainer_class(model=built, args=trial_args, train_dataset=sample,
                                    data_collator=collator, callbacks=[Meter()], **trainer_kwargs)
            trainer.train()
        except Exception as exc:  # noqa: BLE001 - classified right below
            if not is_out_of_memory(exc):
                raise
            error = str(exc).splitlines()[0][:200]
    fits = error is None
    return Trial(micro_batch, fits, meter["peak"] if fits else None, round(time.perf_counter() - started, 3), error,
                 meter["completed"], (meter["micro"] or None) if fits else None, meter["steps"]).to_dict()
