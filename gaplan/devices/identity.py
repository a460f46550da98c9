"""What a probe's B* depends on besides the workload and the budget: the device, the libraries, the allocator.

A cached probe (:mod:`gaplan.probing.cache`) is reused only where all of these match, so a cache on a shared home
does not hand an A100-40GB's B* to an H100-80GB, nor keep it across a torch upgrade that changes the kernels'
workspaces:

* the device: on CUDA the card's model, total memory and compute capability and the driver's version, asked in a
  child with the card's other questions (:func:`gaplan.devices.card.cuda_cards`; this process stays fork-safe);
  on CPU their equivalents, the processor's model name and the machine's total memory (no capability, no driver:
  None);
* the versions of torch, transformers, peft and bitsandbytes, from the installed packages' metadata (nothing is
  imported; None where one is not installed);
* the CUDA caching allocator's setting, ``PYTORCH_CUDA_ALLOC_CONF`` and its newer name ``PYTORCH_ALLOC_CONF``
  (``expandable_segments``, ``garbage_collection_threshold``, ``max_split_size_mb`` change the reserved peak).
  It is part of a CUDA device's identity only: on CPU torch's allocator does not read it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import metadata

from gaplan.core.units import format_bytes
from gaplan.runs.probe_result import ALLOCATOR_VARIABLES, allocator_setting, describe_allocator

__all__ = ["ALLOCATOR_VARIABLES", "LIBRARIES", "MachineIdentity", "allocator_setting", "describe_allocator",
           "library_versions", "machine_identity"]

LIBRARIES = ("torch", "transformers", "peft", "bitsandbytes")


@dataclass(frozen=True)
class MachineIdentity:
    """One device of one machine, with its libraries and allocator setting, as a probe cache key holds them."""

    device: str
    model: str | None  # the card's name, or the processor's model name
    total_bytes: int | None  # the card's memory, or the machine's
    capability: str | None  # compute capability ("9.0"); None on CPU
    driver: str | None  # the NVIDIA driver's version; None on CPU
    libraries: tuple[tuple[str, str | None], ...]
    allocator: tuple[tuple[str, str], ...] | None  # the CUDA allocator's variables that are set; None on CPU

    def key(self) -> dict:
        """The fields, for a cache key (JSON)."""
        return {"device_model": self.model, "device_total_bytes": self.total_bytes,
                "compute_capability": self.capability, "driver": self.driver, "libraries": dict(self.libraries),
                "allocator": None if self.allocator is None else dict(self.allocator)}

    def describe(self) -> str:
        """What matched, in one line's words: the device, the libraries and (on CUDA) the allocator's setting."""
        device = ", ".join([f"{self.device} {self.model or '(model unknown)'}", format_bytes(self.total_bytes),
                            *([f"compute {self.capability}"] if self.capability else []),
                            *([f"driver {self.driver}"] if self.driver else [])])
        libraries = ", ".join(f"{name} {version or 'absent'}" for name, version in self.libraries)
        allocator = "" if self.allocator is None else f"; {describe_allocator(dict(self.allocator))}"
        return f"{device}; {libraries}{allocator}"


def machine_identity(device: str) -> MachineIdentity:
    """The identity of ``device`` (``cpu`` or ``cuda:N``) on this machine. A card that is not here has None fields
    (the probe itself then fails, not its key)."""
    libraries = tuple(library_versions().items())
    if not device.startswith("cuda"):
        return MachineIdentity(device, cpu_model(), total_memory_bytes(), None, None, libraries, None)
    from gaplan.core.errors import GaplanError
    from gaplan.devices.card import cuda_cards

    cards = cuda_cards()
    allocator = tuple(allocator_setting().items())
    try:
        index = cards.index_of(device)
    except GaplanError:
        return MachineIdentity(device, None, None, None, None, libraries, allocator)
    capability = cards.capabilities[index] if index < len(cards.capabilities) else None
    return MachineIdentity(device, cards.names[index], cards.total_bytes[index], capability, cards.driver_version,
                           libraries, allocator)


def library_versions() -> dict[str, str | None]:
    """torch's, transformers', peft's and bitsandbytes' installed versions (None: not installed); imports none."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def cpu_model() -> str | None:
    """The processor's model name (``/proc/cpuinfo``; the platform's name elsewhere), or None where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                name, _, value = line.partition(":")
                if name.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or None


def total_memory_bytes() -> int | None:
    """The machine's memory (``MemTotal``), or None where unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
