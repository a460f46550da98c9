"""gaplan.estimate.allocator: the CUDA caching allocator's rules replayed (c10/cuda/CUDACachingAllocator.cpp's
round_size, get_allocation_size, get_free_block, should_split, free_block), each rule on a sequence whose outcome the
source decides; tests/gpu/test_gpu_allocator.py replays random sequences against the real allocator on a card."""

from __future__ import annotations

import random

from gaplan.core.constants import MiB
from gaplan.estimate.allocator import (
    CachingAllocator,
    cuda_block_bytes,
    replayed_cuda_allocators,
    request_bytes,
    segment_bytes,
)


def test_cuda_block_rounding():
    assert cuda_block_bytes(0) == 0
    assert cuda_block_bytes(1) == 512
    assert cuda_block_bytes(512) == 512
    assert cuda_block_bytes(513) == 1024
    assert cuda_block_bytes(10 * MiB - 1) == 10 * MiB  # 512-rounded to 10 MiB: its own segment, already 2 MiB-rounded
    assert cuda_block_bytes(11 * MiB + 1) == 12 * MiB  # its own 12 MiB segment: the rest (under 1 MiB) is not split off
    assert cuda_block_bytes(10 * MiB + 1) == 10 * MiB + 512  # 1.5 MiB of its 12 MiB segment split off: the block's own
    assert cuda_block_bytes(3 * MiB + 1) == 3 * MiB + 512  # shares a 20 MiB segment: 512-rounded only


def test_requests_and_the_segments_made_for_them():
    assert request_bytes(1) == 512 and request_bytes(513) == 1024
    assert segment_bytes(512) == segment_bytes(1 * MiB) == 2 * MiB  # kSmallSize: 1 MiB is still small
    assert segment_bytes(1 * MiB + 512) == segment_bytes(10 * MiB - 512) == 20 * MiB
    assert segment_bytes(10 * MiB) == 10 * MiB and segment_bytes(10 * MiB + 512) == 12 * MiB  # own, 2 MiB-rounded


def test_blocks_of_one_to_ten_mib_share_20_mib_segments():
    allocator = CachingAllocator()
    for key in range(3):
        allocator.alloc(key, 3 * MiB)
    assert (allocator.allocated, allocator.reserved, allocator.unfilled_at_peak) == (9 * MiB, 20 * MiB, 11 * MiB)
    for key in range(3, 7):  # six fill 18 MiB; the seventh finds no cached block of 3 MiB: a second segment
        allocator.alloc(key, 3 * MiB)
    assert allocator.reserved == 40 * MiB and allocator.unfilled_at_peak == 19 * MiB


def test_small_blocks_share_2_mib_segments_and_a_large_one_is_its_own():
    allocator = CachingAllocator()
    for key in range(100):
        allocator.alloc(key, 4096)
    assert allocator.reserved == 2 * MiB and allocator.unfilled_at_peak == 2 * MiB - 100 * 4096
    large = CachingAllocator()
    large.alloc(0, 12 * MiB)
    large.alloc(1, 64 * MiB)
    assert large.reserved == large.allocated == 76 * MiB and large.unfilled_at_peak == 0


def test_a_freed_block_stays_cached_and_serves_a_smaller_request_but_not_a_larger_one():
    allocator = CachingAllocator()
    allocator.alloc("logits", 40 * MiB)
    allocator.free("logits")
    assert allocator.allocated == allocator.in_use == 0 and allocator.reserved == 40 * MiB  # the cache keeps it
    allocator.alloc("upcast", 80 * MiB)  # no cached block holds it: a segment of its own, beside the cached one
    assert (allocator.reserved, allocator.in_use) == (120 * MiB, 80 * MiB)
    assert allocator.unfilled_at_peak == 0 and allocator.cached_at_peak == 40 * MiB  # an OOM retry would free it
    allocator.alloc("next", 30 * MiB)  # the best fit is the cached 40 MiB block, split: nothing more reserved
    assert allocator.reserved == 120 * MiB and allocator.in_use == 120 * MiB and allocator.cached_at_peak == 0


