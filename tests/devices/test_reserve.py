"""gaplan.devices.reserve: the allowances for what a CUDA process holds outside PyTorch's allocator."""

from __future__ import annotations

from gaplan.core.constants import MiB
from gaplan.devices.reserve import CONTEXT_BYTES, nccl_buffer_bytes, outside_allocator_bytes


def test_nccls_buffers_are_buffsize_by_channels_by_ring_peers():
    assert nccl_buffer_bytes(1, {}) == 0  # one process: no NCCL
    assert nccl_buffer_bytes(2, {}) == 4 * MiB * 32 * 2 == 256 * MiB
    assert nccl_buffer_bytes(8, {}) == 256 * MiB  # per rank: a ring's two peers, whatever the world
    assert nccl_buffer_bytes(2, {"NCCL_BUFFSIZE": str(2 * MiB)}) == 128 * MiB  # read as NCCL reads it
    assert nccl_buffer_bytes(2, {"NCCL_BUFFSIZE": "0x100000", "NCCL_MAX_NCHANNELS": "8"}) == 1 * MiB * 8 * 2
    assert nccl_buffer_bytes(2, {"NCCL_BUFFSIZE": "lots", "NCCL_MAX_NCHANNELS": "-1"}) == 256 * MiB  # NCCL's defaults


def test_outside_the_allocator_is_the_context_and_above_one_rank_nccl():
    assert CONTEXT_BYTES == 512 * MiB
    assert outside_allocator_bytes(1, {}) == CONTEXT_BYTES
    assert outside_allocator_bytes(2, {}) == CONTEXT_BYTES + 256 * MiB
