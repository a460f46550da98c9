"""Tracing one steady-state step on fake tensors with torch's ``MemTracker``.

A trace is :func:`gaplan.training.breakdown.measure_breakdown` on the fake workload (:mod:`gaplan.estimate.fake`):
the optimizer states exist and the gradients are already allocated, as at the second micro-step of
an accumulated step, so one traced micro-step shows what every later one costs. The micro-steps
(forward and backward) and the optimizer step are traced apart: the optimizer step does not grow
with the micro-batch, and the two never overlap, so the step's peak is the larger of the two.

Values are never known under fake tensors: a ``.item()`` (the loss logged, the target count that
divides the loss) reads as 1 (True for a flag), which changes no shape. A model whose shapes depend
on tensor values (``nonzero``, boolean indexing) cannot be traced; that is reported as a user error.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gaplan.core.constants import BREAKDOWN_CATEGORIES
from gaplan.devices.reserve import nccl_buffer_bytes
from gaplan.estimate.assumptions import (
    Assumption,
    chunked_loss,
    data_parallel_buckets,
    lora_adapters,
    nccl_buffers,
    quantized_weights,
    trace_assumptions,
)
from gaplan.estimate.device import DeviceModel, GraphCount, gemm_panel_bytes
from gaplan.estimate.fake import (
    fake_tensor_errors,
    fake_tensor_mode,
    fake_workload,
    no_step_optimizer,
    readable_values,
)
from gaplan.estimate.offload import HostCopies, offloaded_to_host
from gaplan.estimate.recompute import recompute_under_forward_modes
from gaplan.estimate.result import TracedRow
from gaplan.estimate.torch_private import private, private_attr, private_module
from gaplan.plan.search import least_squares_line
from gaplan.workload.spec import model_source_kind

if TYPE_CHECKING:
    from gaplan.workload.build import Workload, WorkloadSpec


class Tracer:
    """A fake workload, the modes and patches its traces run under, and the rows they gave."""

    def __init__(self, spec: WorkloadSpec, device_kind: str, threads: int | None = None, world_size: int = 1,
                 qlora_run=None) -> None:
        self.spec = spec
        # QLoRA: the run's bitsandbytes and loop (gaplan.estimate.quantized.QLoRARun; None: gaplan's own)
        self.qlora_run = qlora_run
        self.kept_inputs = None  # an old bitsandbytes' kept inputs (gaplan.estimate.quantized.KeptInputs)
        self.world_size = world_size  # above 1: DistributedDataParallel's gradient buckets count (bucket_bytes)
        self.bucket_bytes = 0
        # above 1 on cuda: NCCL's buffers, outside the allocator and in no one-process trial (gaplan.devices.reserve)
        self.nccl_bytes = nccl_buffer_bytes(world_size) if device_kind == "cuda" else 0
        self.device = DeviceModel(device_kind, threads)
        # --compile, traced as inductor partitions the step (gaplan.estimate.compiled): in one process (LoRA and
        # QLoRA too); over several ranks, or offloading (save_on_cpu's hooks fail in dynamo here), the eager model
        self.compiled = bool(spec.compile) and world_size == 1 and not spec.offload_activations
        self.compiled_graphs: list = []  # the forward graphs compiled for the trace
        self.rows: list[TracedRow] = []
        self.quantized = None  # QLoRA: the 4-bit accounting of the frozen base (gaplan.estimate.quantized)
        self.allocators = None  # on cuda: the caching allocator replayed through each trace (gaplan.estimate.allocator)
        self.host_copies = HostCopies()  # offload_activations: the bytes a traced micro-step sent to the host
        self.host_bytes: dict[int, int] = {}  # by a traced micro-step's samples
        self._stack = contextlib.ExitStack()
        self.workload: Workload
        self._no_step: Workload

    def __enter__(self) -> Tracer:
        self.mode = fake_tensor_mode()
        try:
            self.helper = TraceHelper(self.compiled)
            self.workload = self.helper.counting_graphs(fake_workload(self.spec, self.device, self.mode))
            if self.compiled:
                from gaplan.estimate.compiled import compile_for_trace, one_pair_of_module_hooks

                compile_for_trace(self.workload.model, self.compiled_graphs)
                self._stack.enter_context(one_pair_of_module_hooks())
            self._no_step = dataclasses.replace(self.workload, optimizer=no_step_optimizer(self.workload.optimizer))
            if self.spec.quantize:
                from gaplan.estimate.quantized import KeptInputs, QLoRARun, quantized_base

                self.qlora_run = self.qlora_run or QLoRARun()
                own = model_source_kind(self.spec.model) == "function"  # each layer in its weight's dtype
                self.quantized = quantized_base(self.workload.model, None if own else self.spec.dtype,
                                                quantize=self.spec.quantize, run=self.qlora_run, own=own)
                if self.qlora_run.keeps_inputs:
                    self.kept_inputs = KeptInputs(self.workload.model, self.qlora_run, own)
            if self.world_size > 1:  # DDP's buckets: a flat copy of the gradients, held through every step
                self.bucket_bytes = sum(p.numel() * p.element_size() for p in self.workload.model.parameters()
                                        if p.requires_grad)
            self.allocators = enter_trace_modes(self._stack, self.device, self.mode, self.helper, self.spec,
                                                self.host_copies)
            self._stack.enter_context(self.device.optimizer_step(self.spec.optimizer))
            with fake_tensor_errors(self.spec):
                from gaplan.worker.trial import materialize_optimizer_state

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

        from gaplan.training.breakdown import measure_breakdown

        for param in workload.model.parameters():  # gradients held, as from the step's earlier micro-steps
            if param.requires_grad:
                param.grad = torch.zeros_like(param)
        kept = self.kept_inputs if self.kept_inputs is not None and micro_steps else contextlib.nullcontext()
        self.host_copies.reset()
        with fake_tensor_errors(self.spec), kept, compile_errors(self.compiled):
            breakdown = measure_breakdown(workload, micro_batch, micro_steps=micro_steps, workspace=self._workspace(),
                                          compiled=self.compiled)
        if self.compiled and micro_steps and not self.compiled_graphs:  # dynamo left the model eager: say so
            self.compiled = False
        if micro_batch and micro_steps == 1:
            self.host_bytes[micro_batch] = self.host_copies.bytes
        categories = {category: getattr(breakdown, category) for category in BREAKDOWN_CATEGORIES}
        total = breakdown.tracked_total
        if self.quantized is not None:  # the base's weights at 4 bits (their dequantized copies are workspaces)
            categories["parameters"] -= self.quantized.saved_bytes
            total -= self.quantized.saved_bytes
        unfilled = cached = 0
        if self.allocators is not None:  # the reserved peak: what the allocator's segments hold beyond the live blocks
            unfilled, cached = self.allocators.unfilled(), self.allocators.cached()
            categories["other"] += unfilled
            total += unfilled
        row = TracedRow(micro_batch=breakdown.micro_batch, phase=phase, **categories, tracked_total=total,
                        peak_bytes=total + self.overhead(), unfilled_segment_bytes=unfilled,
                        cached_segment_bytes=cached)
        self.rows.append(row)
        return row

    @property
    def unfilled_segment_bytes(self) -> int:
        """The most any trace's segments held beyond its live blocks at its peak (on cuda)."""
        return max((row.unfilled_segment_bytes for row in self.rows), default=0)

    def _workspace(self):
        """What an operator holds only while it runs: the device's (MKL's buffer on CPU) and a 4-bit layer's
        dequantized copy."""
        device, quantized = self.device.workspace(), self.quantized
        if quantized is None:
            return device
        if device is None:
            return quantized.dequantized_copy
        return lambda func, args: device(func, args) + quantized.dequantized_copy(func, args)

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

    # -- what the device adds, and what was assumed ----------------------------------------------

    def overhead(self) -> int:
        """Bytes the device holds besides the traced tensors (the CPU process's heap, DDP's buckets, NCCL's buffers).

        MKL's GEMM buffers are traced, as a workspace at the moment of each product (``DeviceModel.workspace``).
        """
        return self.device.overhead(self.helper.graph.nodes) + self.bucket_bytes + self.nccl_bytes

    def static_bytes(self) -> int:
        """Weights (4-bit ones at their quantized size), gradients and optimizer states."""
        return self.workload.static_bytes() - (self.quantized.saved_bytes if self.quantized is not None else 0)

    def final_rows(self) -> list[TracedRow]:
        """Every row, with the device overhead added."""
        overhead = self.overhead()
        return [dataclasses.replace(r, peak_bytes=r.tracked_total + overhead) for r in self.rows]

    def extra(self) -> dict[str, Any]:
        data: dict[str, Any] = {"attention_ops": sorted(self.helper.attention_ops)}
        data.update(self.device.extra(self.helper.gemm_panel_bytes, self.helper.graph.nodes))
        if self.allocators is not None:
            data["unfilled_segment_bytes"] = self.unfilled_segment_bytes
        if self.spec.offload_activations and len(self.host_bytes) > 1:  # a micro-step's copies, a line in its samples
            per_micro_step, per_sample = least_squares_line(sorted(self.host_bytes.items()))
            data.update(host_bytes_per_sample=round(per_sample), host_bytes_per_micro_step=round(per_micro_step))
        if self.world_size > 1:
            data.update(parallel="ddp", world_size=self.world_size, ddp_bucket_bytes=self.bucket_bytes)
            if self.nccl_bytes:
                data["nccl_bytes"] = self.nccl_bytes
        step = next((r for r in self.final_rows() if r.phase == "optimizer-step"), None)
        if step is not None:
            data["optimizer_step_peak_bytes"] = step.peak_bytes
        return data

    def assumptions(self) -> list[Assumption]:
        step = next((r for r in self.rows if r.phase == "optimizer-step"), None)
        notes = trace_assumptions(self.spec, self.device, self.helper, self.static_bytes(),
                                  step.tracked_total if step is not None else None, self.helper.graph.nodes,
                                  unfilled_segment_bytes=self.unfilled_segment_bytes, compiled=self.compiled)
        if self.world_size > 1:
            notes.append(data_parallel_buckets(self.bucket_bytes, self.world_size))
        if self.nccl_bytes:
            notes.append(nccl_buffers(self.nccl_bytes, self.world_size))
        if self.spec.lora:
            notes.append(lora_assumption(self.spec, self.workload.model))
        if self.quantized is not None:
            notes.append(quantized_weights(self.quantized, self.spec))
        if self.workload.info.get("loss_chunk_tokens"):
            notes.append(chunked_loss(self.workload.info["loss_chunk_tokens"], self.workload.vocab_size))
        return notes


