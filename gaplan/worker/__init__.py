"""The trial worker: ``python -m gaplan.worker`` forks a fresh child per trial under the memory budget.

* :mod:`~gaplan.worker.serve` -- the worker process; :mod:`~gaplan.worker.client` -- the probe's side;
* :mod:`~gaplan.worker.protocol` -- the JSON-line messages; :mod:`~gaplan.worker.trial` -- one trial;
* :mod:`~gaplan.worker.ranks` -- a trial over W ranks.
"""
