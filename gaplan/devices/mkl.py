"""MKL's cached GEMM workspace: released between micro-steps, so a micro-step's memory depends on its shape alone.

PyTorch's CPU builds do their matrix products with MKL, whose memory manager keeps the workspace of each
GEMM (packing buffers) in a pool for the next call instead of freeing it. The pool is sized by the GEMMs the
process has run so far, and its buffers are mostly reserved, not touched: they count in VmData, which the CPU
budget (RLIMIT_DATA) binds, but hardly in the resident peak a trial reports. Measured on tiny-gpt2 at seq 64
(issue 13): a probe trial repeating 6 x 64 tokens held 21.7 MiB of such buffers; a training run feeding
micro-batches of changing shapes (6 x 57, 26 x 13, ...) held 35 MiB by its second step, and so had 13 MiB
(one sample of 64 tokens) less room than the probe had measured at T*; it ran out of memory at step 5.

Under a CPU budget, releasing the pool before every micro-step and after the last one
(:func:`gaplan.training.step.accumulate_gradients`, which the probe's trials and the training loop share) makes
both start each micro-step with none: what a micro-batch needs then depends on its own shape, not on the shapes
that came before it, which is what a probe of one shape per trial can answer for. Without a budget the pool is
kept (releasing it gains nothing and costs its reuse). Without MKL (another BLAS, another platform) this does
nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os


@functools.cache
def _mkl_service() -> ctypes.CDLL | None:
    """The loaded library that exports MKL's service functions (libtorch_cpu on x86 builds), or None."""
    import torch

    candidates = [None, os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")]
    for name in candidates:
        try:
            library = ctypes.CDLL(name)
        except (OSError, TypeError):  # TypeError: no CDLL(None) where there is no dlopen (Windows)
            continue
        if hasattr(library, "mkl_serv_free_buffers") and hasattr(library, "mkl_serv_mem_stat"):
            library.mkl_serv_mem_stat.restype = ctypes.c_int64
            return library
    return None


def release_gemm_workspace() -> None:
    """Free MKL's cached GEMM buffers, where a CPU budget binds this process (a no-op without MKL).

    Without a budget nothing is gained and the pool's reuse is lost: every GEMM would map its buffers afresh.
    """
    from gaplan.devices.cpu import budget_bound

    if not budget_bound():
        return
    library = _mkl_service()
    if library is not None:
        library.mkl_serv_free_buffers()


def gemm_workspace_bytes() -> int | None:
    """The bytes MKL's memory manager holds now (its pool included), or None without MKL."""
    library = _mkl_service()
    if library is None:
        return None
    buffers = ctypes.c_int(0)
    return int(library.mkl_serv_mem_stat(ctypes.byref(buffers)))
