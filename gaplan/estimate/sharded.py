"""One rank of a W-way FSDP2 step, traced on fake tensors: nothing is allocated, no GPU and no other rank.

``gaplan estimate --parallel fsdp --world-size W`` runs here. How one rank is traced:

1. a fake process group of ``W`` ranks (``torch.testing._internal.distributed.fake_pg``: collectives
   return at once, shapes right) and a ``cpu`` device mesh over it (a ``cuda`` mesh fails on a CPU-only
   build; CUDA differences are modelled by :mod:`gaplan.estimate.device`, as for one process);
2. the model built on the meta device and sharded as training shards it
   (:func:`gaplan.parallel.fsdp.shard_model`: ``fully_shard`` per block, then the root, the dtype's
   ``MixedPrecisionPolicy``, ``CPUOffloadPolicy`` with ``--cpu-offload``), then ``to_empty`` under
   ``FakeTensorMode``: rank 0's shards become fake tensors (rank 0 holds the largest shards);
3. the optimizer made after sharding, its states filled (the steady state: AdamW's two moments exist);
4. torch's ``FSDPMemTracker`` over the micro-steps of one accumulated step, as training runs them:
   two micro-steps, the first under ``set_requires_gradient_sync(False)`` with ``--grad-sync last``
   (its unsharded fp32 gradients are held into the second) or both reduce-scattering with
   ``--grad-sync every`` (sharded gradients held); the peak is by FSDP's categories;
5. the optimizer step traced apart, with torch's ``MemTracker`` over tensors shaped like rank 0's
   local shards, its states filled as a first step leaves them (the step is elementwise on the
   shards: a DTensor's step holds the same bytes, and tracing it through DTensor's sharding
   propagation costs minutes for a large model).

Depth. A deep model whose blocks are one stack of identical blocks (Llama's 32 or 80 decoder layers)
is traced at two shallow depths (3 and 4 blocks: truncated copies of the model) and every category,
of the micro-steps and of the optimizer step, extrapolated along the line through them: every block
adds the same shards, gradients, optimizer states and activations, and past the shallowest depths the
peak stays at the same place of the step. A 70B shape then traces in seconds. Measured: a 7B shape's
extrapolated trace equals its 32-block trace to the byte (micro-batches 1 and 2), and the tests check
it on a 6-block model with and without checkpointing. Shallow models (8 blocks or fewer) are traced whole.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gaplan.core.errors import GaplanError
from gaplan.core.options import OptionError
from gaplan.devices.reserve import nccl_buffer_bytes
from gaplan.estimate.assumptions import Assumption, nccl_buffers, sharded_assumptions, trace_assumptions
from gaplan.estimate.depth import extrapolate, truncated_copy, uniform_stack, unsegmented
from gaplan.estimate.device import DeviceModel, GraphCount
from gaplan.estimate.fake import fake_batch_maker, fake_tensor_errors, fake_tensor_mode
from gaplan.estimate.result import TracedRow
from gaplan.estimate.shard_tracking import (
    by_category,
    fill_optimizer_state,
    label_held_gradients,
    local_rows,
    local_shard_module,
    local_shard_shapes,
)
from gaplan.estimate.torch_private import private, private_module
from gaplan.estimate.trace import TraceHelper, enter_trace_modes, lora_assumption
from gaplan.workload.spec import ADAMW_IMPLEMENTATIONS

if TYPE_CHECKING:
    from torch import nn

    from gaplan.workload.build import Workload, WorkloadSpec

MICRO_STEPS = 2  # traced per step: the second sees what the first left (held gradients), as every later one does
FULL_DEPTH_MAX = 8  # a stack of at most this many blocks is traced whole
TRACE_DEPTHS = (3, 4)  # depths a deeper uniform stack is traced at, then extrapolated

# FSDPMemTracker's reference types -> the names gaplan reports (TracedRow.detail).
FSDP_CATEGORY_OF = {
    "Sharded Param": "sharded_parameters", "Unsharded Param": "unsharded_parameters", "Buffer": "buffers",
    "Sharded Grad": "sharded_gradients", "Unsharded Grad": "unsharded_gradients", "OptState": "optimizer_states",
    "Activation": "activations", "Inputs": "inputs", "Temp": "temporaries", "All Gather": "all_gather",
    "Reduce Scatter": "reduce_scatter",
}
FSDP_CATEGORIES = tuple(FSDP_CATEGORY_OF.values())
# ... grouped into gaplan's breakdown categories.
GROUPS = {
    "parameters": ("sharded_parameters", "unsharded_parameters", "buffers"),
    "gradients": ("sharded_gradients", "unsharded_gradients"),
    "optimizer_states": ("optimizer_states",),
    "activations": ("activations", "inputs"),
    "other": ("temporaries", "all_gather", "reduce_scatter"),
}
# With --cpu-offload these live in host memory (CPUOffloadPolicy): the device holds the rest.
OFFLOADED = ("sharded_parameters", "sharded_gradients", "optimizer_states")


def check_world_size(spec: WorkloadSpec, world_size: int) -> None:
    """A sharded estimate needs two ranks or more; a replicated one any positive number."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise OptionError(f"world_size must be a positive integer (got {world_size})", "world_size")
    if spec.parallel == "fsdp" and world_size < 2:
        raise OptionError("parallel fsdp shards the model over ranks: give world_size 2 or more "
                          "(one rank holds everything: use parallel ddp)", "parallel", "world_size")


