"""The CUDA caching allocator's blocks and shared segments, as the estimate counts them.

PyTorch's caching allocator (``c10/cuda/CUDACachingAllocator.cpp``; the constants below are its ``kMinBlockSize``,
``kSmallSize``, ``kSmallBuffer``, ``kLargeBuffer``, ``kMinLargeAlloc`` and ``kRoundLarge``, and its
``round_size`` and ``get_allocation_size``) gives every tensor a block and asks the driver for whole segments:

* a block is the request rounded up to 512 bytes;
* a block of 1 MiB or less lives in the small pool, in 2 MiB segments that such blocks share;
* a block above 1 MiB and under 10 MiB lives in the large pool, in 20 MiB segments that such blocks share;
* a block of 10 MiB or more gets a segment of its own, rounded up to 2 MiB.

A segment stays reserved once made (the cache frees nothing until ``empty_cache`` or an OOM retry), and an OOM is
raised against what is reserved. So the reserved peak holds, besides the blocks live at that moment, the part of the
shared segments that no live block fills. :class:`SegmentPools` models that from the stream of blocks the trace sees
(each pool's segments are as many as its largest live total needs, packed without gaps), and
:func:`cuda_segment_pools` feeds it from MemTracker. Two simplifications, both stated in the estimate's ``allocator``
assumption: a 20 MiB segment is taken to hold only 1-10 MiB blocks (the allocator may also put a larger block in a
free tail, or a 1-10 MiB block in a freed larger one: then this reads high by up to that block), and
fragmentation inside the pools (gaps between blocks) is not modelled (it reads low by that).

No torch at import.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from gaplan.core.constants import MiB
from gaplan.estimate.torch_private import missing, private, private_attr

# c10/cuda/CUDACachingAllocator.cpp (the same values in c10/cuda/CUDAAllocatorConfig.h in later releases):
#   kMinBlockSize = 512        all sizes are rounded to at least 512 bytes
#   kSmallSize = 1048576       largest "small" allocation is 1 MiB
#   kSmallBuffer = 2097152     "small" allocations are packed in 2 MiB blocks
#   kLargeBuffer = 20971520    "large" allocations may be packed in 20 MiB blocks
#   kMinLargeAlloc = 10485760  allocations between 1 and 10 MiB may use kLargeBuffer
#   kRoundLarge = 2097152      round up large allocations to 2 MiB
CUDA_BLOCK = 512
CUDA_SMALL_SIZE = 1 * MiB
CUDA_SMALL_SEGMENT = 2 * MiB
CUDA_MID_SEGMENT = 20 * MiB
CUDA_LARGE_ALLOC = 10 * MiB
CUDA_ROUND_LARGE = 2 * MiB

SHARED_SEGMENTS = {"small": CUDA_SMALL_SEGMENT, "mid": CUDA_MID_SEGMENT}  # pool -> its segments' size


def cuda_block_bytes(nbytes: int) -> int:
    """Bytes the CUDA caching allocator sets aside for a tensor of ``nbytes``: its block, or its own segment."""
    if nbytes <= 0:
        return 0
    block = -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK
    if block >= CUDA_LARGE_ALLOC:
        return -(-block // CUDA_ROUND_LARGE) * CUDA_ROUND_LARGE
    return block


def segment_pool(block: int) -> str | None:
    """The shared pool a block of ``block`` bytes lives in (``small``, ``mid``), or None when it has its own segment."""
    if block <= 0 or block >= CUDA_LARGE_ALLOC:
        return None
    return "small" if block <= CUDA_SMALL_SIZE else "mid"


def segments_bytes(live: int, segment: int) -> int:
    """Bytes of ``segment``-sized segments that ``live`` bytes of blocks need, packed without gaps."""
    return -(-live // segment) * segment if live > 0 else 0


class SegmentPools:
    """The shared segments of one trace: what the live blocks need, and the part no live block fills at the peak.

    ``change(block, +1)`` when a block is made, ``change(block, -1)`` when it is freed. ``allocated`` is the bytes of
    live blocks; ``reserved`` is ``allocated`` plus what the shared segments made so far hold unfilled (a segment is
    never given back). ``unfilled_at_peak`` is ``peak_reserved - peak_allocated``: what the estimate adds to the
    traced peak, which is the allocated one.
    """

    def __init__(self) -> None:
        self.live = dict.fromkeys(SHARED_SEGMENTS, 0)
        self.segments = dict.fromkeys(SHARED_SEGMENTS, 0)  # bytes of segments made, per pool
        self.allocated = 0
        self.peak_allocated = 0
        self.peak_reserved = 0

    @property
    def reserved(self) -> int:
        return self.allocated + sum(self.segments[pool] - self.live[pool] for pool in SHARED_SEGMENTS)

    @property
    def unfilled_at_peak(self) -> int:
        return max(0, self.peak_reserved - self.peak_allocated)

    def change(self, block: int, sign: int) -> None:
        """A block of ``block`` bytes made (``sign`` +1) or freed (-1)."""
        self.allocated += sign * block
        pool = segment_pool(block)
        if pool is not None:
            self.live[pool] += sign * block
            self.segments[pool] = max(self.segments[pool], segments_bytes(self.live[pool], SHARED_SEGMENTS[pool]))
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)


class TracePools:
    """The :class:`SegmentPools` of each MemTracker seen, by tracker; ``latest`` is the last tracker's."""

    def __init__(self) -> None:
        self._by_tracker: dict[int, SegmentPools] = {}
        self.latest: SegmentPools | None = None

    def of(self, tracker: object) -> SegmentPools:
        pools = self._by_tracker.get(id(tracker))
        if pools is None:  # a new trace: one tracker per measure_breakdown
            self._by_tracker = {id(tracker): SegmentPools()}
            pools = self.latest = self._by_tracker[id(tracker)]
        return pools

    def unfilled(self) -> int:
        """What the last trace's shared segments held unfilled at its reserved peak (0 before any trace)."""
        return self.latest.unfilled_at_peak if self.latest is not None else 0


