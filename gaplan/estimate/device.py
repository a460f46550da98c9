"""The device model: what a device holds and does that a trace on fake CPU tensors does not show.

Fake tensors stay on ``cpu`` (fake ``cuda`` tensors abort a CPU-only build), so the differences of
the device are modelled here and stated as assumptions (:mod:`gaplan.estimate.assumptions`):

* ``cuda``: every tensor counted at the caching allocator's block size and the segments they share
  (:mod:`gaplan.estimate.allocator`), the optimizer as torch runs
  it for CUDA parameters (foreach), CUDA autocast's float32 op list under mixed precision, and the
  memory outside PyTorch's tensors (CUDA context, cuBLAS workspaces) taken off the target;
* ``cpu``: what a CPU trial's resident-memory peak holds besides tensors (heap, MKL's GEMM
  buffers), so the estimate can be checked against ``gaplan probe --device cpu``.

No torch at import: :mod:`gaplan.estimate.targets` reads the reserve from here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from gaplan.core.constants import MiB
from gaplan.estimate.allocator import replayed_cuda_allocators

# --- CUDA: memory outside PyTorch's tensors ---------------------------------------------------------------------
# The CUDA context: gaplan.devices.reserve (CONTEXT_BYTES), read by the probe too.
# cuBLAS and cuBLASLt workspaces, allocated through PyTorch's caching allocator once per stream: PyTorch's default
# CUBLAS_WORKSPACE_CONFIG is ":4096:2:16:8" (8.125 MiB), 32 MiB on Hopper (sm90); the cuBLASLt workspace is 4 MiB,
# 32 MiB on Hopper (pytorch/pytorch#89027, #120925, following the cuBLAS guide's advice for cublasSetWorkspace).
WORKSPACE_BYTES_HOPPER = 32 * MiB + 32 * MiB  # cuBLAS + cuBLASLt, sm90
WORKSPACE_BYTES_OTHER = (2 * 4096 + 8 * 16) * 1024 + 4 * MiB  # cuBLAS ":4096:2:16:8" + cuBLASLt 4 MiB

# --- CUDA autocast ------------------------------------------------------------------------------------------------
# The float32 list of CUDA autocast (PyTorch's "CUDA Ops that can autocast to float32"): on CUDA these run in fp32
# whatever the input; CPU autocast keeps most of them in the input's dtype.
CUDA_AUTOCAST_FP32 = frozenset({
    "__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin", "binary_cross_entropy_with_logits",
    "cosh", "cosine_embedding_loss", "cdist", "cosine_similarity", "cross_entropy", "cumprod", "cumsum",
    "dist", "erfinv", "exp", "expm1", "group_norm", "hinge_embedding_loss", "kl_div", "l1_loss",
    "layer_norm", "log", "log_softmax", "log10", "log1p", "log2", "margin_ranking_loss", "mse_loss",
    "multilabel_margin_loss", "multi_margin_loss", "nll_loss", "norm", "normalize", "pdist",
    "poisson_nll_loss", "pow", "prod", "reciprocal", "rsqrt", "sinh", "smooth_l1_loss", "soft_margin_loss",
    "softmax", "softmin", "softplus", "sum", "renorm", "tan", "triplet_margin_loss",
})

# --- CPU process ----------------------------------------------------------------------------------------------------
# A CPU trial's peak (gaplan.devices.cpu: anonymous resident memory above the baseline) holds two things MemTracker
# does not see:
# * the heap: Python objects, autograd's graph (a node per operator that needs a gradient, its saved-variable records,
#   the TensorImpls it keeps), glibc bookkeeping. It grows with the graph's size, not with the batch: measured as the
#   trial's peak less the traced tensors at micro-batch 2 (tests/estimate/zoo.py, 4 x 256, 2 threads, three runs),
#   it was 1.5 MiB for GPT-2 (205 nodes per micro-step) up to 4.7 MiB for T5 with LoRA (1,269 nodes). A least-squares
#   line through four families (llama, gpt2, t5, opt; full and LoRA; 24 trials) gives 0.55 MiB + 3.3 KiB per node;
#   the zoo's eight other families were held out to check it (docs/estimate.md, "The zoo"). Fitted on the 4 x 128
#   zoo it was 0.29 MiB + 4.4 KiB, but a trial there moves by 0.5 MiB from one process to the next (a quarter of
#   what it measures); a flat 1.5 MiB, used before that, read T5 with LoRA 9% low.
# * MKL's sgemm packing buffers, one per thread, kept by MKL's memory manager after the first step. A lone matmul
#   (M, K) x (K, N) needed 3.0 MiB per thread at K=256, N>=4096, 1.3 MiB at K=64, 0.2 MiB at N=1024 and at most
#   4.7 MiB for the largest shapes: 4 bytes x min(K, 256) x min(N, 4096) of the largest product follows it within
#   about 1 MiB, and put the presets' estimates within 1%. bf16 products (oneDNN, not MKL) showed no such buffer:
#   only float32 products are counted.
CPU_HEAP_BYTES = 564 * 1024
FOREACH_OPTIMIZERS = ("adamw", "sgd")  # torch's own: foreach on CUDA parameters by default
CPU_HEAP_BYTES_PER_NODE = 3368
MKL_PANEL_K = 256
MKL_PANEL_N = 4096


def cpu_heap_bytes(graph_nodes: int) -> int:
    """A CPU process's heap beyond its tensors when a micro-step's autograd graph has ``graph_nodes`` nodes."""
    return CPU_HEAP_BYTES + CPU_HEAP_BYTES_PER_NODE * graph_nodes


def autograd_nodes(loss: Any) -> int:
    """The nodes of the autograd graph behind ``loss`` (0 for a tensor that needs no gradient)."""
    seen: set[int] = set()
    stack = [getattr(loss, "grad_fn", None)]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(parent for parent, _ in node.next_functions)
    return len(seen)


class GraphCount:
    """The largest autograd graph among the losses it was shown (``counted``): the CPU heap grows with it."""

    def __init__(self) -> None:
        self.nodes = 0

    def counted(self, loss: Any) -> Any:
        """``loss``, its graph's nodes recorded."""
        self.nodes = max(self.nodes, autograd_nodes(loss))
        return loss


