"""Device resolution, the CPU backend and the one OOM classifier (the CUDA checks are in tests/gpu)."""

import pytest
import torch

from gaplan.core.errors import GaplanError
from gaplan.devices.backend import is_out_of_memory, resolve_device


def test_oom_classifier():
    assert is_out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory"))
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("out of memory"))


def test_resolve_device():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda:0" if torch.cuda.is_available() else "cpu")
    with pytest.raises(GaplanError, match="--device must be"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(GaplanError, match="no CUDA device"):
            resolve_device("cuda:0")


def test_the_cpu_process_peak_counts_the_whole_process_and_grows_with_a_new_tensor():
    """In a fresh process (a long-lived one may hold freed pages that a new tensor reuses without growing)."""
    import subprocess
    import sys
    import textwrap

    body = textwrap.dedent("""
        import torch
        from gaplan.devices.cpu import CpuBackend, read_status

        backend = CpuBackend()
        backend.activate(None, enforce=False)
        backend.reset_peak()
        before = backend.process_peak_bytes()
        assert before >= read_status()["RssAnon"] - 2**20  # everything resident, not a difference that can read 0
        tensor = torch.ones(16 * 2**20)  # 64 MiB: over glibc's largest mmap threshold, so new resident pages
        print(backend.process_peak_bytes() - before)
        """)
    done = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.strip()) > 60 * 2**20