def sharded_static_bytes(model: nn.Module, optimizer: str, world_size: int) -> int:
    """Rank 0's sharded weights, gradients and optimizer states (AdamW: two per parameter), plus the buffers."""
    weights = grads = 0
    for param in model.parameters():
        rows = param.shape[0] if param.dim() else 1
        nbytes = local_rows(rows, world_size) * (param.numel() // max(rows, 1)) * param.element_size()
        weights += nbytes
        grads += nbytes if param.requires_grad else 0
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return weights + grads + (2 * grads if optimizer in ADAMW_IMPLEMENTATIONS else 0) + buffers


@contextlib.contextmanager
def fake_process_group(world_size: int) -> Iterator[Any]:
    """A fake ``world_size``-rank process group with this process as rank 0, and a cpu device mesh over it."""
    import torch.distributed as dist

    if not dist.is_available():
        raise GaplanError("the sharded estimate needs torch.distributed, which this torch build lacks")
    if dist.is_initialized():
        raise GaplanError("the sharded estimate runs its own fake process group: run it outside torchrun "
                          "(or any initialized process group)")
    store = private("torch.testing._internal.distributed.fake_pg", "FakeStore")()
    init_device_mesh = private("torch.distributed.device_mesh", "init_device_mesh")
    dist.init_process_group("fake", rank=0, world_size=world_size, store=store)
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()


class ShardedTraceHelper(TraceHelper):
    """:class:`TraceHelper`, and pinned host memory (``CPUOffloadPolicy`` pins the shards) standing as itself.

    Fake tensors cannot be pinned; host memory is not what the device holds, so nothing is lost.
    """

    def dispatch(self, func, args, kwargs):
        import torch

        if func is torch.ops.aten._pin_memory.default:
            return args[0]
        if func is torch.ops.aten.is_pinned.default:
            return True
        return super().dispatch(func, args, kwargs)


@dataclasses.dataclass
class _Copy:
    """One sharded copy of the model (at one depth), its optimizer and its fake batches."""

    depth: int
    workload: Workload  # model sharded, optimizer over the shards, fake batches, device cpu
    graph: GraphCount = dataclasses.field(default_factory=GraphCount)  # of a micro-step's autograd graph


class ShardedTracer:
    """The sharded counterpart of :class:`gaplan.estimate.trace.Tracer`: the same rows, one rank of ``world_size``.

    The edge search (:func:`gaplan.estimate.edge.find_edge`) drives either. A ``micro-steps`` row is
    the FSDPMemTracker peak of two accumulated micro-steps, a ``optimizer-step`` row the step on the
    local shards; a ``step`` row is the larger (the two phases never overlap). Rows carry FSDP's own
    categories in ``detail``.
    """

    def __init__(self, spec: WorkloadSpec, device_kind: str, world_size: int, threads: int | None = None) -> None:
        check_world_size(spec, world_size)
        self.spec = spec
        self.world_size = world_size
        self.device = DeviceModel(device_kind, threads)
        self.rows: list[TracedRow] = []
        self._stack = contextlib.ExitStack()
        self._copies: list[_Copy] = []
        self._optimizer_row: TracedRow | None = None
        self._shard_shapes: dict[int, tuple[list[tuple], list[tuple]]] = {}
        self.workload: Workload  # the full-depth model on the meta device (parameter count, task, sequence length)
        self.blocks = 0  # transformer blocks in the full model
        self.depths: tuple[int, ...] = ()
        # the estimate's plan has one micro-step (no accumulation) and this is its traced step (estimator.one_micro_step)
        self.one_micro_step_plan: TracedRow | None = None
        self.allocators = None  # on cuda: the caching allocator replayed through each trace (gaplan.estimate.allocator)

    # -- setting up ------------------------------------------------------------------------------

    def __enter__(self) -> ShardedTracer:
        try:
            self._enter()
        except BaseException:
            self._stack.close()
            raise
        return self

    def _enter(self) -> None:
        import torch

        from gaplan.parallel.fsdp import find_blocks, shard_model
        from gaplan.workload.build import build_workload, model_source_kind

        private_module("torch.distributed._tools.fsdp2_mem_tracker")  # fail early, in one line, when torch lacks it
        mesh = self._stack.enter_context(fake_process_group(self.world_size))
        scope = torch.device("meta") if model_source_kind(self.spec.model) == "function" else contextlib.nullcontext()
        with scope:
            meta = build_workload(self.spec, "meta")
        self.workload = dataclasses.replace(meta, device=torch.device("cpu"))
        blocks = find_blocks(meta.model)
        self.blocks = len(blocks)
        stack = uniform_stack(meta.model, blocks)
        # A selective checkpointing (every:K, layers:N) differs block to block, so no line through two depths
        # draws it: such a model is traced whole.
        whole = stack is None or self.blocks <= FULL_DEPTH_MAX or self.spec.grad_checkpointing.selective
        self.depths = (self.blocks,) if whole else TRACE_DEPTHS
        # Copies and sharding on meta, outside the fake mode (a deep copy under it would copy fake tensors).
        models = {depth: copy.deepcopy(meta.model) if depth == self.blocks else truncated_copy(meta.model, stack, depth)
                  for depth in self.depths}
        self._shard_shapes = {depth: local_shard_shapes(model, self.world_size) for depth, model in models.items()}
        with fake_tensor_errors(self.spec):
            for model in models.values():
                shard_model(model, dtype=self.spec.dtype, cpu_offload=self.spec.cpu_offload, mesh=mesh)
        self.mode = fake_tensor_mode()
        self.helper = ShardedTraceHelper()
        self.allocators = enter_trace_modes(self._stack, self.device, self.mode, self.helper, self.spec)
        for depth, model in models.items():
            self._copies.append(_Copy(depth, self._materialize(meta, model)))

    def _materialize(self, meta: Workload, model: nn.Module) -> Workload:
        """A sharded ``model`` (on meta) with fake shards, its optimizer made after sharding and its states filled."""
        import torch

        with fake_tensor_errors(self.spec):
            model.to_empty(device="cpu")
        optimizer = self.device.make_optimizer(model, self.spec)
        fill_optimizer_state(optimizer, self.spec.optimizer)
        return dataclasses.replace(meta, model=model, optimizer=optimizer, make_batch=fake_batch_maker(meta, self.mode),
                                   device=torch.device("cpu"))

    def __exit__(self, *exc: object) -> None:
        self._copies.clear()
        self._stack.close()

    # -- traces ----------------------------------------------------------------------------------

    def _trace_copy(self, copy_: _Copy, micro_batch: int, accumulated: bool = True) -> dict[str, int]:
        """FSDPMemTracker's peak of the accumulated micro-steps on one sharded copy, by FSDP category (of the one
        micro-step of a step without accumulation when not ``accumulated``: nothing held from an earlier one)."""
        from gaplan.parallel.fsdp import no_sync_for
        from gaplan.training.step import accumulate_gradients

        tracker_class = private("torch.distributed._tools.fsdp2_mem_tracker", "FSDPMemTracker")
        workload = copy_.workload
        workload.optimizer.zero_grad(set_to_none=True)
        batches = [workload.make_batch(micro_batch) for _ in range(MICRO_STEPS if accumulated else 1)]
        tracker = tracker_class(workload.model, workload.optimizer)
        tracker.track_inputs(tuple(batches))

        def raw_loss(model, batch):
            # FSDPMemTracker refuses a second forward of the root unless its module stats are reset (its peak stays);
            # the first micro-step's held gradients are re-labelled: it counts them as backward temporaries.
            tracker.reset_mod_stats()
            label_held_gradients(tracker, workload.model)
            return copy_.graph.counted(workload.raw_loss(model, batch))

        with fake_tensor_errors(self.spec), tracker:
            accumulate_gradients(workload.model, batches, raw_loss, workload.task, workload.loss_is_scaled_for_ga,
                                 workload.forward_context, no_sync=no_sync_for(workload.model, self.spec.grad_sync))
        workload.optimizer.zero_grad(set_to_none=True)
        del batches
        return {**by_category(tracker.get_tracker_snapshot("peak"), FSDP_CATEGORY_OF), **self._segments()}

    def _segments(self) -> dict[str, int]:
        """The last trace's segments beyond its live blocks (gaplan.estimate.allocator), on cuda."""
        if self.allocators is None:
            return {}
        return {"unfilled_segments": self.allocators.unfilled(), "cached_segments": self.allocators.cached()}

    def micro_steps(self, micro_batch: int, accumulated: bool = True) -> TracedRow:
        traced = {c.depth: self._trace_copy(c, micro_batch, accumulated) for c in self._copies}
        row = self._row(micro_batch, "micro-steps", extrapolate(traced, self.blocks), unsegmented(traced))
        return self._add(dataclasses.replace(row, accumulated=accumulated))

    def optimizer_step(self) -> TracedRow:
        if self._optimizer_row is None:
            self._optimizer_row = self._add(self._row(0, "optimizer-step", *self._trace_optimizer_step()))
        return self._optimizer_row

    def _trace_optimizer_step(self) -> tuple[dict[str, int], dict[str, int]]:
        """The optimizer step on tensors shaped like rank 0's local shards (and the replicated buffers), at the
        traced depths, extrapolated (every block adds the same shards, gradients, states and step temporaries)."""
        from gaplan.training.breakdown import measure_breakdown

        traced = {}
        for depth, shapes in self._shard_shapes.items():
            holder = local_shard_module(shapes)
            optimizer = self.device.make_optimizer(holder, self.spec)
            fill_optimizer_state(optimizer, self.spec.optimizer)
            for param in holder.parameters():  # the step's gradients, as after the last micro-step's reduce-scatter
                if param.requires_grad:
                    param.grad = param.new_zeros(param.shape)
            breakdown = measure_breakdown(dataclasses.replace(self.workload, model=holder, optimizer=optimizer), 0,
                                          micro_steps=0)
            # measure_breakdown groups MemTracker's types into gaplan's; on the shards they are the sharded ones.
            traced[depth] = {"sharded_parameters": breakdown.parameters, "sharded_gradients": breakdown.gradients,
                             "optimizer_states": breakdown.optimizer_states, "activations": breakdown.activations,
                             "temporaries": breakdown.other, **self._segments()}
        return extrapolate(traced, self.blocks), unsegmented(traced)

    def step(self, micro_batch: int, accumulated: bool = True) -> TracedRow:
        """The whole step at ``micro_batch``; not ``accumulated``: a step of one micro-step (no accumulation)."""
        return self.composed_step(self.micro_steps(micro_batch, accumulated), self.optimizer_step())

    def composed_step(self, micro_steps: TracedRow, optimizer_step: TracedRow) -> TracedRow:
        larger = max(micro_steps, optimizer_step, key=lambda r: r.tracked_total)
        return self._add(dataclasses.replace(larger, micro_batch=micro_steps.micro_batch, phase="step", composed=True,
                                             accumulated=micro_steps.accumulated))

    def last_step(self, micro_batch: int) -> TracedRow:
        return next(r for r in reversed(self.rows)
                    if r.phase == "step" and r.micro_batch == micro_batch and r.accumulated)

    def _add(self, row: TracedRow) -> TracedRow:
        self.rows.append(row)
        return row

    def _row(self, micro_batch: int, phase: str, detail: dict[str, int],
             segments: dict[str, int] | None = None) -> TracedRow:
        """A row of what the device holds: with --cpu-offload on a GPU, the offloaded categories are host memory;
        ``segments``: what the allocator's segments held beyond the live blocks (:func:`unsegmented`), in ``other``."""
        detail = {name: int(detail.get(name, 0)) for name in FSDP_CATEGORIES}
        host = 0
        if self.spec.cpu_offload and self.device.kind == "cuda":
            host = sum(detail[name] for name in OFFLOADED)
            detail.update(dict.fromkeys(OFFLOADED, 0))
        groups = {group: sum(detail[name] for name in names) for group, names in GROUPS.items()}
        unfilled, cached = (segments or {}).get("unfilled_segments", 0), (segments or {}).get("cached_segments", 0)
        groups["other"] += unfilled
        total = sum(groups.values())
        return TracedRow(micro_batch=micro_batch, phase=phase, **groups, tracked_total=total,
                         peak_bytes=total + self.overhead(), detail={**detail, "host_bytes": host},
                         unfilled_segment_bytes=unfilled, cached_segment_bytes=cached)

    # -- what the device adds, and what was assumed ----------------------------------------------

    def overhead(self) -> int:
        # FSDPMemTracker counts no operator workspace (measure_breakdown's), so on CPU the largest product's MKL
        # buffer is taken as live at every peak: an upper bound, by up to that buffer.
        panel = self.helper.gemm_panel_bytes if self.device.kind == "cpu" else 0
        return self.device.overhead(self.graph_nodes()) + panel + self.nccl_bytes()

    def nccl_bytes(self) -> int:
        """NCCL's buffers on a rank, outside the allocator (gaplan.devices.reserve); none on CPU (gloo)."""
        return nccl_buffer_bytes(self.world_size) if self.device.kind == "cuda" else 0

    def graph_nodes(self) -> int:
        """A micro-step's autograd nodes at full depth, on the line through the traced depths (0 before a trace)."""
        if not all(c.graph.nodes for c in self._copies):
            return 0
        return extrapolate({c.depth: {"nodes": c.graph.nodes} for c in self._copies}, self.blocks)["nodes"]

    def final_rows(self) -> list[TracedRow]:
        overhead = self.overhead()
        return [dataclasses.replace(r, peak_bytes=r.tracked_total + overhead) for r in self.rows]

    def static_bytes(self) -> int:
        """Rank 0's sharded weights, gradients and optimizer states (and buffers); on the host with --cpu-offload."""
        return sharded_static_bytes(self.workload.model, self.spec.optimizer, self.world_size)

    def extra(self) -> dict[str, Any]:
        data: dict[str, Any] = {"attention_ops": sorted(self.helper.attention_ops), "parallel": "fsdp",
                                "world_size": self.world_size, "blocks": self.blocks, "traced_depths": list(self.depths),
                                "grad_sync": self.spec.grad_sync, "cpu_offload": self.spec.cpu_offload}
        data.update(self.device.extra(self.helper.gemm_panel_bytes, self.graph_nodes()))
        step = next((r for r in self.final_rows() if r.phase == "optimizer-step"), None)
        if step is not None:
            data["optimizer_step_peak_bytes"] = step.peak_bytes
        return data

    def assumptions(self) -> list[Assumption]:
        step = self._optimizer_row
        unfilled = max((r.unfilled_segment_bytes for r in self.rows), default=0) if self.allocators else None
        notes = trace_assumptions(self.spec, self.device, self.helper, self.static_bytes(),
                                  step.tracked_total if step is not None else None, self.graph_nodes(),
                                  panel_at_every_peak=True, sharded=True, unfilled_segment_bytes=unfilled)
        held = max((r.detail.get("unsharded_gradients", 0) for r in self.rows if r.accumulated), default=0)
        single = self.one_micro_step_plan
        notes += sharded_assumptions(self.spec, self.device.kind, self.world_size, self.blocks, self.depths,
                                     held_gradient_bytes=held,
                                     one_micro_step_batch=single.micro_batch if single is not None else None)
        if self.nccl_bytes():
            notes.append(nccl_buffers(self.nccl_bytes(), self.world_size))
        return notes + ([lora_assumption(self.spec, self.workload.model)] if self.spec.lora else [])