def mkl_panel_bytes(k: int, n: int) -> int:
    """MKL's sgemm packing buffer per thread for a float32 product (M, K) x (K, N)."""
    return 4 * min(k, MKL_PANEL_K) * min(n, MKL_PANEL_N)


def product_operands(func: Any, args: tuple) -> tuple[Any, Any] | None:
    """The two matrices of a matrix-product operator's call (``mm``, ``bmm``, ``addmm``, ``baddbmm``), else None."""
    import torch

    aten = torch.ops.aten
    if func in (aten.mm.default, aten.bmm.default):
        return args[0], args[1]
    if func in (aten.addmm.default, aten.baddbmm.default):
        return args[1], args[2]
    return None


def gemm_panel_bytes(func: Any, args: tuple) -> int:
    """MKL's packing buffer while the operator ``func(*args)`` runs: a float32 matrix product's, else 0."""
    import torch

    operands = product_operands(func, args)
    if operands is None:
        return 0
    a, b = operands
    # MKL sgemm; bf16/fp16 products go to oneDNN, measured without such a buffer
    return mkl_panel_bytes(a.shape[-1], b.shape[-1]) if a.dtype == torch.float32 else 0


@contextlib.contextmanager
def traced_8bit_cpu_step() -> Iterator[None]:
    """Run bitsandbytes' 8-bit optimizer step through its CPU kernel's Python body, so the trace sees what it holds.

    Under fake tensors the custom operator runs its fake kernel, which allocates nothing; the CPU kernel dequantizes
    both moments to float32, copies the gradient and makes the denominator: about five float32 copies of the largest
    parameter at once, which set a small micro-batch's peak (tiny-gpt2 at micro-batch 2 read 13.6% low without it).
    On CUDA the step is one fused kernel, and the fake kernel is right. Without that kernel (another bitsandbytes)
    nothing is changed: the step's temporaries are then not counted.
    """
    import importlib

    try:
        functional = importlib.import_module("bitsandbytes.functional")
        kernel = importlib.import_module("bitsandbytes.backends.cpu.ops")._optimizer_update_8bit_blockwise_cpu
        original = functional.optimizer_update_8bit_blockwise
    except (ImportError, AttributeError):
        yield
        return
    functional.optimizer_update_8bit_blockwise = kernel
    try:
        yield
    finally:
        functional.optimizer_update_8bit_blockwise = original


class CudaAutocastFp32:
    """Under autocast, run CUDA autocast's float32 ops in float32 (CPU autocast keeps most in bf16/fp16)."""

    def __init__(self) -> None:
        import torch
        from torch.overrides import TorchFunctionMode

        low = (torch.bfloat16, torch.float16)

        def upcast(value):
            if isinstance(value, torch.Tensor) and value.dtype in low:
                return value.float()
            if isinstance(value, (list, tuple)):
                return type(value)(upcast(v) for v in value)
            return value

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if getattr(func, "__name__", None) in CUDA_AUTOCAST_FP32 and torch.is_autocast_enabled("cpu"):
                    args, kwargs = upcast(args), {k: upcast(v) for k, v in kwargs.items()}
                return func(*args, **kwargs)

        self._mode = _Mode()

    def __enter__(self) -> CudaAutocastFp32:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)


