"""Common GPUs as ``gaplan estimate`` targets: their memory, and what of it training tensors can use.

Pure data, no torch. ``total_bytes`` is what the driver reports (``nvidia-smi`` "Total", the
``total_memory`` of ``torch.cuda.get_device_properties``), not the marketing number: an "80 GB"
H100 reports 81,559 MiB, a "48 GB" L40S 46,068 MiB. Figures from NVML as tabulated by Modal
(https://thundergolfer.com/blog/nvidia-gpu-memory-capacity: H200, H100, A100, A10, L40S, L4, T4) and
from ``nvidia-smi`` outputs of the other cards (H100 NVL 95,830 MiB, RTX 4090 24,564 MiB,
RTX 3090 24,576 MiB, V100 32 GB 32,510 MiB, V100 16 GB 16,160 MiB).

What a training process can give to tensors is less than the total: the CUDA context and the
cuBLAS/cuBLASLt workspaces (:mod:`gaplan.estimate.device` says how large and why).
``usable_bytes = total_bytes - context_bytes - workspace_bytes`` is the budget the estimate
compares its traced peak with.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gaplan.core.constants import MiB
from gaplan.core.errors import GaplanError
from gaplan.devices.reserve import CONTEXT_BYTES
from gaplan.estimate.device import WORKSPACE_BYTES_HOPPER, WORKSPACE_BYTES_OTHER


@dataclass(frozen=True)
class Target:
    """One GPU: its reported memory and what the estimate may use of it."""

    name: str
    description: str
    total_bytes: int
    compute_capability: str
    context_bytes: int = CONTEXT_BYTES
    workspace_bytes: int = WORKSPACE_BYTES_OTHER

    @property
    def reserve_bytes(self) -> int:
        """CUDA context plus library workspaces: memory the training tensors cannot have."""
        return self.context_bytes + self.workspace_bytes

    @property
    def usable_bytes(self) -> int:
        return self.total_bytes - self.reserve_bytes

    @property
    def has_bf16(self) -> bool:
        """Whether the card computes in bf16 (tensor cores from compute capability 8.0, Ampere, on); a V100 or T4
        runs bf16 emulated, far slower than fp16."""
        return int(self.compute_capability.split(".")[0]) >= 8

    def to_dict(self) -> dict:
        data = asdict(self)
        data["reserve_bytes"] = self.reserve_bytes
        data["usable_bytes"] = self.usable_bytes
        return data


def _target(name: str, description: str, mib: int, capability: str) -> Target:
    hopper = capability.startswith("9.")
    return Target(name, description, mib * MiB, capability,
                  workspace_bytes=WORKSPACE_BYTES_HOPPER if hopper else WORKSPACE_BYTES_OTHER)


_TARGETS = (
    _target("h200", "NVIDIA H200 141 GB (SXM / NVL)", 143_771, "9.0"),
    _target("h100-94gb", "NVIDIA H100 NVL 94 GB", 95_830, "9.0"),
    _target("h100-80gb", "NVIDIA H100 80 GB (SXM / PCIe)", 81_559, "9.0"),
    _target("a100-80gb", "NVIDIA A100 80 GB", 81_920, "8.0"),
    _target("a100-40gb", "NVIDIA A100 40 GB", 40_960, "8.0"),
    _target("l40s", "NVIDIA L40S 48 GB", 46_068, "8.9"),
    _target("a10g", "NVIDIA A10G / A10 24 GB (AWS g5)", 23_028, "8.6"),
    _target("l4", "NVIDIA L4 24 GB", 23_034, "8.9"),
    _target("rtx-4090", "NVIDIA GeForce RTX 4090 24 GB", 24_564, "8.9"),
    _target("rtx-3090", "NVIDIA GeForce RTX 3090 24 GB", 24_576, "8.6"),
    _target("t4", "NVIDIA T4 16 GB", 15_360, "7.5"),
    _target("v100-32gb", "NVIDIA V100 32 GB", 32_510, "7.0"),
    _target("v100-16gb", "NVIDIA V100 16 GB", 16_160, "7.0"),
)
_BY_NAME = {t.name: t for t in _TARGETS}
_ALIASES = {"h100": "h100-80gb", "h100-nvl": "h100-94gb", "a100": "a100-80gb", "a10": "a10g",
            "4090": "rtx-4090", "3090": "rtx-3090", "v100": "v100-32gb"}


def bf16_caveat(name: str, dtype: str) -> str | None:
    """What bf16 asked of target ``name`` costs when the card has none (a V100, a T4); None otherwise."""
    target = lookup_target(name)
    if dtype != "bf16" or target.has_bf16:
        return None
    return (f"caveat: {target.name} (compute capability {target.compute_capability}) has no bf16: bf16 runs emulated "
            "there, far slower than fp16; --dtype auto (the default) plans with fp16 on this card.")


def list_targets() -> list[Target]:
    """Every known target, largest memory first."""
    return list(_TARGETS)


def lookup_target(name: str) -> Target:
    """The target called ``name`` (case and ``_``/space insensitive; a few short aliases such as ``h100``)."""
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    key = _ALIASES.get(key, key)
    if key not in _BY_NAME:
        raise GaplanError(f"unknown target {name!r}; known: {', '.join(_BY_NAME)}")
    return _BY_NAME[key]
