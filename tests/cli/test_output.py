"""gaplan.cli.output: the training bar starts no thread of its own (it is made under a run's CPU budget)."""

import threading
from types import SimpleNamespace

from gaplan.cli.output import ProgressBar


def test_the_training_bar_starts_no_monitor_thread():
    """tqdm's monitor thread, started with the first bar, reserved an 8 MiB stack under a run's CPU budget: a 2-rank
    DDP train at micro-batch 16 under 160 MiB ran out of memory with the bar and trained with --quiet (2026-12-07)."""
    bar = ProgressBar(total=3, enabled=True)
    try:
        bar.step(SimpleNamespace(step=1, loss=1.0, samples_per_s=2.0, tokens_per_s=3.0))
        assert bar.bar is not None
        assert not [t for t in threading.enumerate() if type(t).__name__ == "TMonitor"]
    finally:
        bar.close()