class DeviceModel:
    """One device kind's differences from the CPU trace: its optimizer, its patches and modes, its overhead."""

    def __init__(self, kind: str, threads: int | None = None) -> None:
        import torch

        self.kind = kind
        self.threads = threads or torch.get_num_threads()  # CPU threads of the process modelled (cpu only)

    def make_optimizer(self, model, spec):
        """The optimizer as this device runs it: on CUDA, what torch.optim picks for CUDA parameters (foreach)."""
        import torch

        from gaplan.workload.build import make_optimizer

        if self.kind != "cuda" or spec.optimizer not in FOREACH_OPTIMIZERS:
            # bitsandbytes' 8-bit step is one fused kernel on CUDA: its fake kernel (no temporaries) is what the trace
            # runs; Adafactor and Lion run as they do on the CPU.
            return make_optimizer(model, spec.optimizer, spec.learning_rate)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer_class = torch.optim.AdamW if spec.optimizer == "adamw" else torch.optim.SGD
        return optimizer_class(params, lr=spec.learning_rate, foreach=True)

    def optimizer_step(self, optimizer: str) -> contextlib.AbstractContextManager:
        """How the optimizer's step is traced: bitsandbytes' 8-bit step through its CPU kernel on ``cpu``."""
        if self.kind == "cpu" and optimizer in ("adamw-8bit", "paged-adamw-8bit"):
            return traced_8bit_cpu_step()
        return contextlib.nullcontext()

    def attention(self, calls: set) -> contextlib.AbstractContextManager:
        """On ``cuda``, each SDPA call traced by the backend CUDA would take (:mod:`gaplan.estimate.attention`), the
        calls recorded in ``calls``; on ``cpu``, as the CPU runs it."""
        if self.kind != "cuda":
            return contextlib.nullcontext()
        from gaplan.estimate.attention import CudaAttention

        return CudaAttention(calls)

    def dropout(self) -> contextlib.AbstractContextManager:
        """On ``cuda``, dropout traced through ATen's fused kernel, which keeps a bool mask for backward
        (:mod:`gaplan.estimate.dropout`); on ``cpu``, as the CPU runs it (it keeps a noise tensor of the input's dtype)."""
        if self.kind != "cuda":
            return contextlib.nullcontext()
        from gaplan.estimate.dropout import CudaDropout

        return CudaDropout()

    def allocator(self) -> contextlib.AbstractContextManager:
        """How MemTracker counts a storage: on ``cuda`` at the CUDA allocator's block, the caching allocator replayed
        (it yields the :class:`gaplan.estimate.allocator.TraceAllocators`); on ``cpu`` as is (it yields None)."""
        return replayed_cuda_allocators() if self.kind == "cuda" else contextlib.nullcontext()

    def autocast(self, dtype: str) -> contextlib.AbstractContextManager:
        """CUDA autocast's float32 op list over CPU autocast, for mixed precision on ``cuda``."""
        return CudaAutocastFp32() if self.kind == "cuda" and dtype != "fp32" else contextlib.nullcontext()

    def overhead(self, graph_nodes: int) -> int:
        """Bytes a CPU process holds besides its tensors, with micro-steps of ``graph_nodes`` autograd nodes (none on
        CUDA: the target's reserve covers it)."""
        return cpu_heap_bytes(graph_nodes) if self.kind == "cpu" else 0

    def workspace(self):
        """What an operator holds only while it runs, for the trace (``measure_breakdown(workspace=)``), or None.

        On CPU, one GEMM's packing buffer: with MKL's fast memory manager off (gaplan.devices.cpu) MKL mallocs its
        buffers per call and frees them on return, so the buffer adds to the peak only when the peak is inside a
        matrix product. Added to every step's peak instead, it over-counted tiny-gpt2 (seq 128) by 4 MiB, 9% of a
        micro-batch of 1: its peak is in the loss and the backward, after the LM head's product has returned.
        """
        return gemm_panel_bytes if self.kind == "cpu" else None

    def extra(self, gemm_panel_bytes: int, graph_nodes: int) -> dict[str, Any]:
        """The model's own figures, for :attr:`EstimateResult.extra`."""
        if self.kind != "cpu":
            return {}
        return {"threads": self.threads, "cpu_heap_bytes": cpu_heap_bytes(graph_nodes), "graph_nodes": graph_nodes,
                "mkl_panel_bytes": gemm_panel_bytes}
