"""Seal the heap a forked trial inherits: its free space is taken before the budget, so the trial counts every
byte it allocates, as a new process does.

A trial forked from a process that has trained (a notebook, a test run, a second ``fit``) inherits that process's
freed heap. Small allocations then fill it without the data segment growing, so ``RLIMIT_DATA`` and the resident
peak miss them: measured, a LightningModule's edge read 65 where a fresh ``fit`` held 51. Taking the free chunks
(malloc, never touched: no resident memory) before the baseline leaves the child with the heap a new process has.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache

# Largest first, under the pinned 64 KiB mmap threshold (served from free chunks, not new mappings), then the
# fragments the larger ones cannot take.
CHUNKS = (60 * 1024, 4 * 1024, 256, 64, 24)
BATCH = 64  # chunks taken between two looks at the free bytes (a look walks the arenas' bins)
LEFT = 256 * 1024  # free heap left: a new process starts with about this much too
MAX_BATCHES = 1 << 14  # per size: a bound on the loop (60 GiB of 60 KiB chunks), far above any heap seen


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


@lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if libc is None or not hasattr(libc, "mallinfo2"):  # glibc 2.33+; elsewhere nothing is sealed
        return None
    libc.mallinfo2.restype = _MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    return libc


def free_heap_bytes() -> int | None:
    """The free bytes in glibc's heap arenas (mallinfo2's ``fordblks``); None where glibc cannot say."""
    libc = _libc()
    return None if libc is None else int(libc.mallinfo2().fordblks)


_sealed: list[int] = []  # the chunks taken: held for the life of the (trial) process


def seal_free_heap() -> int:
    """Take the heap's free chunks, all but ``LEFT`` bytes; returns the bytes taken (0 where glibc cannot say).

    Only for a process about to take a budget and end after it (a trial): the chunks are never given back.
    """
    libc = _libc()
    if libc is None:
        return 0
    before = free = int(libc.mallinfo2().fordblks)
    for chunk in CHUNKS:
        for _ in range(MAX_BATCHES):
            if free <= LEFT:
                return before - free
            pointers = [libc.malloc(chunk) for _ in range(BATCH)]
            _sealed.extend(p for p in pointers if p)
            now = int(libc.mallinfo2().fordblks)
            if now > free - BATCH * chunk // 2:  # mostly new heap, not free chunks: none of this size is left
                break
            free = now
    return max(before - free, 0)
