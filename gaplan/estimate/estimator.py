"""The entry points: :func:`estimate` (search the edge against a budget, plan), :func:`trace_steps` (peaks only)
and :func:`predicted_peak` (one micro-batch's peak per rank)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gaplan.core.constants import SEARCH_CAP
from gaplan.core.errors import DoesNotFit, GaplanError
from gaplan.core.options import check_positive_ints
from gaplan.core.units import format_bytes, parse_bytes
from gaplan.estimate.budget import budget, check_device_kind
from gaplan.estimate.edge import check_sizes, find_edge
from gaplan.estimate.result import EstimateResult, TracedRow
from gaplan.estimate.sharded import ShardedTracer, check_world_size
from gaplan.estimate.trace import Tracer
from gaplan.estimate.trust import model_family, trust_of
from gaplan.plan.layouts import check_nodes, launch_command
from gaplan.plan.split import make_plan
from gaplan.workload.spec import ADAMW_IMPLEMENTATIONS

if TYPE_CHECKING:
    from gaplan.workload.build import WorkloadSpec


def estimate(
    spec: WorkloadSpec,
    memory_limit: int | None = None,
    target: str | None = None,
    effective_batch: int = 256,
    sizes: Sequence[int] | None = None,
    device_kind: str = "cuda",
    search_cap: int = SEARCH_CAP,
    threads: int | None = None,
    world_size: int = 1,
    nodes: int = 1,
    trace_plan: bool = False,
) -> EstimateResult:
    """Estimate the largest micro-batch of ``spec`` that fits, and plan ``effective_batch``, without allocating.

    Args:
        spec: the workload; its dtype ``bf16``/``fp16`` means autocast over fp32 weights, as in training.
        memory_limit: bytes for PyTorch's allocator (as ``gaplan probe --memory-limit``); with a
            target, the smaller of the two.
        target: a GPU of :func:`gaplan.estimate.list_targets` (default ``h100-80gb`` when no limit is given).
        effective_batch: samples per optimizer step, split by the plan.
        sizes: the micro-batch sizes whose micro-steps are traced to draw the memory line (default 1, 2).
        device_kind: ``cuda`` (model CUDA's allocator, optimizer, autocast and reserve) or ``cpu`` (model
            a CPU process, to compare with ``gaplan probe --device cpu``; no target).
        search_cap: the largest micro-batch considered.
        threads: CPU threads of the process modelled (``device_kind="cpu"``; default: this process's).
        world_size: ranks the effective batch is split over. With ``spec.parallel == "fsdp"`` (at least 2)
            one rank of a ``world_size``-way FSDP2 step is traced (:mod:`gaplan.estimate.sharded`); with
            ``ddp`` above 1, DistributedDataParallel's gradient buckets are added. Every peak is per rank.
        nodes: machines the ranks are spread over (``world_size`` divides evenly), for the launch command.
        trace_plan: also trace the whole step at the plan's micro-batch when it is below B* (one more trace),
            so that ``plan_peak_bytes`` is the peak the plan runs at, not B*'s.

    Raises:
        GaplanError: bad input (unknown target, no config.json, sequence longer than the positions...),
            or a torch without the internals the trace needs.
        DoesNotFit: even micro-batch 1 does not fit.
    """
    spec = spec.validate()
    check_device_kind(device_kind)
    if memory_limit is not None:
        memory_limit = parse_bytes(memory_limit)
    check_positive_ints(threads=threads)
    if not isinstance(search_cap, int) or search_cap < 1:
        raise GaplanError(f"the search cap must be a positive integer (got {search_cap})")
    sizes = check_sizes(sizes)
    check_world_size(spec, world_size)
    check_nodes(world_size, nodes)
    make_plan(effective_batch, 1, world_size)  # reject a bad effective batch before any work
    the_budget = budget(device_kind, memory_limit, target)

    started = time.perf_counter()
    with make_tracer(spec, device_kind, threads, world_size) as tracer:
        try:
            edge, capped, line = find_edge(tracer, the_budget, sizes, search_cap, spec)
        except DoesNotFit as exc:
            raise DoesNotFit(f"{exc}{does_not_fit_hint(spec, tracer, world_size)}", exc.needed_bytes) from None
        plan = make_plan(effective_batch, edge, world_size)
        single = one_micro_step(tracer, spec, effective_batch // world_size, edge, line, the_budget.usable_bytes,
                                search_cap)
        if single is not None:  # no accumulation: nothing held from an earlier micro-step
            plan = make_plan(effective_batch, max(edge, single.micro_batch), world_size)
        accumulated = plan.grad_accum_steps > 1 or single is None
        if trace_plan and step_peak(tracer.rows, plan.micro_batch, accumulated) is None:
            tracer.step(plan.micro_batch)
        rows = tracer.final_rows()
        peak = step_peak(rows, edge)
        assert peak is not None  # the search traced the whole step at B*
        workload = tracer.workload
        return EstimateResult(
            workload=spec.to_dict(), device_kind=device_kind,
            target=the_budget.target.name if the_budget.target else None,
            memory_limit_bytes=int(the_budget.limit_bytes), usable_bytes=int(the_budget.usable_bytes), rows=rows,
            line=(float(line[0]), float(line[1])), max_micro_batch=edge, capped=capped, peak_bytes=peak,
            plan=plan.to_dict(), assumptions=[the_budget.assumption, *tracer.assumptions()],
            trace_seconds=time.perf_counter() - started, param_count=workload.param_count,
            static_bytes=tracer.static_bytes(), task=workload.task, seq_len=workload.seq_len,
            trace_count=sum(not r.composed for r in rows), extra=tracer.extra(), world_size=world_size, nodes=nodes,
            plan_peak_bytes=step_peak(rows, plan.micro_batch, accumulated),
            trust=trust_of(model_family(workload.model), spec.to_dict(), device_kind, world_size),
            launch_command=launch_command(spec.to_dict(), plan.micro_batch, effective_batch, world_size, nodes,
                                          "cpu" if device_kind == "cpu" else None))


def step_peak(rows: Sequence[TracedRow], micro_batch: int, accumulated: bool = True) -> int | None:
    """The last traced whole-step peak at ``micro_batch`` (of an accumulated step, or of a step of one micro-step when
    not ``accumulated``), or None when that size's step was not traced."""
    return next((r.peak_bytes for r in reversed(rows)
                 if r.phase == "step" and r.micro_batch == micro_batch and r.accumulated == accumulated), None)


def one_micro_step(tracer, spec: WorkloadSpec, share: int, edge: int, line: tuple[float, float], usable: int,
                   cap: int) -> TracedRow | None:
    """Under FSDP with ``--grad-sync last``, the step of one micro-step of ``share`` samples (a rank's whole share of
    the effective batch) traced alone, when it fits; else None.

    B* is searched with two accumulated micro-steps, the first holding the whole model's unsharded gradients into
    the second. A plan without accumulation has no earlier micro-step: it holds none, so its peak is traced with one
    micro-step, and it may fit at a share above B*. Above B*, it is traced only when the line less the held gradients
    predicts a fit.
    """
    if spec.parallel != "fsdp" or spec.grad_sync != "last" or share > cap:
        return None
    if share > edge:
        held = tracer.last_step(edge).detail.get("unsharded_gradients", 0)
        if line[0] + line[1] * share - held + tracer.overhead() > usable:
            return None
    row = tracer.step(share, accumulated=False)
    if row.peak_bytes > usable:
        return None
    tracer.one_micro_step_plan = row
    return row


def make_tracer(spec: WorkloadSpec, device_kind: str, threads: int | None, world_size: int,
                qlora_run=None) -> Tracer | ShardedTracer:
    """One rank's tracer: a W-way FSDP2 rank for ``--parallel fsdp``, else one process (with DDP's buckets above 1 rank)."""
    spec.check_offload(device_kind)
    if spec.parallel == "fsdp":
        return ShardedTracer(spec, device_kind, world_size, threads)
    return Tracer(spec, device_kind, threads, world_size, qlora_run=qlora_run)


def does_not_fit_hint(spec: WorkloadSpec, tracer, world_size: int) -> str:
    """What would make room, appended to the one-line "does not fit"."""
    if spec.parallel != "fsdp":
        return ("; shard it over ranks: --parallel fsdp --world-size N (gaplan plan compares the layouts)"
                if world_size > 1 or spec.optimizer in ADAMW_IMPLEMENTATIONS else "")
    held = max((r.detail.get("unsharded_gradients", 0) for r in tracer.rows), default=0)
    if spec.grad_sync == "last" and held:
        return (f"; {format_bytes(held)} of it are the whole model's unsharded gradients held between micro-steps: "
                "--grad-sync every keeps them sharded")
    options = [o for o, on in (("--grad-checkpointing on", spec.grad_checkpointing), ("--cpu-offload", spec.cpu_offload))
               if not on]
    more = f", {' or '.join(options)}" if options else ""
    return f"; try more ranks (--world-size){more} (gaplan plan compares the layouts)"


def trace_steps(spec: WorkloadSpec, micro_batches: Sequence[int], device_kind: str = "cpu",
                threads: int | None = None, world_size: int = 1, qlora_run=None,
                accumulated: bool = True) -> list[TracedRow]:
    """The estimated peak of one steady-state step at each micro-batch (no search, no budget), per rank.

    Each row is the larger of the micro-steps' and the optimizer step's traced peaks, plus the
    device's overhead: with ``device_kind="cpu"``, what ``gaplan probe --device cpu`` measures as a
    trial's ``peak_bytes`` at that micro-batch. With ``spec.parallel == "fsdp"``, one rank of a
    ``world_size``-way FSDP2 step (what the largest rank of ``gaplan probe --parallel fsdp`` measures);
    ``row.detail`` then has FSDP's categories. ``qlora_run`` (:class:`gaplan.estimate.quantized.QLoRARun`): for
    a QLoRA spec, the bitsandbytes and loop of a run gaplan did not build (a published figure's); None: gaplan's own.
    ``accumulated=False`` (FSDP): a step of one micro-step, which no earlier micro-step's gradients precede.
    """
    spec = spec.validate()
    check_device_kind(device_kind)
    check_world_size(spec, world_size)
    if not micro_batches or not all(isinstance(b, int) and b >= 1 for b in micro_batches):
        raise GaplanError(f"micro-batches must be positive integers (got {list(micro_batches)})")
    if not accumulated and spec.parallel != "fsdp":
        raise GaplanError("accumulated=False is traced for a sharded step (parallel fsdp) only: one device's trace "
                          "holds the gradients, as after an earlier micro-step")
    with make_tracer(spec, device_kind, threads, world_size, qlora_run) as tracer:
        optimizer_step = tracer.optimizer_step()
        for b in micro_batches:
            steps = tracer.micro_steps(b) if accumulated else tracer.micro_steps(b, accumulated=False)
            tracer.composed_step(steps, optimizer_step)
        return [r for r in tracer.final_rows() if r.phase == "step"]


def predicted_peak(spec: WorkloadSpec, micro_batch: int, device_kind: str = "cpu", world_size: int = 1,
                   threads: int | None = None) -> int:
    """The estimated per-rank peak bytes of one steady-state step at ``micro_batch``: ``trace_steps``'s one row.

    For ``spec.parallel == "fsdp"`` and ``device_kind="cpu"``, what the largest rank of a ``world_size``-rank
    FSDP probe trial should measure as its ``peak_bytes``.
    """
    (row,) = trace_steps(spec, [micro_batch], device_kind=device_kind, threads=threads, world_size=world_size)
    return row.peak_bytes