@contextlib.contextmanager
def compile_errors(compiled: bool) -> Iterator[None]:
    """A model dynamo cannot compile under the trace is one line, not a traceback: dynamo's own errors, and any other
    raised inside the compiler (dynamo asserts on GPT-2's checkpointed blocks, for one)."""
    if not compiled:
        yield
        return
    from gaplan.core.errors import GaplanError
    from gaplan.estimate.compiled import dynamo_error, raised_in_compiler

    try:
        yield
    except Exception as exc:
        dynamos = isinstance(exc, dynamo_error())
        if not dynamos and not raised_in_compiler(exc):
            raise
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        reason = reason if dynamos and reason else f"{type(exc).__name__}{': ' * bool(reason)}{reason}"
        raise GaplanError(f"--compile could not be traced ({reason}): estimate without --compile, or measure it with "
                          "gaplan probe --compile") from exc


def lora_assumption(spec: WorkloadSpec, model: Any) -> Assumption:
    """The LoRA record of a traced model: its frozen bytes and its adapters."""
    frozen = [p for p in model.parameters() if not p.requires_grad]
    trainable = [p for p in model.parameters() if p.requires_grad]
    return lora_adapters(spec, sum(p.numel() * p.element_size() for p in frozen), sum(p.numel() for p in trainable),
                         sum(p.numel() * p.element_size() for p in trainable))


