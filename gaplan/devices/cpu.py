"""CPU backend: a real memory budget and a real peak, so the probe's answer is the true edge.

With glibc's mmap threshold pinned (every allocation over 64 KiB is its own mapping,
returned on free), ``setrlimit(RLIMIT_DATA, base + budget)`` makes an allocation
past the budget fail with ``DefaultCPUAllocator: can't allocate memory``, and the
process recovers cleanly. Without pinning, glibc's threshold drifts and the edge
moves by about 10% between runs. Peak memory is the kernel's high-water mark of
resident memory (VmHWM), reset by writing ``5`` to ``/proc/self/clear_refs``,
less the file-backed pages: a trial in a fresh process maps in library code as it
first runs each kernel (tens of MiB of libtorch), which is not training memory and
not counted by the budget either.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import resource

from gaplan.core.constants import DEFAULT_CPU_BUDGET

MMAP_THRESHOLD = 65536
# MKL's fast memory manager keeps GEMM workspace in a pool whose buffers are mapped with an alignment that
# depends on where the address space puts them: with it on, the same trial's VmData differed by a sample from
# one process to the next (tiny-gpt2, seq 16, 256 MiB: 45 fitted in 2 of 5 fresh processes, with address
# randomization off in 5 of 5), and the pool held ~25 MiB of budget the resident peak did not show (B* 21
# with it, 25 without, at seq 32). Off, MKL uses malloc; one sample of address-layout noise remains, cause not
# found (README, "The CPU budget"). MKL reads this when it loads, so it must be in the environment before torch
# is imported (see gaplan/__init__.py).
MKL_ALLOCATOR_ENV = {"MKL_DISABLE_FAST_MM": "1"}
MMAP_THRESHOLD_ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), **MKL_ALLOCATOR_ENV}
_M_MMAP_THRESHOLD = -3
# Both pins cost speed where nothing is bound: every tensor over 64 KiB becomes its own mapping, with fresh page
# faults on each use (issue 20: a plain HF loop 1.24 s a step, 2.21 s with the threshold pinned; a bench spent as
# much time in the kernel as in user code). So a process that times or trains without a budget runs with the
# allocators as a user's own loop has them: set to "1", gaplan's import does not switch MKL's pool off either.
NATIVE_ALLOCATOR_ENV = "GAPLAN_NATIVE_ALLOCATOR"
_set_by_gaplan: set[str] = set()  # the pins gaplan's import put in this environment (not the user)
_bound: int | None = None  # the CPU budget this process set itself (CpuBackend.activate with enforce), in bytes


def budget_bound() -> bool:
    """Whether this process runs under a CPU budget it set (RLIMIT_DATA), as a probe trial or a budgeted run."""
    return _bound is not None


def bound_budget() -> int | None:
    """The CPU budget this process set itself (``gaplan.cpu_budget``), in bytes; None without one. A probe of your
    loop started from it takes the same budget by default: the budget you bound your loop to is its answer's."""
    return _bound


def default_allocator_environment(environ: dict | None = None) -> None:
    """At gaplan's import, before torch loads MKL: MKL's pool off, as budgeted processes need (unless a
    native-allocator process asked not to, or the user set the variable)."""
    import os

    environ = os.environ if environ is None else environ
    if environ.get(NATIVE_ALLOCATOR_ENV) == "1":
        return
    for name, value in MKL_ALLOCATOR_ENV.items():
        if name not in environ:
            environ[name] = value
            _set_by_gaplan.add(name)


def budget_environment(environ: dict) -> dict:
    """A child's environment for running under a budget: both pins set before its interpreter allocates."""
    env = {k: v for k, v in environ.items() if k != NATIVE_ALLOCATOR_ENV}
    return dict(env, **MMAP_THRESHOLD_ENV)


def native_environment(environ: dict, set_by_gaplan: set[str] | None = None) -> dict:
    """A child's environment for timing or training without a budget: the pins gaplan set (``set_by_gaplan``,
    default this process's import) are gone, a user's own settings stay, and the child's import of gaplan does not
    set them again."""
    ours = _set_by_gaplan if set_by_gaplan is None else set_by_gaplan
    env = {k: v for k, v in environ.items() if not (k in ours and v == MKL_ALLOCATOR_ENV.get(k))}
    return dict(env, **{NATIVE_ALLOCATOR_ENV: "1"})


def use_native_allocator() -> bool:
    """In this process, before torch is imported: take back the pins gaplan's import set (plain training, which
    binds nothing). False when torch is loaded already (MKL has read its settings; nothing changes)."""
    import os
    import sys

    if "torch" in sys.modules:
        return False
    for name in list(_set_by_gaplan):
        os.environ.pop(name, None)
        _set_by_gaplan.discard(name)
    os.environ[NATIVE_ALLOCATOR_ENV] = "1"
    return True


def read_status() -> dict[str, int]:
    """VmData, VmRSS, VmHWM and RssAnon/RssFile/RssShmem of this process, in bytes."""
    values = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmData", "VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                values[key] = int(rest.split()[0]) * 1024
    return values


