"""The largest micro-batch for a GPU you don't have, traced on fake tensors: nothing is allocated.

Run ``gaplan estimate --target h100-80gb --model DIR --seq-len 2048 --dtype bf16``, or from Python
``estimate(WorkloadSpec(model=DIR, seq_len=2048, dtype="bf16"), target="h100-80gb")``.

How it works:

1. The workload is built on the meta device (``build_workload(spec, "meta")``: shapes only), then
   its parameters and buffers become fake CPU tensors (``FakeTensorMode``: shape, dtype and strides,
   no storage). A Llama-2-7B shape costs a few hundred MiB of host memory, not 27 GB. Fake tensors
   stay on ``cpu``: fake ``cuda`` tensors abort a CPU-only build, so CUDA's differences are modelled
   (below) instead of traced.
2. One steady-state step is counted by :func:`gaplan.breakdown.measure_breakdown` (``MemTracker``):
   the optimizer states exist (:func:`gaplan.trial.materialize_optimizer_state`) and the gradients
   are already allocated, as at the second micro-step of an accumulated step, so one traced
   micro-step shows what every later one costs. Its peak is traced apart from the optimizer step's
   (which does not grow with the micro-batch), at two sizes; the line through them predicts the
   largest micro-batch ``B*`` that fits; then the whole step is traced at ``B*`` and ``B* + 1`` (and
   the prediction corrected until the edge is exact).
3. Device model. ``cuda``: every tensor is counted at the caching allocator's block size, the
   optimizer runs as CUDA runs it (foreach AdamW), mixed precision follows CUDA autocast's float32
   op list, and the CUDA context and cuBLAS workspaces come off the target's memory
   (:mod:`gaplan.targets`). ``cpu``: what a CPU trial's resident-memory peak holds besides tensors
   (heap, MKL's GEMM buffers), so the estimate can be checked against ``gaplan probe --device cpu``.

Values are never known under fake tensors: a ``.item()`` (the loss logged, the target count that
divides the loss) reads as 1 (True for a flag), which changes no shape. A model whose shapes depend
on tensor values (``nonzero``, boolean indexing) cannot be traced; that is reported as a user error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gaplan.errors import DoesNotFit, GaplanError
from gaplan.plan import make_plan
from gaplan.search import least_squares_line
from gaplan.targets import WORKSPACE_BYTES_HOPPER, Target, lookup_target
from gaplan.units import format_bytes
from gaplan.workload import Workload, WorkloadSpec

MiB = 2**20
DEVICE_KINDS = ("cuda", "cpu")
DEFAULT_TARGET = "h100-80gb"  # when neither a target nor a memory limit is given (device_kind="cuda")
DEFAULT_CPU_BUDGET = 2**30  # as gaplan.devices.DEFAULT_CPU_BUDGET (device_kind="cpu")
DEFAULT_SIZES = (1, 2)
DEFAULT_MAX_MICRO_BATCH = 4096  # as the probe's cap
MAX_CHECK_TRACES = 12  # full-step traces spent finding the exact edge after the prediction

# CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): blocks are multiples of kMinBlockSize
# (512 B); an allocation of kMinLargeAlloc (10 MiB) or more gets its own segment rounded to
# kRoundLarge (2 MiB). Smaller ones share 2 MiB / 20 MiB segments, which the 512 B rounding covers.
CUDA_BLOCK = 512
CUDA_LARGE_ALLOC = 10 * MiB
CUDA_ROUND_LARGE = 2 * MiB

# A CPU trial's peak (gaplan.devices.cpu: anonymous resident memory above the baseline) holds two
# things MemTracker does not see. Measured on the presets at seq 32, micro-batch 2-8, 1 and 2 threads:
# * the heap: Python objects of the model and optimizer, autograd nodes, glibc bookkeeping: 1.1-2.2 MiB
#   with MKL's buffer cache off (MKL_DISABLE_FAST_MM=1); 1.5 MiB is taken;
# * MKL's sgemm packing buffers, one per thread, kept by MKL's memory manager after the first step.
#   A lone matmul (M, K) x (K, N) needed 3.0 MiB per thread at K=256, N>=4096, 1.3 MiB at K=64,
#   0.2 MiB at N=1024 and at most 4.7 MiB for the largest shapes: 4 bytes x min(K, 256) x min(N, 4096)
#   of the largest product follows it within about 1 MiB, and put the presets' estimates within 1%.
#   bf16 products (oneDNN, not MKL) showed no such buffer: only float32 products are counted.
CPU_HEAP_BYTES = 3 * MiB // 2
MKL_PANEL_K = 256
MKL_PANEL_N = 4096

# The float32 list of CUDA autocast (PyTorch's "CUDA Ops that can autocast to float32"): on CUDA these
# run in fp32 whatever the input; CPU autocast keeps most of them in the input's dtype.
_CUDA_AUTOCAST_FP32 = frozenset({
    "__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin", "binary_cross_entropy_with_logits",
    "cosh", "cosine_embedding_loss", "cdist", "cosine_similarity", "cross_entropy", "cumprod", "cumsum",
    "dist", "erfinv", "exp", "expm1", "group_norm", "hinge_embedding_loss", "kl_div", "l1_loss",
    "layer_norm", "log", "log_softmax", "log10", "log1p", "log2", "margin_ranking_loss", "mse_loss",
    "multilabel_margin_loss", "multi_margin_loss", "nll_loss", "norm", "normalize", "pdist",
    "poisson_nll_loss", "pow", "prod", "reciprocal", "rsqrt", "sinh", "smooth_l1_loss", "soft_margin_loss",
    "softmax", "softmin", "softplus", "sum", "renorm", "tan", "triplet_margin_loss",
})


@dataclass(frozen=True)
class TracedRow:
    """One traced peak, by category (as :class:`gaplan.breakdown.MemoryBreakdown`).

    ``phase`` is ``micro-steps`` (forward and backward with gradients and optimizer states held),
    ``optimizer-step`` (the optimizer step alone) or ``step`` (both: the whole steady-state step).
    ``peak_bytes`` is ``tracked_total`` plus what the device holds besides tensors; it is what is
    compared with the usable memory. A size whose micro-steps were traced already is checked as a
    ``composed`` step: the larger of its micro-steps row and the optimizer-step row (the two phases
    never overlap, so that is exactly what tracing the whole step gives).
    """

    micro_batch: int
    phase: str
    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    other: int
    tracked_total: int
    peak_bytes: int
    composed: bool = False  # a ``step`` row made of this size's micro-steps row and the optimizer-step row

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class EstimateResult:
    """What an estimate found: the largest micro-batch, the plan, and how it got there."""

    workload: dict
    device_kind: str
    target: str | None
    memory_limit_bytes: int  # the device's memory (a target's total) or the given limit
    usable_bytes: int  # what tensors may take: the limit less the reserve
    rows: list[TracedRow]
    line: tuple[float, float]  # (intercept, slope) of the micro-steps' peak bytes over micro-batch
    max_micro_batch: int
    capped: bool  # True when max_micro_batch itself fits: the real edge may be larger
    peak_bytes: int  # traced peak of the whole step at max_micro_batch
    plan: dict  # Plan.to_dict()
    assumptions: list[str]
    trace_seconds: float
    param_count: int
    static_bytes: int  # weights + gradients + optimizer states
    task: str
    seq_len: int | None
    trace_count: int = 0
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["rows"] = [row.to_dict() for row in self.rows]
        data["line"] = {"intercept": self.line[0], "slope": self.line[1]}
        data["trace_seconds"] = round(self.trace_seconds, 3)
        return data


def estimate(
    spec: WorkloadSpec,
    memory_limit: int | None = None,
    target: str | None = None,
    effective_batch: int = 256,
    sizes: Sequence[int] | None = None,
    device_kind: str = "cuda",
    max_micro_batch: int = DEFAULT_MAX_MICRO_BATCH,
    threads: int | None = None,
) -> EstimateResult:
    """Estimate the largest micro-batch of ``spec`` that fits, and plan ``effective_batch``, without allocating.

    Args:
        spec: the workload; its dtype ``bf16``/``fp16`` means autocast over fp32 weights, as in training.
        memory_limit: bytes for PyTorch's allocator (as ``gaplan probe --memory-limit``); with a
            target, the smaller of the two.
        target: a GPU of :func:`gaplan.targets.list_targets` (default ``h100-80gb`` when no limit is given).
        effective_batch: samples per optimizer step, split by the plan.
        sizes: the micro-batch sizes whose micro-steps are traced to draw the memory line (default 1, 2).
        device_kind: ``cuda`` (model CUDA's allocator, optimizer, autocast and reserve) or ``cpu`` (model
            a CPU process, to compare with ``gaplan probe --device cpu``; no target).
        max_micro_batch: the largest micro-batch considered.
        threads: CPU threads of the process modelled (``device_kind="cpu"``; default: this process's).

    Raises:
        GaplanError: bad input (unknown target, no config.json, sequence longer than the positions...).
        DoesNotFit: even micro-batch 1 does not fit.
    """
    spec = spec.validate()
    if device_kind not in DEVICE_KINDS:
        raise GaplanError(f"device kind must be one of {', '.join(DEVICE_KINDS)} (got {device_kind!r})")
    if memory_limit is not None and (not isinstance(memory_limit, int) or memory_limit <= 0):
        raise GaplanError(f"--memory-limit must be larger than zero (got {memory_limit})")
    if not isinstance(max_micro_batch, int) or max_micro_batch < 1:
        raise GaplanError(f"the largest micro-batch considered must be a positive integer (got {max_micro_batch})")
    sizes = _check_sizes(sizes)
    make_plan(effective_batch, 1)  # reject a bad effective batch before any work
    the_target, limit, usable, budget_note = _budget(device_kind, memory_limit, target)

    started = time.perf_counter()
    with _Tracer(spec, device_kind, threads) as tracer:
        edge, capped, line = _find_edge(tracer, usable, sizes, max_micro_batch, spec)
        rows = tracer.final_rows()
        peak = next(r.peak_bytes for r in reversed(rows) if r.phase == "step" and r.micro_batch == edge)
        assumptions = [budget_note, *tracer.assumptions()]
        workload = tracer.workload
        result = EstimateResult(
            workload=spec.to_dict(), device_kind=device_kind, target=the_target.name if the_target else None,
            memory_limit_bytes=int(limit), usable_bytes=int(usable), rows=rows,
            line=(float(line[0]), float(line[1])), max_micro_batch=edge, capped=capped, peak_bytes=peak,
            plan=make_plan(effective_batch, edge).to_dict(), assumptions=assumptions,
            trace_seconds=time.perf_counter() - started, param_count=workload.param_count,
            static_bytes=workload.static_bytes(), task=workload.task, seq_len=workload.seq_len,
            trace_count=sum(not r.composed for r in rows), extra=tracer.extra())
    return result


def trace_steps(spec: WorkloadSpec, micro_batches: Sequence[int], device_kind: str = "cpu",
                threads: int | None = None) -> list[TracedRow]:
    """The estimated peak of one steady-state step at each micro-batch (no search, no budget).

    Each row is the larger of the micro-steps' and the optimizer step's traced peaks, plus the
    device's overhead: with ``device_kind="cpu"``, what ``gaplan probe --device cpu`` measures as a
    trial's ``peak_bytes`` at that micro-batch.
    """
    spec = spec.validate()
    if device_kind not in DEVICE_KINDS:
        raise GaplanError(f"device kind must be one of {', '.join(DEVICE_KINDS)} (got {device_kind!r})")
    if not micro_batches or not all(isinstance(b, int) and b >= 1 for b in micro_batches):
        raise GaplanError(f"micro-batches must be positive integers (got {list(micro_batches)})")
    with _Tracer(spec, device_kind, threads) as tracer:
        optimizer_step = tracer.optimizer_step()
        for b in micro_batches:
            tracer.composed_step(tracer.micro_steps(b), optimizer_step)
        return [r for r in tracer.final_rows() if r.phase == "step"]


# ----------------------------------------------------------------------------------------------
# Budget: what the traced peak is compared with


def _check_sizes(sizes: Sequence[int] | None) -> tuple[int, ...]:
    if sizes is None:
        return DEFAULT_SIZES
    values = sorted({int(s) for s in sizes}) if all(isinstance(s, int) and s >= 1 for s in sizes) else []
    if len(values) < 2:
        raise GaplanError(f"the traced sizes must be at least two different positive integers (got {list(sizes)})")
    return tuple(values)


def _budget(device_kind: str, memory_limit: int | None, target: str | None) -> tuple[Target | None, int, int, str]:
    """(target, memory limit, usable bytes, the sentence that explains them)."""
    if device_kind == "cpu":
        if target is not None:
            raise GaplanError(f"--target {target} is a GPU; it does not apply to a CPU estimate")
        limit = memory_limit or DEFAULT_CPU_BUDGET
        return None, limit, limit, (f"CPU budget {format_bytes(limit)} above the process baseline, as gaplan probe's "
                                    "budget on CPU; nothing reserved.")
    if target is None and memory_limit is None:
        target = DEFAULT_TARGET
    the_target = lookup_target(target) if target is not None else None
    if the_target is not None:
        usable = the_target.usable_bytes
        note = (f"Target {the_target.name} ({the_target.description}): {format_bytes(the_target.total_bytes)} reported by "
                f"the driver, less {format_bytes(the_target.context_bytes)} for the CUDA context (driver state, lazily "
                f"loaded kernels) and {format_bytes(the_target.workspace_bytes)} for cuBLAS/cuBLASLt workspaces, leaves "
                f"{format_bytes(usable)} for tensors.")
        limit = the_target.total_bytes
        if memory_limit is not None and memory_limit - the_target.workspace_bytes < usable:
            usable = memory_limit - the_target.workspace_bytes
            limit = memory_limit
            note += (f" The memory limit {format_bytes(memory_limit)} is smaller: it is taken as the allocator's budget, "
                     f"less the workspaces: {format_bytes(usable)} for tensors.")
        return the_target, limit, usable, note
    assert memory_limit is not None
    usable = memory_limit - WORKSPACE_BYTES_HOPPER
    note = (f"Memory limit {format_bytes(memory_limit)} taken as the budget of PyTorch's caching allocator (as gaplan probe "
            f"--memory-limit on CUDA; the CUDA context is outside it), less {format_bytes(WORKSPACE_BYTES_HOPPER)} for "
            f"cuBLAS/cuBLASLt workspaces (Hopper's, the largest): {format_bytes(usable)} for tensors.")
    if usable <= 0:
        raise GaplanError(f"--memory-limit {format_bytes(memory_limit)} leaves nothing for tensors after the cuBLAS workspaces")
    return None, memory_limit, usable, note


# ----------------------------------------------------------------------------------------------
# The search: a line through the micro-steps' peaks, then the whole step traced at the edge


def _secant(points: dict[int, int]) -> tuple[float, float]:
    """(intercept, slope) of the line through the two largest traced sizes."""
    (b1, p1), (b2, p2) = sorted(points.items())[-2:]
    slope = (p2 - p1) / (b2 - b1)
    return p2 - slope * b2, slope


def _predict(points: dict[int, int], budget: int, cap: int) -> int:
    intercept, slope = _secant(points)
    if slope <= 0:
        return cap
    return max(1, min(cap, math.floor((budget - intercept) / slope)))


def _find_edge(tracer: _Tracer, usable: int, sizes: tuple[int, ...], cap: int,
               spec: WorkloadSpec) -> tuple[int, bool, tuple[float, float]]:
    """(B*, capped, line). Raises DoesNotFit when micro-batch 1 does not fit."""
    optimizer_step = tracer.optimizer_step()
    if optimizer_step.peak_bytes > usable:
        raise DoesNotFit(
            f"{spec.model} does not fit in {format_bytes(usable)}: weights, gradients and optimizer states with the "
            f"optimizer step's temporaries take {format_bytes(optimizer_step.peak_bytes)} before any activation",
            optimizer_step.peak_bytes)
    # The line is drawn through tracked bytes; the device's overhead (CPU only) is a constant over it.
    micro_rows = {b: tracer.micro_steps(b) for b in sizes}
    line_points = {b: row.tracked_total for b, row in micro_rows.items()}
    steps: dict[int, bool] = {}  # micro-batch -> the whole step fits

    def budget() -> int:
        return usable - tracer.overhead()

    def bracket() -> tuple[int, int | None]:
        lo = max((b for b, fits in steps.items() if fits), default=0)
        hi = min((b for b, fits in steps.items() if not fits), default=None)
        return lo, hi

    candidate = _predict(line_points, budget(), cap)
    for _ in range(MAX_CHECK_TRACES):
        lo, hi = bracket()
        if hi == 1:
            row = tracer.last_step(1)
            raise DoesNotFit(f"{spec.model} does not fit in {format_bytes(usable)} even at micro-batch 1: one step's peak "
                             f"is {format_bytes(row.peak_bytes)}", row.peak_bytes)
        if lo >= cap:
            return cap, True, least_squares_line(sorted(line_points.items()))
        if hi is not None and hi == lo + 1:
            return lo, False, least_squares_line(sorted(line_points.items()))
        b = min(max(candidate, lo + 1), hi - 1 if hi is not None else cap)
        if b in micro_rows:  # both phases already traced at b, and they never overlap: the step's peak is the larger
            row = tracer.composed_step(micro_rows[b], optimizer_step)
        else:
            row = tracer.step(b)
        steps[b] = row.peak_bytes <= usable
        if row.tracked_total > optimizer_step.tracked_total:  # the micro-steps set this peak: a point of the line
            line_points[b] = row.tracked_total
        lo, hi = bracket()
        predicted = _predict(line_points, budget(), cap)
        if len(steps) >= MAX_CHECK_TRACES // 2:  # the line keeps missing: bisect (or double) what is left
            candidate = (lo + hi) // 2 if hi is not None else 2 * lo
        elif steps[b]:
            candidate = predicted if predicted > b else b + 1
        else:
            candidate = predicted if predicted < b else b - 1
    raise GaplanError(f"{spec.model}: the estimate did not settle on an edge in {MAX_CHECK_TRACES} traces")


# ----------------------------------------------------------------------------------------------
# Tracing on fake tensors


def _cuda_block_bytes(nbytes: int) -> int:
    """Bytes the CUDA caching allocator sets aside for a tensor of ``nbytes``."""
    if nbytes <= 0:
        return 0
    if nbytes >= CUDA_LARGE_ALLOC:
        return -(-nbytes // CUDA_ROUND_LARGE) * CUDA_ROUND_LARGE
    return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK


class _Tracer:
    """A fake workload and the modes, patches and bookkeeping of its traces."""

    def __init__(self, spec: WorkloadSpec, device_kind: str, threads: int | None = None) -> None:
        self.spec = spec
        self._threads = threads
        self.device_kind = device_kind
        self.rows: list[TracedRow] = []
        self._stack = contextlib.ExitStack()
        self.workload: Workload
        self._no_step: Workload

    # -- setup -----------------------------------------------------------------------------------

    def __enter__(self) -> _Tracer:
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.threads = self._threads or torch.get_num_threads()
        self.mode = FakeTensorMode(allow_non_fake_inputs=True)
        try:
            self.workload = _fake_workload(self.spec, self.device_kind, self.mode)
            self._no_step = dataclasses.replace(self.workload, optimizer=_no_step_optimizer(self.workload.optimizer))
            self.helper = _TraceHelper()
            self._stack.enter_context(_fast_peak_tracking())
            if self.device_kind == "cuda":
                self._stack.enter_context(_cuda_block_rounding())
            self._stack.enter_context(self.mode)
            self._stack.enter_context(self.helper)
            if self.device_kind == "cuda" and self.spec.dtype != "fp32":
                self._stack.enter_context(_CudaAutocastFp32())
            with _fake_tensor_errors(self.spec):
                from gaplan.trial import materialize_optimizer_state

                materialize_optimizer_state(self.workload)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    # -- traces ----------------------------------------------------------------------------------

    def _trace(self, workload: Workload, micro_batch: int, micro_steps: int, phase: str) -> TracedRow:
        import torch

        from gaplan.breakdown import measure_breakdown

        for param in workload.model.parameters():  # gradients held, as from the step's earlier micro-steps
            if param.requires_grad:
                param.grad = torch.zeros_like(param)
        with _fake_tensor_errors(self.spec):
            breakdown = measure_breakdown(workload, micro_batch, micro_steps=micro_steps)
        data = breakdown.to_dict()
        data.pop("device_peak_bytes", None)
        row = TracedRow(phase=phase, peak_bytes=breakdown.tracked_total + self.overhead(), **data)
        self.rows.append(row)
        return row

    def optimizer_step(self) -> TracedRow:
        return self._trace(self.workload, 0, 0, "optimizer-step")

    def micro_steps(self, micro_batch: int) -> TracedRow:
        return self._trace(self._no_step, micro_batch, 1, "micro-steps")

    def step(self, micro_batch: int) -> TracedRow:
        return self._trace(self.workload, micro_batch, 1, "step")

    def composed_step(self, micro_steps: TracedRow, optimizer_step: TracedRow) -> TracedRow:
        larger = max(micro_steps, optimizer_step, key=lambda r: r.tracked_total)
        row = dataclasses.replace(larger, micro_batch=micro_steps.micro_batch, phase="step", composed=True)
        self.rows.append(row)
        return row

    def last_step(self, micro_batch: int) -> TracedRow:
        return next(r for r in reversed(self.rows) if r.phase == "step" and r.micro_batch == micro_batch)

    # -- the device model ------------------------------------------------------------------------

    def overhead(self) -> int:
        """Bytes a CPU process holds besides its tensors (none on CUDA: the reserve covers it)."""
        if self.device_kind != "cpu":
            return 0
        return CPU_HEAP_BYTES + self.threads * self.helper.gemm_panel_bytes

    def final_rows(self) -> list[TracedRow]:
        """Every row, with the device overhead as known at the end (MKL's buffer is sized by the largest GEMM seen)."""
        overhead = self.overhead()
        return [dataclasses.replace(r, peak_bytes=r.tracked_total + overhead) for r in self.rows]

    def extra(self) -> dict[str, Any]:
        data: dict[str, Any] = {"attention_ops": sorted(self.helper.attention_ops)}
        if self.device_kind == "cpu":
            data.update(threads=self.threads, cpu_heap_bytes=CPU_HEAP_BYTES, mkl_panel_bytes=self.helper.gemm_panel_bytes)
        step = next((r for r in self.final_rows() if r.phase == "optimizer-step"), None)
        if step is not None:
            data["optimizer_step_peak_bytes"] = step.peak_bytes
        return data

    def assumptions(self) -> list[str]:
        spec, notes = self.spec, []
        notes.append("Steady state: optimizer states exist and gradients are held across micro-steps, so the peak is the "
                     "larger of the micro-steps' (weights, gradients, optimizer states, one micro-batch's activations) "
                     "and the optimizer step's; batches are full length.")
        static = self.workload.static_bytes()
        step = next((r for r in self.rows if r.phase == "optimizer-step"), None)
        temporaries = max(0, step.tracked_total - static) if step is not None else 0
        if self.device_kind == "cpu":
            panel = self.helper.gemm_panel_bytes
            notes.append(f"CPU process: traced tensors plus {format_bytes(CPU_HEAP_BYTES)} of heap (Python objects, autograd) "
                         f"and {self.threads} thread(s) x {format_bytes(panel)} of MKL GEMM packing buffer (4 bytes x "
                         f"min(K, {MKL_PANEL_K}) x min(N, {MKL_PANEL_N}) of the largest matrix product), both measured "
                         "against gaplan probe's resident-memory peak; no CUDA adjustment.")
            if spec.optimizer == "adamw":
                notes.append(f"AdamW as PyTorch runs it on CPU (single-tensor): its step's temporaries, "
                             f"{format_bytes(temporaries)}, are traced.")
            if self.helper.convolutions:
                notes.append("The model runs convolutions: oneDNN's primitive cache and JIT-compiled kernels live outside "
                             "the tensors and are not traced (tens of MiB on the example CNN): the estimate is low for them.")
            return notes
        notes.append(f"CUDA caching allocator: every tensor counted at its block size, rounded up to {CUDA_BLOCK} bytes, and "
                     f"allocations of {format_bytes(CUDA_LARGE_ALLOC)} or more at their {format_bytes(CUDA_ROUND_LARGE)}-rounded "
                     "segment; fragmentation of the allocator's cache beyond that is not modelled (the reserved peak can be "
                     "a few percent higher: keep a margin, or check with gaplan probe on the card).")
        if spec.optimizer == "adamw":
            notes.append(f"AdamW traced with foreach=True, PyTorch's default for CUDA parameters: its step holds one more "
                         f"fp32 copy of the second moments, {format_bytes(temporaries)} of temporaries over the "
                         f"{format_bytes(static)} of weights, gradients and states; fused=True would not.")
        else:
            notes.append("SGD traced with foreach=True, PyTorch's default for CUDA parameters (no momentum: no temporaries).")
        ops = self.helper.attention_ops
        if any("flash" in op or "efficient" in op for op in ops):
            notes.append("Attention: traced through PyTorch's fused scaled_dot_product_attention kernel (flash on CPU), which "
                         "keeps the same tensors as CUDA's flash and memory-efficient kernels (the output and an fp32 "
                         "log-sum-exp, no seq x seq probabilities): no correction applied.")
        elif any("math" in op for op in ops):
            notes.append("Attention: the trace took scaled_dot_product_attention's math path, which keeps seq x seq "
                         "probabilities that CUDA's fused kernels do not: the estimate is an upper bound for attention.")
        else:
            notes.append("Attention: the model computes it eagerly (seq x seq probabilities kept), as it would on CUDA.")
        if spec.dtype != "fp32":
            notes.append(f"Mixed precision ({spec.dtype} autocast over fp32 weights): traced under CPU autocast with CUDA "
                         "autocast's float32 op list applied on top (layer_norm, softmax, log_softmax, pow, exp, sum and the "
                         "like run in fp32, as on CUDA); autocast's cached low-precision copies of the weights are counted.")
        if self.helper.convolutions:
            notes.append("The model runs convolutions: cuDNN's workspaces, allocated inside the kernels, are not traced; the "
                         "estimate can be low by the largest one (torch.backends.cudnn.benchmark favours fast algorithms "
                         "with large workspaces).")
        notes.append("Nothing else on the GPU (other processes, NCCL buffers, a display) is counted.")
        return notes


class _TraceHelper:
    """A dispatch mode under MemTracker: stands in for values and records the matrix products and attention ops."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        helper = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return helper.dispatch(func, args, kwargs or {})

        self._mode = _Mode()
        self.gemm_panel_bytes = 0
        self.attention_ops: set[str] = set()
        self.convolutions = False

    def __enter__(self) -> _TraceHelper:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)

    def dispatch(self, func, args, kwargs):
        import torch

        aten = torch.ops.aten
        if func is aten._local_scalar_dense.default:
            # A value read off a fake tensor: the loss logged, the target count, a mask check. None changes a shape.
            dtype = args[0].dtype
            return True if dtype == torch.bool else (1.0 if dtype.is_floating_point or dtype.is_complex else 1)
        if func in (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default):
            a, b = (args[0], args[1]) if func in (aten.mm.default, aten.bmm.default) else (args[1], args[2])
            if a.dtype == torch.float32:  # MKL sgemm; bf16/fp16 products go to oneDNN, measured without such a buffer
                panel = 4 * min(a.shape[-1], MKL_PANEL_K) * min(b.shape[-1], MKL_PANEL_N)
                self.gemm_panel_bytes = max(self.gemm_panel_bytes, panel)
        elif "scaled_dot_product" in func.__name__ or "attention" in func.__name__:
            self.attention_ops.add(func.__name__)
        elif "convolution" in func.__name__:
            self.convolutions = True
        return func(*args, **kwargs)


class _CudaAutocastFp32:
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
                if getattr(func, "__name__", None) in _CUDA_AUTOCAST_FP32 and torch.is_autocast_enabled("cpu"):
                    args, kwargs = upcast(args), {k: upcast(v) for k, v in kwargs.items()}
                return func(*args, **kwargs)

        self._mode = _Mode()

    def __enter__(self) -> _CudaAutocastFp32:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)


@contextlib.contextmanager
def _fast_peak_tracking() -> Iterator[None]:
    """Keep MemTracker's global peak only.

    MemTracker also keeps a peak per module, walking every module it has seen on every operator:
    quadratic in depth (a 32-layer model: most of a minute per trace). gaplan reads only the global
    peak, so the per-module walk is skipped. Applied only when MemTracker's method uses the
    attributes this replacement updates; otherwise the original (slower, same answer) runs.
    """
    from torch.distributed._tools import mem_tracker

    original = mem_tracker.MemTracker._update_peak_stats
    if not {"_curr_mem_snap", "_peak_mem", "_peak_mem_snap"} <= set(original.__code__.co_names):
        yield
        return

    def update_global_peak(self, peak_state) -> None:
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap[mem_tracker._TOTAL_KEY]:
                self._peak_mem[dev] = snap[mem_tracker._TOTAL_KEY]
                self._peak_mem_snap[dev] = dict(snap)

    mem_tracker.MemTracker._update_peak_stats = update_global_peak
    try:
        yield
    finally:
        mem_tracker.MemTracker._update_peak_stats = original


@contextlib.contextmanager
def _cuda_block_rounding() -> Iterator[None]:
    """Count each storage at the CUDA caching allocator's size (MemTracker does so only for cuda tensors)."""
    from torch.distributed._tools import mem_tracker

    info = mem_tracker._WeakRefInfo
    original = info._calculate_mem_consumed

    def rounded(self) -> int:
        return _cuda_block_bytes(self.size * self.element_size)

    info._calculate_mem_consumed = rounded
    try:
        yield
    finally:
        info._calculate_mem_consumed = original


@contextlib.contextmanager
def _fake_tensor_errors(spec: WorkloadSpec) -> Iterator[None]:
    """Turn what fake tensors cannot trace into one line for the user."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedOperatorException,
    )

    try:
        yield
    except (DynamicOutputShapeException, DataDependentOutputException, UnsupportedOperatorException) as exc:
        op = exc.args[0] if exc.args else type(exc).__name__
        raise GaplanError(f"{spec.model}: cannot be traced without allocating: it runs {op}, whose result depends on "
                          "tensor values; use gaplan probe on a real device") from None


# ----------------------------------------------------------------------------------------------
# The fake workload


def _fake_workload(spec: WorkloadSpec, device_kind: str, mode) -> Workload:
    """The workload of ``spec`` with fake CPU parameters, the device's optimizer and fake batches."""
    import torch
    from torch import nn

    from gaplan.workload import build_workload, make_optimizer, model_source_kind

    # A module:function model builds itself; the default device keeps its tensors on meta too.
    scope = torch.device("meta") if model_source_kind(spec.model) == "function" else contextlib.nullcontext()
    with scope:
        meta = build_workload(spec, "meta")
    model = meta.model
    fakes: dict[int, torch.Tensor] = {}

    def fake_of(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in fakes:
            with mode:
                fakes[id(tensor)] = torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype,
                                                        device="cpu")
        return fakes[id(tensor)]

    parameters: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in parameters:  # tied weights stay tied
                parameters[id(param)] = nn.Parameter(fake_of(param), requires_grad=param.requires_grad)
            module._parameters[name] = parameters[id(param)]
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = fake_of(buffer)
        for name, value in list(vars(module).items()):  # plain tensor attributes (cached tables and the like)
            if isinstance(value, torch.Tensor) and value.device.type == "meta":
                setattr(module, name, fake_of(value))
    if device_kind == "cuda":  # what torch.optim picks for CUDA parameters: the foreach implementation
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer_class = torch.optim.AdamW if spec.optimizer == "adamw" else torch.optim.SGD
        optimizer = optimizer_class(params, lr=spec.lr, foreach=True)
    else:
        optimizer = make_optimizer(model, spec.optimizer, spec.lr)
    return dataclasses.replace(meta, optimizer=optimizer, make_batch=_fake_batch_maker(meta, mode),
                               device=torch.device("cpu"))


def _fake_batch_maker(meta: Workload, mode):
    """Fake batches shaped like the workload's own (read from real batches of one and two samples)."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():  # a real, tiny batch (on meta): the batch maker may index by value
        one, two = meta.make_batch(1), meta.make_batch(2)

    def make_batch(size: int) -> dict[str, Any]:
        batch: dict[str, Any] = {}
        with mode:
            for key, value in one.items():
                if not isinstance(value, torch.Tensor):
                    batch[key] = value
                    continue
                shape = list(value.shape)
                scaled = isinstance(two.get(key), torch.Tensor) and value.dim() > 0 and two[key].shape[0] == 2 * shape[0]
                if scaled:
                    shape[0] = shape[0] * size
                batch[key] = torch.zeros(shape, dtype=value.dtype, device="cpu")
        return batch

    return make_batch


def _no_step_optimizer(optimizer):
    """The optimizer's states with a step that does nothing: the micro-steps' peak alone."""
    import torch

    class _NoStep(torch.optim.Optimizer):
        def __init__(self, inner: torch.optim.Optimizer) -> None:  # no super().__init__: shares the inner state
            self.inner = inner
            self.state = inner.state
            self.param_groups = inner.param_groups
            self.defaults = inner.defaults

        def step(self, closure=None):
            return None

        def zero_grad(self, set_to_none: bool = True) -> None:
            self.inner.zero_grad(set_to_none=set_to_none)

    return _NoStep(optimizer)
