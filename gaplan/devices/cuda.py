"""CUDA backend: the caching allocator's peak, and a smaller card emulated by a memory fraction.

The peak is ``max_memory_reserved`` (what the allocator holds, and what
``set_per_process_memory_fraction`` limits); ``max_memory_allocated`` is kept too.
Out of memory is ``torch.OutOfMemoryError``; after one, the cache is emptied.
"""

from __future__ import annotations

import gc

import torch


class CudaBackend:
    """Budget by per-process memory fraction (default: the whole card); peak from allocator stats."""

    def __init__(self, device: str) -> None:
        self.name = device
        self.device = torch.device(device)
        self.limit_bytes = 0
        self.peak_allocated_bytes = 0

    def activate(self, limit_bytes: int | None, enforce: bool = True) -> None:
        torch.cuda.set_device(self.device)
        total = torch.cuda.get_device_properties(self.device).total_memory
        self.limit_bytes = min(limit_bytes or total, total)
        if enforce and self.limit_bytes < total:
            torch.cuda.set_per_process_memory_fraction(self.limit_bytes / total, self.device)


    def reset_peak(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> int:
        torch.cuda.synchronize(self.device)
        self.peak_allocated_bytes = torch.cuda.max_memory_allocated(self.device)
        return torch.cuda.max_memory_reserved(self.device)

    def process_peak_bytes(self) -> int:
        return self.peak_bytes()  # the allocator's own peak: already this process's alone

    def current_bytes(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def release(self) -> None:
        gc.collect()
        torch.cuda.empty_cache()

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)
