"""gaplan.estimate.allocator: the CUDA caching allocator's blocks and the 2 and 20 MiB segments they share."""

from __future__ import annotations

from gaplan.core.constants import MiB
from gaplan.estimate.allocator import (
    CUDA_MID_SEGMENT,
    CUDA_SMALL_SEGMENT,
    SegmentPools,
    cuda_block_bytes,
    cuda_segment_pools,
    segment_pool,
    segments_bytes,
)


def test_cuda_block_rounding():
    assert cuda_block_bytes(0) == 0
    assert cuda_block_bytes(1) == 512
    assert cuda_block_bytes(512) == 512
    assert cuda_block_bytes(513) == 1024
    assert cuda_block_bytes(10 * MiB - 1) == 10 * MiB  # 512-rounded to 10 MiB: its own segment, already 2 MiB-rounded
    assert cuda_block_bytes(10 * MiB + 1) == 12 * MiB  # its own segment, 2 MiB-rounded
    assert cuda_block_bytes(3 * MiB + 1) == 3 * MiB + 512  # shares a 20 MiB segment: 512-rounded only


def test_which_pool_a_block_shares():
    assert segment_pool(512) == "small" and segment_pool(1 * MiB) == "small"  # kSmallSize: 1 MiB is still small
    assert segment_pool(1 * MiB + 512) == "mid" and segment_pool(10 * MiB - 512) == "mid"
    assert segment_pool(10 * MiB) is None and segment_pool(64 * MiB) is None  # kMinLargeAlloc: own segment
    assert segment_pool(0) is None
    assert segments_bytes(0, CUDA_MID_SEGMENT) == 0
    assert segments_bytes(1, CUDA_SMALL_SEGMENT) == 2 * MiB
    assert segments_bytes(20 * MiB, CUDA_MID_SEGMENT) == 20 * MiB
    assert segments_bytes(20 * MiB + 512, CUDA_MID_SEGMENT) == 40 * MiB


def test_blocks_of_one_to_ten_mib_reserve_whole_20_mib_segments():
    pools = SegmentPools()
    for _ in range(3):
        pools.change(3 * MiB, +1)
    assert (pools.allocated, pools.reserved, pools.unfilled_at_peak) == (9 * MiB, 20 * MiB, 11 * MiB)
    for _ in range(4):  # 21 MiB live: a second segment
        pools.change(3 * MiB, +1)
    assert pools.reserved == 40 * MiB and pools.unfilled_at_peak == 19 * MiB


def test_small_blocks_reserve_2_mib_segments_and_large_ones_add_nothing():
    pools = SegmentPools()
    for _ in range(100):
        pools.change(4096, +1)
    assert pools.reserved == 2 * MiB and pools.unfilled_at_peak == 2 * MiB - 100 * 4096
    large = SegmentPools()
    large.change(12 * MiB, +1)
    large.change(64 * MiB, +1)
    assert large.reserved == large.allocated == 76 * MiB and large.unfilled_at_peak == 0


def test_a_segment_stays_reserved_after_its_blocks_are_freed():
    pools = SegmentPools()
    pools.change(5 * MiB, +1)
    pools.change(5 * MiB, -1)
    assert pools.allocated == 0 and pools.reserved == 20 * MiB  # the cache keeps it
    pools.change(30 * MiB, +1)  # a block of its own segment, on top of the cached one
    assert pools.peak_allocated == 30 * MiB and pools.peak_reserved == 50 * MiB
    assert pools.unfilled_at_peak == 20 * MiB
    pools.change(5 * MiB, +1)  # reuses the cached segment: nothing more reserved
    assert pools.reserved == 50 * MiB and pools.peak_allocated == 35 * MiB and pools.unfilled_at_peak == 15 * MiB


def test_memtracker_feeds_the_pools_block_by_block():
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    with cuda_segment_pools() as pools:
        tracker = MemTracker()
        with tracker:
            held = [torch.ones(3 * MiB // 4) for _ in range(3)]  # three float32 tensors of 3 MiB
            small = torch.ones(1000)  # 4,000 bytes: a 4,096-byte block in a 2 MiB segment
            del held
        trace = pools.latest
    assert trace is pools.of(tracker)
    assert trace.peak_allocated == 9 * MiB + 4096
    assert trace.unfilled_at_peak == (20 * MiB - 9 * MiB) + (2 * MiB - 4096)
    assert small.numel() == 1000
    # the patch is undone: MemTracker counts a storage by its bytes again
    from torch.distributed._tools.mem_tracker import _WeakRefInfo
    assert _WeakRefInfo._calculate_mem_consumed.__qualname__.startswith("_WeakRefInfo")
