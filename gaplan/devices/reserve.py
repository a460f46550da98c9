"""What a CUDA training process holds on the card outside PyTorch's caching allocator, as stated allowances.

``max_memory_reserved`` (the peak gaplan measures and predicts) holds neither of these, yet both take the card's
memory, so a budget that is the card's memory (``--memory-limit`` on CUDA, a target's total) loses them first:

* the CUDA context: driver state, per-SM local memory and the kernels loaded (lazily, with CUDA >= 11.7's lazy
  module loading, the default in PyTorch 2.x), typically 300-600 MiB; 700-1000 MiB without lazy loading
  (discuss.pytorch.org, "What is the reason for pytorch's GPU memory floor?" (723 MiB) and "High gpu memory
  overhead" (~800 MiB), both before lazy loading). :data:`CONTEXT_BYTES` is the allowance; ``tests/gpu`` measures
  a card's own (``test_the_cuda_context_size_is_measured``);
* NCCL's buffers, where ranks talk (world size above 1): NCCL allocates them itself, outside PyTorch's allocator,
  per channel and per peer. :func:`nccl_buffer_bytes` is the allowance.

No torch here: the estimate and the probe both read these.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gaplan.core.constants import MiB

CONTEXT_BYTES = 512 * MiB

# NCCL's documentation (Environment Variables, NCCL_BUFFSIZE): "the size of the buffer used by NCCL when
# communicating data between pairs of GPUs", default 4194304 (4 MiB). Each channel keeps one per peer it receives
# from; a ring has two peers (the previous rank and the next), and NCCL opens at most MAXCHANNELS = 32 channels
# (src/include/device.h), fewer on most topologies. So 4 MiB x 32 x 2 = 256 MiB bounds the Simple protocol's
# buffers; the LL and LL128 protocols' are smaller and left out. NCCL_BUFFSIZE and NCCL_MAX_NCHANNELS, when set,
# are read as NCCL reads them.
NCCL_BUFFSIZE = 4 * MiB
NCCL_MAX_CHANNELS = 32
NCCL_RING_PEERS = 2


def nccl_buffer_bytes(world_size: int, environ: Mapping[str, str] | None = None) -> int:
    """The allowance for NCCL's buffers on one rank of ``world_size`` ranks (0 for one process)."""
    if world_size <= 1:
        return 0
    environ = os.environ if environ is None else environ
    buffsize = _positive_int(environ.get("NCCL_BUFFSIZE"), NCCL_BUFFSIZE)
    channels = min(_positive_int(environ.get("NCCL_MAX_NCHANNELS"), NCCL_MAX_CHANNELS), NCCL_MAX_CHANNELS)
    return buffsize * channels * NCCL_RING_PEERS


def outside_allocator_bytes(world_size: int, environ: Mapping[str, str] | None = None) -> int:
    """What one rank holds on its card outside the allocator: the context and, above one process, NCCL's buffers."""
    return CONTEXT_BYTES + nccl_buffer_bytes(world_size, environ)


def _positive_int(text: str | None, default: int) -> int:
    try:
        value = int(str(text).strip(), 0) if text is not None else default
    except ValueError:
        return default
    return value if value > 0 else default
