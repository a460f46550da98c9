"""``python -m gaplan.worker``: the trial worker's process (see :mod:`gaplan.worker.serve`)."""

from gaplan.worker.serve import main

main()
