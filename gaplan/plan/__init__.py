"""Torch-free decisions: the accumulation split, the edge search, token packing and budgets, parallel layouts.

* :mod:`~gaplan.plan.split` -- effective batch = micro-batch x accumulation steps x world size;
* :mod:`~gaplan.plan.search` -- the trial sequence that finds the exact edge B*;
* :mod:`~gaplan.plan.tokens` -- token budgets (T*) and length profiles;
* :mod:`~gaplan.plan.packing` -- micro-batches of a token budget;
* :mod:`~gaplan.plan.layouts` -- DDP/FSDP layouts, their rows and launch commands.
"""