class TraceHelper:
    """A dispatch mode under MemTracker: stands in for values and records the matrix products and attention ops.

    Attributes (what the traces saw, read by the device model and the assumptions):
        gemm_panel_bytes: MKL's packing buffer per thread for the largest float32 product.
        graph: the largest autograd graph of a micro-step (the CPU heap grows with it).
        cuda_attention_calls: under the cuda device model, each distinct SDPA call and the backend CUDA would take.
        attention_ops: names of the attention operators run.
        convolutions: whether any convolution ran.
    """

    def __init__(self, compiled: bool = False) -> None:
        dispatch_mode = private("torch.utils._python_dispatch", "TorchDispatchMode")
        helper = self

        class _Mode(dispatch_mode):
            @classmethod
            def ignore_compile_internals(cls) -> bool:  # a compiled model's graphs run under it (estimate.compiled)
                return compiled

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return helper.dispatch(func, args, kwargs or {})

        self._mode = _Mode()
        self.gemm_panel_bytes = 0
        self.graph = GraphCount()
        self.cuda_attention_calls: set = set()  # on cuda: each distinct SDPA call and its backend (estimate.attention)
        self.attention_ops: set[str] = set()
        self.convolutions = False

    def counting_graphs(self, workload: Workload) -> Workload:
        """``workload`` with a loss whose graph is counted on every micro-step."""
        raw_loss = workload.raw_loss
        return dataclasses.replace(workload, raw_loss=lambda model, batch: self.graph.counted(raw_loss(model, batch)))

    def __enter__(self) -> TraceHelper:
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
        panel = gemm_panel_bytes(func, args)
        if panel:
            self.gemm_panel_bytes = max(self.gemm_panel_bytes, panel)
        elif "scaled_dot_product" in func.__name__ or "attention" in func.__name__:
            self.attention_ops.add(func.__name__)
        elif "convolution" in func.__name__:
            self.convolutions = True
        return func(*args, **kwargs)