@contextlib.contextmanager
def cuda_segment_pools() -> Iterator[TracePools]:
    """Count each storage at the CUDA allocator's block (MemTracker does so only for cuda tensors), and follow the
    shared segments those blocks need through each trace: yields the :class:`TracePools`."""
    info = private("torch.distributed._tools.mem_tracker", "_WeakRefInfo")
    tracker_class = private("torch.distributed._tools.mem_tracker", "MemTracker")
    update_type = private("torch.distributed._tools.mem_tracker", "_UpdateType")
    original_size = private_attr(info, "_calculate_mem_consumed")
    original_update = private_attr(tracker_class, "_update_snap")
    init_code = getattr(info.__init__, "__code__", None)
    if init_code is None or not {"size", "element_size"} <= set(init_code.co_names):
        raise missing("_WeakRefInfo.size and .element_size")
    update_code = getattr(original_update, "__code__", None)
    if update_code is None or update_code.co_varnames[:5] != ("self", "u_type", "winfo", "old_mem_consumed",
                                                              "old_reftype"):
        raise missing("MemTracker._update_snap(u_type, winfo, old_mem_consumed, old_reftype)")
    for name in ("ADD", "DEL", "SIZE"):
        private_attr(update_type, name)
    pools = TracePools()

    def rounded(self) -> int:
        return cuda_block_bytes(self.size * self.element_size)

    def update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None):
        original_update(self, u_type, winfo, old_mem_consumed=old_mem_consumed, old_reftype=old_reftype)
        trace = pools.of(self)
        if u_type == update_type.ADD:
            trace.change(winfo.mem_consumed, +1)
        elif u_type == update_type.DEL:
            trace.change(winfo.mem_consumed, -1)
        elif u_type == update_type.SIZE and old_mem_consumed is not None:
            trace.change(old_mem_consumed, -1)
            trace.change(winfo.mem_consumed, +1)

    info._calculate_mem_consumed = rounded
    tracker_class._update_snap = update_snap
    try:
        yield pools
    finally:
        info._calculate_mem_consumed = original_size
        tracker_class._update_snap = original_update
