"""Device backends behind one interface: where memory is limited, measured, and what an OOM is.

* ``cpu``  -- a real budget (RLIMIT_DATA with glibc's mmap threshold pinned), peak from VmHWM;
* ``cuda`` -- the caching allocator's peak stats, ``set_per_process_memory_fraction`` as budget.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Protocol

from gaplan.core.constants import DEFAULT_CPU_BUDGET
from gaplan.core.errors import GaplanError, is_out_of_memory

__all__ = ["DEFAULT_CPU_BUDGET", "Backend", "cuda_total_bytes", "is_out_of_memory", "make_backend", "resolve_device"]


class Backend(Protocol):
    """What a trial needs from a device."""

    name: str
    limit_bytes: int

    def activate(self, limit_bytes: int | None, enforce: bool = True) -> None:
        """Take the baseline peaks are measured from and impose the budget (``enforce``) on this process."""


    def reset_peak(self) -> None: ...

    def peak_bytes(self) -> int:
        """Peak memory used above the baseline since :meth:`reset_peak`."""

    def process_peak_bytes(self) -> int:
        """Peak memory of the whole process since :meth:`reset_peak`, with no baseline taken off."""

    def current_bytes(self) -> int: ...

    def release(self) -> None:
        """Return freed memory (allocator caches) after a trial."""

    def synchronize(self) -> None: ...


@contextlib.contextmanager
def out_of_memory_as(message: str) -> Iterator[None]:
    """Inside, an out-of-memory error is ``message`` (a :class:`GaplanError`, one line): where no retry can help."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - classified right below; anything else re-raises
        if not is_out_of_memory(exc):
            raise
        raise GaplanError(message) from None


def release_after_oom(device) -> None:
    """Give the failed attempt's cached blocks back before a retry (CUDA's caching allocator keeps them)."""
    import gc

    import torch

    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def device_name(name: str | None) -> str:
    """``--device`` as written (``auto``, ``cpu``, ``cuda``, ``cuda:N``), lower case; anything else one line. Asks no
    card: a device modelled (gaplan estimate) is checked as one used."""
    text = (name or "auto").strip().lower()
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", text):
        raise GaplanError(f"--device must be auto, cpu, cuda or cuda:N (got {name!r})")
    return text


def resolve_device(name: str = "auto") -> str:
    """``auto`` -> ``cuda:0`` when a GPU is usable, else ``cpu``; checks that ``cuda[:N]`` exists.

    The cards are asked in a child (:func:`gaplan.devices.card.cuda_cards`): this process may fork trials after."""
    name = device_name(name)
    if name == "cpu":
        return "cpu"  # without importing torch: a probe's caller need not (its worker does, at the same time)
    from gaplan.devices.card import cuda_cards

    cards = cuda_cards()
    if name == "auto":
        return "cuda:0" if cards.count else "cpu"
    if not cards.count:
        import torch

        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise GaplanError(f"--device {name}: no CUDA device is available (torch {torch.__version__}, {build})")
    return f"cuda:{cards.index_of(name)}"


def cuda_total_bytes(device: str) -> int:
    """The card's memory as the driver reports it (asked in a child)."""
    from gaplan.devices.card import cuda_cards

    cards = cuda_cards()
    return cards.total_bytes[cards.index_of(device)]


def make_backend(device: str) -> Backend:
    """The backend for a resolved device name."""
    if device == "cpu":
        from gaplan.devices.cpu import CpuBackend

        return CpuBackend()
    from gaplan.devices.cuda import CudaBackend

    return CudaBackend(device)