@contextlib.contextmanager
def quiet_module_tracking() -> Iterator[None]:
    """Without MemTracker's module tracker's "The module hierarchy tracking maybe be messed up" warning.

    transformers (through the ``kernels`` package) wraps functions such as ``apply_rotary_pos_emb`` and
    ``rotate_half`` in module objects of one class, ``Func``, that belong to no model: the tracker names a module
    outside the hierarchy by its class, so one ``Func`` called inside another looks like a module entered twice.
    The tracker's per-module tree is not what gaplan reads (the global peak is, :func:`fast_peak_tracking`), and
    the memory is counted either way; the user did nothing wrong. The tracker also replaces
    ``warnings.formatwarning`` when it warns: restored here.
    """
    import warnings

    formatter = warnings.formatwarning
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The module hierarchy tracking maybe be messed up")
        try:
            yield
        finally:
            warnings.formatwarning = formatter


def enter_trace_modes(stack: contextlib.ExitStack, device: DeviceModel, mode: Any, helper: Any, spec: Any,
                      host_copies: HostCopies | None = None) -> Any:
    """Enter, in their order, the modes a trace runs under (one process or sharded): the device's allocator, the
    fake tensors, the helper's tracking, autocast, attention, dropout and, with offloading, ``save_on_cpu`` as the
    device sees it; the allocators."""
    stack.enter_context(fast_peak_tracking())
    stack.enter_context(quiet_module_tracking())
    stack.enter_context(readable_values())
    stack.enter_context(recompute_under_forward_modes())  # the device's modes, in recomputation too
    allocators = stack.enter_context(device.allocator())
    stack.enter_context(mode)
    stack.enter_context(helper)
    stack.enter_context(device.autocast(spec.dtype))
    stack.enter_context(device.attention(helper.cuda_attention_calls))
    stack.enter_context(device.dropout())
    if spec.offload_activations:
        stack.enter_context(offloaded_to_host(host_copies))
    return allocators


@contextlib.contextmanager
def fast_peak_tracking() -> Iterator[None]:
    """Keep MemTracker's global peak only.

    MemTracker also keeps a peak per module, walking every module it has seen on every operator:
    quadratic in depth (a 32-layer model: most of a minute per trace). gaplan reads only the global
    peak, so the per-module walk is skipped. Applied only when MemTracker's method uses the
    attributes this replacement updates; otherwise the original (slower, same answer) runs.
    """
    mem_tracker = private_module("torch.distributed._tools.mem_tracker")
    tracker_class = private_attr(mem_tracker, "MemTracker")
    original = private_attr(tracker_class, "_update_peak_stats")
    total_key = private_attr(mem_tracker, "_TOTAL_KEY")
    code = getattr(original, "__code__", None)
    if code is None or not {"_curr_mem_snap", "_peak_mem", "_peak_mem_snap"} <= set(code.co_names):
        yield
        return

    def update_global_peak(self, peak_state) -> None:
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap[total_key]:
                self._peak_mem[dev] = snap[total_key]
                self._peak_mem_snap[dev] = dict(snap)

    tracker_class._update_peak_stats = update_global_peak
    try:
        yield
    finally:
        tracker_class._update_peak_stats = original