def available_bytes() -> int | None:
    """The memory this machine can still give without swapping (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def pin_mmap_threshold() -> bool:
    """Pin glibc's mmap threshold (also set through the environment when the worker starts)."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        return bool(ctypes.CDLL(name).mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False


THREADS_PER_CORE = 4  # --threads above this many a core is refused: each is an OS thread with its own stack and arena


def check_threads(threads: int | None) -> None:
    """``--threads`` (torch's intra-op threads): at most :data:`THREADS_PER_CORE` a core of this machine (100,000
    threads exhaust memory before training starts; a few more than the cores only contend)."""
    most = THREADS_PER_CORE * (os.cpu_count() or 1)
    if threads is not None and threads > most:
        from gaplan.core.options import OptionError

        raise OptionError(f"threads {threads} is more than {THREADS_PER_CORE} per core on this machine "
                          f"({os.cpu_count()} cores): give at most {most}", "threads")


def start_intra_op_threads() -> None:
    """Run one small parallel op, so torch's intra-op threads exist before a budget's baseline is taken.

    Their stacks (8 MiB each) and malloc arenas are process overhead, not training memory. A process that starts
    them under its budget pays for them there; a trial forked from a worker does not (its new thread reuses the
    stack glibc cached from a thread of the parent): one sample of difference at a small budget, the "three loops,
    three edges". Started before the baseline, every process counts the same thing.
    """
    import torch

    if torch.get_num_threads() > 1:
        torch.ones(1 << 20).add_(1)  # above the parallel grain: the threads start (and OpenMP's pool with them)


def import_lazy_torch_code() -> None:
    """Import what torch imports lazily on a loop's first optimizer, before a budget's baseline: it is code, not
    training memory. ``torch.optim.Optimizer.__init__`` imports ``torch._dynamo``: 68 MiB of anonymous memory
    (torch 2.13), which a plain-PyTorch loop's trial counted as its model's (transformers imports it with itself)."""
    import torch._dynamo  # noqa: F401


def anonymous_peak(status: dict[str, int]) -> int:
    """The high-water mark of anonymous memory (tensors, heap): VmHWM less the file-backed pages.

    File pages mapped so far stay mapped, so those mapped now are those mapped at the peak (or more).
    """
    return status["VmHWM"] - status["RssFile"] - status["RssShmem"]


class CpuBackend:
    """Budget by RLIMIT_DATA over the memory held when the budget was set; peak by VmHWM."""

    name = "cpu"

    def __init__(self) -> None:
        self.limit_bytes = 0
        self._base_data = 0
        self._base_anon = 0

    def activate(self, limit_bytes: int | None, enforce: bool = True) -> None:
        if enforce:  # the budget's sharp edge needs it; anything else runs with glibc's own threshold
            pin_mmap_threshold()
        start_intra_op_threads()
        import_lazy_torch_code()
        gc.collect()
        status = read_status()
        self._base_data, self._base_anon = status["VmData"], status["RssAnon"]
        self.limit_bytes = limit_bytes or DEFAULT_CPU_BUDGET
        if not enforce:
            return
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        soft = self._base_data + self.limit_bytes
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
        global _bound
        _bound = self.limit_bytes


    def reset_peak(self) -> None:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")

    def peak_bytes(self) -> int:
        return anonymous_peak(read_status()) - self._base_anon

    def process_peak_bytes(self) -> int:
        # No baseline: in a long-lived process (a notebook, a test run) freed memory that is still resident
        # is reused without the resident size growing, so a peak above a baseline can read 0.
        return anonymous_peak(read_status())

    def current_bytes(self) -> int:
        return read_status()["RssAnon"] - self._base_anon

    def release(self) -> None:
        gc.collect()

    def synchronize(self) -> None:
        pass


class CpuBudgetWarning(UserWarning):
    """The process can hold a budget, but not exactly as a probe trial does (MKL's pooled workspace is on)."""


def cpu_budget(limit: int | str | None = None) -> CpuBackend:
    """Bind this process to a CPU memory budget exactly as gaplan's probe trials are bound; returns its meter.

    Call it after the imports and before the model is built: the budget counts what is allocated from then on
    (weights, gradients, optimizer states, activations), over what the process holds at the call, as a trial's
    does after its worker's imports. ``limit``: bytes or text (``"1GiB"``); default 1 GiB. An allocation past it
    fails with torch's ``DefaultCPUAllocator: can't allocate memory``; ``peak_bytes()`` is the peak since the
    call. Import gaplan before torch, so that MKL's pooled GEMM workspace is off as in the trials (else a
    :class:`CpuBudgetWarning`).
    """
    import os
    import sys
    import warnings

    from gaplan.core.units import parse_bytes

    if limit is not None:
        limit = parse_bytes(limit)
    if "torch" in sys.modules and any(os.environ.get(k) != v for k, v in MKL_ALLOCATOR_ENV.items()):
        warnings.warn("torch was imported before gaplan: MKL's pooled GEMM workspace is on, so this budget's edge "
                      "may differ from a probe's by a sample (import gaplan first, or set MKL_DISABLE_FAST_MM=1)",
                      CpuBudgetWarning, stacklevel=2)
    backend = CpuBackend()
    backend.activate(limit)
    return backend
