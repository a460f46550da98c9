"""A probe's trials as a progress bar on stderr, as the Trainer and accelerate's scripts show their steps (tqdm)."""

from __future__ import annotations

from typing import Any


class TrialBar:
    """One bar for a probe's trials: each trial's size and whether it fit; ``show=False`` draws nothing."""

    def __init__(self, what: str, show: bool = True) -> None:
        from tqdm.auto import tqdm

        # Without tqdm's monitor thread: the trials fork from this process, and a thread holding tqdm's lock at a
        # fork would leave it held in the trial (whose user code may draw bars of its own).
        interval, tqdm.monitor_interval = tqdm.monitor_interval, 0
        try:
            self.bar = tqdm(desc=f"gaplan: probing {what}", unit="trial", disable=not show)
        finally:
            tqdm.monitor_interval = interval

    def trial(self, size_name: str, size: int, fits: bool) -> None:
        self.bar.set_postfix_str(f"{size_name} {size} {'fits' if fits else 'does not fit'}")
        self.bar.update(1)

    def __enter__(self) -> TrialBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.close()