def test_freed_neighbours_merge_and_the_best_fit_is_taken():
    allocator = CachingAllocator()
    for key in "abc":  # one 20 MiB segment: a, b, c, then 11 MiB free
        allocator.alloc(key, 3 * MiB)
    allocator.free("a")
    allocator.free("b")  # merged with a: one free 6 MiB block
    allocator.alloc("d", 6 * MiB)  # fits the merged block exactly
    allocator.alloc("e", 10 * MiB + 512 * 1024)  # a large request takes the 11 MiB tail (best fit), unsplit
    assert allocator.reserved == 20 * MiB and len(allocator._segments) == 1
    allocator.alloc("f", 512)  # the small pool is another: a 2 MiB segment
    assert allocator.reserved == 22 * MiB


def test_a_block_is_split_only_when_what_is_left_is_worth_keeping():
    allocator = CachingAllocator()
    allocator.alloc("a", 10 * MiB + 512 * 1024)  # its segment is 12 MiB: 1.5 MiB left, above 1 MiB, split off
    allocator.alloc("b", 1 * MiB + 256 * 1024)  # a large-pool request: the 1.5 MiB rest holds it, 0.25 MiB left whole
    assert allocator.reserved == 12 * MiB
    allocator.alloc("c", 1 * MiB + 512)  # nothing cached is left: a 20 MiB segment
    assert allocator.reserved == 32 * MiB
    small = CachingAllocator()
    small.alloc("a", 1 * MiB)  # a 2 MiB small segment: 1 MiB left, split (at least 512 bytes in the small pool)
    small.alloc("b", 1 * MiB)
    assert small.reserved == 2 * MiB and small.unfilled_at_peak == 0


def test_random_replays_keep_the_blocks_tiling_their_segments():
    """Over many random sequences: blocks tile each segment in address order, no two free blocks are neighbours,
    the cached free list is exactly the free blocks, and the counters agree with the blocks."""
    for seed in range(40):
        rng = random.Random(seed)
        allocator, live = CachingAllocator(), []
        for step in range(300):
            if live and rng.random() < 0.45:
                allocator.free(live.pop(rng.randrange(len(live))))
            else:
                size = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 2 * MiB), rng.randrange(1, 40 * MiB)])
                allocator.alloc(step, size)
                live.append(step)
            free_blocks = []
            for index, segment in enumerate(allocator._segments):
                pairs = list(zip(segment.blocks, segment.blocks[1:], strict=False))
                assert segment.blocks[0][0] == 0 and all(b[0] + b[1] == n[0] for b, n in pairs)
                assert all(b[2] or n[2] for b, n in pairs), (seed, step)
                assert segment.live == sum(block[2] for block in segment.blocks)
                free_blocks += [(b[1], index, b[0]) for b in segment.blocks if not b[2]]
            assert sorted(free_blocks) == sorted(allocator._free[True] + allocator._free[False])
            assert allocator.reserved == sum(sum(b[1] for b in s.blocks) for s in allocator._segments)
            assert allocator.in_use == sum(sum(b[1] for b in s.blocks) for s in allocator._segments if s.live)
            assert allocator.allocated == sum(allocator._placed[key][2] for key in live)
        for key in live:
            allocator.free(key)
        assert allocator.allocated == allocator.in_use == 0
        assert all(len(segment.blocks) == 1 for segment in allocator._segments)  # everything merged back


def test_memtracker_feeds_the_allocator_block_by_block():
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    with replayed_cuda_allocators() as allocators:
        tracker = MemTracker()
        with tracker:
            held = [torch.ones(3 * MiB // 4) for _ in range(3)]  # three float32 tensors of 3 MiB
            small = torch.ones(1000)  # 4,000 bytes: a 4,096-byte block in a 2 MiB segment
            del held
        trace = allocators.latest
    assert trace is allocators.of(tracker)
    assert trace.peak_allocated == 9 * MiB + 4096
    assert trace.unfilled_at_peak == (20 * MiB - 9 * MiB) + (2 * MiB - 4096)
    assert allocators.unfilled() == trace.unfilled_at_peak and allocators.cached() == 0
    assert small.numel() == 1000
    # the patch is undone: MemTracker counts a storage by its bytes again
    from torch.distributed._tools.mem_tracker import _WeakRefInfo
    assert _WeakRefInfo._calculate_mem_consumed.__qualname__.startswith("_WeakRefInfo")
