"""A trial forked from a process with freed heap counts what it allocates once the heap is sealed: without the seal,
small allocations fill the inherited free chunks and the data segment (RLIMIT_DATA's measure) does not grow."""

import subprocess
import sys
import textwrap

import pytest

from gaplan.devices.heap import free_heap_bytes

FORKED = textwrap.dedent("""
    import ctypes, ctypes.util, json, os
    from gaplan.devices.cpu import read_status
    from gaplan.devices.heap import free_heap_bytes, seal_free_heap
    from gaplan.core.fork import run_in_child

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(4096) for _ in range(20_000)]  # 80 MB of small blocks, then freed: a trained process
    libc.free(blocks.pop(-1))  # the last one first, so the top is not trimmed away
    for block in blocks[::2]:
        libc.free(block)

    def trial(seal):
        taken = seal_free_heap() if seal else 0
        before = read_status()["VmData"]
        held = [libc.malloc(4096) for _ in range(5_000)]  # 20 MB of a trial's small allocations
        return {"grew": read_status()["VmData"] - before, "taken": taken, "held": len(held)}

    print(json.dumps({"free": free_heap_bytes(), "plain": run_in_child(lambda: trial(False)),
                      "sealed": run_in_child(lambda: trial(True))}))
""")


@pytest.mark.skipif(free_heap_bytes() is None, reason="needs glibc's mallinfo2 (2.33+)")
def test_a_sealed_child_counts_the_small_allocations_its_inherited_free_heap_would_have_hidden():
    import json

    done = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["free"] > 30e6
    assert result["plain"]["grew"] < 2e6, "the inherited free chunks hold the child's 20 MB"
    assert result["sealed"]["taken"] > 30e6
    assert result["sealed"]["grew"] > 18e6, "sealed, the child's 20 MB grow its data segment"
