"""The accumulated training loop: the step, its micro-batches, checkpoints, the memory breakdown, OOM handling.

* :mod:`~gaplan.training.loop` -- :func:`train`, the loop from start (or checkpoint) to the last step;
* :mod:`~gaplan.training.checkpoint` -- saving and resuming a run's state;
* :mod:`~gaplan.training.step` -- one optimizer step of accumulated micro-batches;
* :mod:`~gaplan.training.micro_batches` -- which samples each micro-step takes;
* :mod:`~gaplan.training.oom` and :mod:`~gaplan.training.restart` -- an OOM redone at half the micro-batch;
* :mod:`~gaplan.training.breakdown` -- peak memory by category.
"""
