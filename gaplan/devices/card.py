"""What the CUDA cards are, asked in a child so that the asking process can still fork trials.

``torch.cuda.is_available()`` calls ``cudaGetDeviceCount`` by default, and that initializes the CUDA driver; so do
``device_count``, ``get_device_properties``, ``mem_get_info``, ``current_device`` and ``set_device``. A process
forked after that cannot use the card ("CUDA error: initialization error"), and torch notices only its own lazy
init. So gaplan asks the card's questions (how many, their names, total and free memory) in a forked child, once
per process, and the answers come back as data. The asking process sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1``
first: with it, a library that calls ``is_available()`` later asks NVML instead and leaves fork usable.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from gaplan.core.errors import GaplanError
from gaplan.core.fork import failure_line, run_in_child

__all__ = ["CudaCards", "cuda_cards", "cuda_initialized", "keep_fork_safe"]

NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


@dataclass(frozen=True)
class CudaCards:
    """The CUDA cards this process can see (none on a CPU-only build), as one child found them."""

    names: tuple[str, ...] = ()
    total_bytes: tuple[int, ...] = ()
    free_bytes: tuple[int, ...] = ()  # when they were asked
    cuda_version: str | None = None
    capabilities: tuple[str | None, ...] = ()  # compute capability, "9.0"
    driver_version: str | None = None  # the NVIDIA driver's (NVML), else the CUDA driver API's, else None

    @property
    def count(self) -> int:
        return len(self.names)

    def index_of(self, device: str) -> int:
        """The index in ``cuda`` / ``cuda:N``; a one-line error for a card that is not here."""
        try:
            index = 0 if device == "cuda" else int(device.split(":", 1)[1])
        except (IndexError, ValueError):
            raise GaplanError(f"--device must be auto, cpu, cuda or cuda:N (got {device!r})") from None
        if index >= self.count:
            raise GaplanError(f"--device {device}: only {self.count} CUDA device(s) here")
        return index


_asked: CudaCards | None = None


def keep_fork_safe() -> None:
    """Make a later ``torch.cuda.is_available()`` in this process (ours or a library's) ask NVML, not the driver."""
    os.environ.setdefault(NVML_CHECK, "1")


def cuda_initialized() -> bool:
    """Whether this process has initialized CUDA through torch (then it cannot fork trials that use it).

    Asks nothing of the driver (``is_initialized`` reads torch's own flag), and imports nothing: a process without
    torch loaded has not. A driver started behind torch's back is not seen: :func:`keep_fork_safe` prevents the
    common one, ``is_available()``."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def imports_bitsandbytes(spec) -> bool:
    """Whether building ``spec`` imports bitsandbytes: installed, and LoRA (peft imports it when it is installed),
    QLoRA or an 8-bit optimizer asked for."""
    import importlib.util

    asked = spec.lora or spec.quantize or spec.optimizer in ("adamw-8bit", "paged-adamw-8bit")
    return bool(asked) and importlib.util.find_spec("bitsandbytes") is not None


def imports_initialize_cuda(device: str, spec) -> bool:
    """Whether building ``spec`` in a process that works on ``device`` would initialize CUDA there: bitsandbytes'
    import reads each card's compute capability (``torch.cuda.get_device_capability``, which initializes torch's
    CUDA) on a machine with a card. Such a build belongs in a child, never in a process that forks trials."""
    return device.startswith("cuda") and imports_bitsandbytes(spec)


def cuda_cards() -> CudaCards:
    """The cards, asked once per process: in a forked child, unless this process's CUDA is initialized already."""
    global _asked
    keep_fork_safe()
    if _asked is None:
        import torch

        if torch.version.cuda is None or not torch.backends.cuda.is_built():
            _asked = CudaCards()  # a CPU-only build: nothing to ask, nothing to start
        elif cuda_initialized():
            _asked = _cards_from(_ask_cards())  # too late to keep this process clean: asking changes nothing
        else:
            answer = run_in_child(_ask_cards)
            if "names" not in answer:
                raise GaplanError(f"asking the CUDA cards in a child failed: {failure_line(answer)}")
            _asked = _cards_from(answer)
    return _asked


def _cards_from(answer: dict) -> CudaCards:
    return CudaCards(tuple(answer["names"]), tuple(answer["total_bytes"]), tuple(answer["free_bytes"]),
                     answer["cuda_version"], tuple(answer.get("capabilities", ())), answer.get("driver_version"))


def _ask_cards() -> dict:
    """In the child: every question about the cards at once (this initializes CUDA here, and only here)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names, totals, free, capabilities = [], [], [], []
    for index in range(count):
        properties = torch.cuda.get_device_properties(index)
        names.append(str(properties.name))
        totals.append(int(properties.total_memory))
        free.append(int(torch.cuda.mem_get_info(index)[0]))
        major, minor = getattr(properties, "major", None), getattr(properties, "minor", None)
        capabilities.append(None if major is None else f"{major}.{minor}")
    return {"names": names, "total_bytes": totals, "free_bytes": free, "cuda_version": torch.version.cuda,
            "capabilities": capabilities, "driver_version": driver_version() if count else None}


def driver_version() -> str | None:
    """The NVIDIA driver's version as NVML reports it ("550.54.15"), else the CUDA driver API's ("CUDA driver 12.4",
    ``cuDriverGetVersion``), else None. Neither call starts a CUDA context, but it is asked with the cards' other
    questions, in their child."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() == 0:
            try:
                text = ctypes.create_string_buffer(96)
                if nvml.nvmlSystemGetDriverVersion(text, ctypes.c_uint(96)) == 0 and text.value:
                    return text.value.decode(errors="replace")
            finally:
                nvml.nvmlShutdown()
    except (OSError, AttributeError):
        pass  # no NVML here: the driver API's version instead
    try:
        version = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value:
            return f"CUDA driver {version.value // 1000}.{version.value % 1000 // 10}"
    except (OSError, AttributeError):
        pass
    return None

