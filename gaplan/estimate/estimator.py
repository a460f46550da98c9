"""The entry points: :func:`estimate` (search the edge against a budget, plan) and :func:`trace_steps` (peaks only)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gaplan.constants import SEARCH_CAP
from gaplan.errors import GaplanError
from gaplan.estimate.budget import budget, check_device_kind
from gaplan.estimate.edge import check_sizes, find_edge
from gaplan.estimate.result import EstimateResult, TracedRow
from gaplan.estimate.trace import Tracer
from gaplan.plan import make_plan

if TYPE_CHECKING:
    from gaplan.workload import WorkloadSpec


def estimate(
    spec: WorkloadSpec,
    memory_limit: int | None = None,
    target: str | None = None,
    effective_batch: int = 256,
    sizes: Sequence[int] | None = None,
    device_kind: str = "cuda",
    search_cap: int = SEARCH_CAP,
    threads: int | None = None,
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

    Raises:
        GaplanError: bad input (unknown target, no config.json, sequence longer than the positions...),
            or a torch without the internals the trace needs.
        DoesNotFit: even micro-batch 1 does not fit.
    """
    spec = spec.validate()
    check_device_kind(device_kind)
    if memory_limit is not None and (not isinstance(memory_limit, int) or memory_limit <= 0):
        raise GaplanError(f"--memory-limit must be larger than zero (got {memory_limit})")
    if not isinstance(search_cap, int) or search_cap < 1:
        raise GaplanError(f"the search cap must be a positive integer (got {search_cap})")
    sizes = check_sizes(sizes)
    make_plan(effective_batch, 1)  # reject a bad effective batch before any work
    the_budget = budget(device_kind, memory_limit, target)

    started = time.perf_counter()
    with Tracer(spec, device_kind, threads) as tracer:
        edge, capped, line = find_edge(tracer, the_budget.usable_bytes, sizes, search_cap, spec)
        rows = tracer.final_rows()
        peak = next(r.peak_bytes for r in reversed(rows) if r.phase == "step" and r.micro_batch == edge)
        workload = tracer.workload
        return EstimateResult(
            workload=spec.to_dict(), device_kind=device_kind,
            target=the_budget.target.name if the_budget.target else None,
            memory_limit_bytes=int(the_budget.limit_bytes), usable_bytes=int(the_budget.usable_bytes), rows=rows,
            line=(float(line[0]), float(line[1])), max_micro_batch=edge, capped=capped, peak_bytes=peak,
            plan=make_plan(effective_batch, edge).to_dict(), assumptions=[the_budget.assumption, *tracer.assumptions()],
            trace_seconds=time.perf_counter() - started, param_count=workload.param_count,
            static_bytes=workload.static_bytes(), task=workload.task, seq_len=workload.seq_len,
            trace_count=sum(not r.composed for r in rows), extra=tracer.extra())


def trace_steps(spec: WorkloadSpec, micro_batches: Sequence[int], device_kind: str = "cpu",
                threads: int | None = None) -> list[TracedRow]:
    """The estimated peak of one steady-state step at each micro-batch (no search, no budget).

    Each row is the larger of the micro-steps' and the optimizer step's traced peaks, plus the
    device's overhead: with ``device_kind="cpu"``, what ``gaplan probe --device cpu`` measures as a
    trial's ``peak_bytes`` at that micro-batch.
    """
    spec = spec.validate()
    check_device_kind(device_kind)
    if not micro_batches or not all(isinstance(b, int) and b >= 1 for b in micro_batches):
        raise GaplanError(f"micro-batches must be positive integers (got {list(micro_batches)})")
    with Tracer(spec, device_kind, threads) as tracer:
        optimizer_step = tracer.optimizer_step()
        for b in micro_batches:
            tracer.composed_step(tracer.micro_steps(b), optimizer_step)
        return [r for r in tracer.final_rows() if r.phase == "step"]
