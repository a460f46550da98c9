"""The CUDA caching allocator's blocks and segments, simulated as the estimate counts them.

PyTorch's caching allocator (``c10/cuda/CUDACachingAllocator.cpp``; the constants below are its ``kMinBlockSize``,
``kSmallSize``, ``kSmallBuffer``, ``kLargeBuffer``, ``kMinLargeAlloc`` and ``kRoundLarge``, and its
``round_size``, ``get_allocation_size``, ``get_free_block``, ``should_split`` and ``free_block``) gives every tensor
a block and asks the driver for whole segments:

* a request is rounded up to 512 bytes; one of 1 MiB or less is served from the small pool, a larger one from the
  large pool;
* the pool's cached free block that fits best (the smallest that holds it) is taken; a block is split when what is
  left is worth keeping (at least 512 bytes in the small pool, more than 1 MiB in the large one), else it is handed
  out whole;
* only when no cached block fits is a segment made: 2 MiB for a small request, 20 MiB for one under 10 MiB, else the
  request rounded up to 2 MiB;
* a freed block goes back to its pool, merged with free neighbours of its segment; no segment is given back (the
  cache frees nothing until ``empty_cache``, or an out-of-memory retry frees the wholly free segments).

:class:`CachingAllocator` replays the blocks the trace sees, in order, through these rules (one stream, torch's
default settings: no ``max_split_size_mb``, no expandable segments, no garbage collection threshold), and keeps two
high-water marks: the segments that hold a live block (what a run must fit: an out-of-memory retry gives the wholly
free ones back first) and every segment made (what ``max_memory_reserved`` and nvidia-smi show in a run with room:
cached free segments, such as a large tensor's freed before a larger one is asked for, stay reserved).
:func:`replayed_cuda_allocators` feeds it from MemTracker. What it leaves out, said in the estimate's ``allocator``
assumption: other streams (a block cached by one stream serves only that stream: FSDP's all-gather and
reduce-scatter streams keep their own), and blocks whose freeing waits on another stream's events.

No torch at import.
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from gaplan.core.constants import MiB
from gaplan.core.units import format_bytes
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


def cuda_block_bytes(nbytes: int) -> int:
    """Bytes the estimate counts for a tensor of ``nbytes`` (what MemTracker adds, and ``max_memory_allocated``):
    its block as a new segment hands it out, the request rounded up to 512 bytes, or for 10 MiB or more the whole
    2 MiB-rounded segment when what is left of it (1 MiB or less) is not split off."""
    if nbytes <= 0:
        return 0
    block = request_bytes(nbytes)
    segment = segment_bytes(block)
    return segment if block >= CUDA_LARGE_ALLOC and segment - block <= CUDA_SMALL_SIZE else block


def request_bytes(nbytes: int) -> int:
    """``round_size``: a request rounded up to 512 bytes (512 at least)."""
    return max(CUDA_BLOCK, -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK)


def segment_bytes(request: int) -> int:
    """``get_allocation_size``: the segment made for a ``request`` no cached block holds."""
    if request <= CUDA_SMALL_SIZE:
        return CUDA_SMALL_SEGMENT
    if request < CUDA_LARGE_ALLOC:
        return CUDA_MID_SEGMENT
    return -(-request // CUDA_ROUND_LARGE) * CUDA_ROUND_LARGE


@dataclass
class _Segment:
    small: bool  # the small pool's (2 MiB, requests of 1 MiB or less) or the large pool's
    size: int
    blocks: list[list[int]]  # [offset, size, live (0 or 1)], in address order, covering the segment
    live: int = 0  # blocks handed out


class CachingAllocator:
    """One trace's blocks through the caching allocator's rules (the module's docstring): ``alloc(key, nbytes)`` when
    a tensor's storage is made, ``free(key)`` when it is freed.

    ``allocated`` counts each live block as :func:`cuda_block_bytes` does (what the trace's peak adds up);
    ``in_use`` is the bytes of segments holding a live block, ``reserved`` of every segment made. Their peaks give
    ``unfilled_at_peak`` (what a run needs beyond the allocated peak) and ``cached_at_peak`` (what a run with room
    keeps reserved beyond that: wholly free cached segments)."""

    def __init__(self) -> None:
        self._free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}  # (size, segment, offset), sorted
        self._segments: list[_Segment] = []
        self._placed: dict[int, tuple[int, int, int]] = {}  # key -> (segment, offset, counted bytes)
        self.allocated = self.in_use = self.reserved = 0
        self.peak_allocated = self.peak_in_use = self.peak_reserved = 0

    @property
    def unfilled_at_peak(self) -> int:
        return max(0, self.peak_in_use - self.peak_allocated)

    @property
    def cached_at_peak(self) -> int:
        return max(0, self.peak_reserved - self.peak_in_use)

    def alloc(self, key: int, nbytes: int) -> None:
        if key in self._placed:  # a storage seen again (resized): it was freed first
            self.free(key)
        if nbytes <= 0:  # the allocator hands out no block for an empty tensor
            return
        request = request_bytes(nbytes)
        small = request <= CUDA_SMALL_SIZE
        free = self._free[small]
        found = bisect.bisect_left(free, (request, -1, -1))
        if found < len(free):  # get_free_block: the best fit (smallest, then lowest address)
            size, index, offset = free.pop(found)
        else:  # alloc_block: a new segment
            size, index, offset = segment_bytes(request), len(self._segments), 0
            self._segments.append(_Segment(small, size, [[0, size, 0]]))
            self.reserved += size
        segment = self._segments[index]
        position = _position(segment, offset)
        rest = size - request
        if rest >= CUDA_BLOCK if small else rest > CUDA_SMALL_SIZE:  # should_split
            segment.blocks[position:position + 1] = [[offset, request, 1], [offset + request, rest, 0]]
            bisect.insort(free, (rest, index, offset + request))
        else:
            segment.blocks[position][2] = 1
        if segment.live == 0:
            self.in_use += segment.size
        segment.live += 1
        counted = cuda_block_bytes(nbytes)
        self._placed[key] = (index, offset, counted)
        self.allocated += counted
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, key: int) -> None:
        placed = self._placed.pop(key, None)
        if placed is None:  # made before the trace followed it
            return
        index, offset, counted = placed
        self.allocated -= counted
        segment = self._segments[index]
        free = self._free[segment.small]
        position = _position(segment, offset)
        segment.blocks[position][2] = 0
        segment.live -= 1
        if segment.live == 0:
            self.in_use -= segment.size
        blocks = segment.blocks  # free_block: merged with a free neighbour on either side
        if position + 1 < len(blocks) and not blocks[position + 1][2]:
            after = blocks.pop(position + 1)
            free.remove((after[1], index, after[0]))
            blocks[position][1] += after[1]
        if position > 0 and not blocks[position - 1][2]:
            before = blocks[position - 1]
            free.remove((before[1], index, before[0]))
            before[1] += blocks.pop(position)[1]
            position -= 1
        bisect.insort(free, (blocks[position][1], index, blocks[position][0]))


def _position(segment: _Segment, offset: int) -> int:
    """Where the block at ``offset`` is in its segment's list (blocks are in address order)."""
    return bisect.bisect_left(segment.blocks, [offset])


def allocator_text(unfilled: int | None, sharded: bool = False) -> tuple[str, dict[str, int]]:
    """The estimate's ``allocator`` assumption, its text and values: the caching allocator as replayed here;
    ``unfilled``: what its segments held beyond the live blocks at the peak, added to it (None: before a trace);
    ``sharded``: one rank of an FSDP step."""
    values = {"block_bytes": CUDA_BLOCK, "small_size_bytes": CUDA_SMALL_SIZE,
              "small_segment_bytes": CUDA_SMALL_SEGMENT, "mid_segment_bytes": CUDA_MID_SEGMENT,
              "large_alloc_bytes": CUDA_LARGE_ALLOC, "round_large_bytes": CUDA_ROUND_LARGE}
    text = (f"CUDA caching allocator, its reserved peak: the trace's blocks replayed through its rules (requests "
            f"rounded up to {CUDA_BLOCK} bytes; the best-fitting cached free block taken and split; else a segment "
            f"made: {format_bytes(CUDA_SMALL_SEGMENT)} for a request of {format_bytes(CUDA_SMALL_SIZE)} or less, "
            f"{format_bytes(CUDA_MID_SEGMENT)} under {format_bytes(CUDA_LARGE_ALLOC)}, else its own, rounded up to "
            f"{format_bytes(CUDA_ROUND_LARGE)}; freed blocks cached, merged with free neighbours)")
    if unfilled is not None:
        text += (f": what the segments holding live blocks held beyond them at the peak is added "
                 f"({format_bytes(unfilled)} at most)")
        values["unfilled_segment_bytes"] = unfilled
    text += (". Wholly free cached segments are not (an out-of-memory retry gives them back), though a run with room "
             "keeps them reserved (max_memory_reserved and nvidia-smi show them: each row's cached_segment_bytes). "
             "One stream is replayed, with torch's default settings (expandable_segments and max_split_size_mb change "
             "the segments): blocks cached by another stream serve only it")
    text += (" (FSDP's all-gather and reduce-scatter streams keep their own; the segments are the most of any "
             "traced depth's, not extrapolated)." if sharded else ".")
    return text, values


class TraceAllocators:
    """The :class:`CachingAllocator` of each MemTracker seen, by tracker; ``latest`` is the last tracker's."""

    def __init__(self) -> None:
        self._by_tracker: dict[int, CachingAllocator] = {}
        self.latest: CachingAllocator | None = None

    def of(self, tracker: object) -> CachingAllocator:
        allocator = self._by_tracker.get(id(tracker))
        if allocator is None:  # a new trace: one tracker per measure_breakdown
            self._by_tracker = {id(tracker): CachingAllocator()}
            allocator = self.latest = self._by_tracker[id(tracker)]
        return allocator

    def unfilled(self) -> int:
        """What the last trace's segments held beyond its live blocks at the peak a run must fit (0 before any)."""
        return self.latest.unfilled_at_peak if self.latest is not None else 0

    def cached(self) -> int:
        """What the last trace kept reserved beyond that in wholly free cached segments (0 before any trace)."""
        return self.latest.cached_at_peak if self.latest is not None else 0


@contextlib.contextmanager
def replayed_cuda_allocators() -> Iterator[TraceAllocators]:
    """Count each storage at the CUDA allocator's block (MemTracker does so only for cuda tensors), and replay each
    trace's blocks through the caching allocator: yields the :class:`TraceAllocators`."""
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
    allocators = TraceAllocators()

    def rounded(self) -> int:
        return cuda_block_bytes(self.size * self.element_size)

    def update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None):
        original_update(self, u_type, winfo, old_mem_consumed=old_mem_consumed, old_reftype=old_reftype)
        trace = allocators.of(self)
        if u_type in (update_type.ADD, update_type.SIZE):  # made, or resized (freed and made again)
            trace.alloc(id(winfo), winfo.size * winfo.element_size)
        elif u_type == update_type.DEL:
            trace.free(id(winfo))

    info._calculate_mem_consumed = rounded
    tracker_class._update_snap = update_snap
    try:
        yield allocators
    finally:
        info._calculate_mem_consumed = original_size
        tracker_class._update_snap = original_update
