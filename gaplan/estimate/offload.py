"""Activation offloading (``offload_activations``) as the device sees it, for the traces.

A GPU run wraps each forward in torch's ``save_on_cpu(pin_memory=True)``
(:meth:`gaplan.workload.build.Workload.forward_context`): every tensor autograd saves for backward is copied to pinned
host memory, the device's copy is dropped as soon as nothing else holds it, and backward's unpack copies it back to
the device, a fresh contiguous tensor that lives while its node's backward runs. The traces run on fake CPU tensors,
where ``save_on_cpu`` would move nothing, so they run :func:`offloaded_to_host` instead: the same pack and unpack,
with the host copy reduced to its shape (host memory is not the budget) and the unpack a fresh fake tensor of that
shape on the device, which the tracker counts as the GPU's allocator would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class HostCopies:
    """The bytes copied to the host since :meth:`reset` (what the link carries each way)."""

    def __init__(self) -> None:
        self.bytes = 0

    def reset(self) -> None:
        self.bytes = 0


@contextlib.contextmanager
def offloaded_to_host(copies: HostCopies | None = None) -> Iterator[None]:
    """Inside, each tensor saved for backward leaves the (traced) device and comes back, a fresh copy, in backward;
    ``copies`` counts the bytes sent."""

    def pack(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Size]:
        if copies is not None:
            copies.bytes += tensor.numel() * tensor.element_size()
        # An empty tensor of the same kind stands for the host copy: it holds no bytes, and a fake one's new_empty is
        # fake too (made under the trace's mode, counted by its tracker).
        return tensor.new_empty(0), tensor.shape

    def unpack(packed: tuple[torch.Tensor, torch.Size]) -> torch.Tensor:
        kind, shape = packed
        return kind.new_empty(shape)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield
