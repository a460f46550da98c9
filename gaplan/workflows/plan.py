"""``gaplan plan``'s work: estimate every layout of :mod:`gaplan.plan.layouts` for one model, and pick one.

Each layout is one :func:`gaplan.estimate.estimate` (fake tensors, nothing allocated) with the
layout's settings on the user's workload; the ranking and the pick are :mod:`gaplan.plan.layouts`'s
(no torch there). Nothing is printed: ``on_result`` is called after each layout, for progress.

With ``grad_sync="auto"`` an FSDP layout is estimated with gradients reduce-scattered on the last
micro-step (the least traffic) and, when that does not fit or leaves a smaller micro-batch than one
rank's share, on every micro-step too (the whole model's unsharded gradients are then never held);
the one with fewer accumulation steps is kept, the last-micro-step one on a tie (the other's B* and split
are kept in ``extra["other_grad_sync"]``, so the report can say what the choice trades).

A layout's peak is traced at the plan's micro-batch (one more trace when it is below B*): that is what the
plan runs at; the peak at B* is beside it. With ``margin`` the estimate is made against the limit less that
fraction, as ``gaplan probe --margin`` does.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from gaplan.core.checkpointing import OFF, ON
from gaplan.core.errors import DoesNotFit, GaplanError, one_line
from gaplan.core.options import OptionError
from gaplan.plan.layouts import (
    MACHINERY,
    Layout,
    LayoutComparison,
    LayoutResult,
    check_nodes,
    layouts_for,
    probe_command,
    sort_key,
)
from gaplan.plan.split import default_search_cap, make_plan
from gaplan.workload.spec import WorkloadSpec

GRAD_SYNC_CHOICES = ("auto", "last", "every")


def compare_layouts(
    spec: WorkloadSpec,
    *,
    world_size: int,
    effective_batch: int,
    nodes: int = 1,
    memory_limit: int | None = None,
    target: str | None = None,
    device_kind: str = "cuda",
    dtype: str = "bf16",
    machinery: Sequence[str] = MACHINERY,
    grad_sync: str = "auto",
    threads: int | None = None,
    search_cap: int | None = None,
    margin: float = 0.0,
    on_result: Callable[[LayoutResult], None] | None = None,
) -> LayoutComparison:
    """Estimate each layout of ``spec``'s model (its parallel, precision and checkpointing settings are the
    layout's; the rest -- model, task, sequence length, optimizer -- is ``spec``'s) and rank them.

    ``margin`` (a fraction in [0, 1)) is kept free of the limit (a target's memory, or ``memory_limit``).

    Raises:
        GaplanError: bad input (world size, effective batch, target, grad_sync, margin...), before any trace.
    """
    from gaplan.estimate import estimate
    from gaplan.estimate.budget import check_device_kind, check_margin, margin_budget
    from gaplan.workload.build import model_shape

    check_device_kind(device_kind)
    if grad_sync not in GRAD_SYNC_CHOICES:
        raise OptionError(f"grad_sync must be one of {', '.join(GRAD_SYNC_CHOICES)} (got {grad_sync!r})", "grad_sync")
    check_nodes(world_size, nodes)
    make_plan(effective_batch, 1, world_size)  # a bad effective batch, before any work
    check_margin(margin)
    requested_limit = memory_limit
    the_budget, memory_limit = margin_budget(device_kind, memory_limit, target, margin)
    candidates = layouts_for(world_size, dtype, machinery, device_kind)
    spec = dataclasses.replace(spec, parallel="ddp", cpu_offload=False, grad_sync="last").validate()
    _, seq_len, _, _ = model_shape(spec) if not _is_function(spec) else (None, spec.seq_len, None, None)
    cap = search_cap or default_search_cap(effective_batch, world_size)
    started = time.perf_counter()
    results: list[LayoutResult] = []
    param_count: int | None = None

    def run(layout: Layout) -> LayoutResult:
        nonlocal param_count
        try:
            layout_spec = spec_of(spec, layout)
            result = estimate(layout_spec, memory_limit=memory_limit, target=target, effective_batch=effective_batch,
                              device_kind=device_kind, search_cap=cap, threads=threads, world_size=world_size,
                              nodes=nodes, trace_plan=True)
        except DoesNotFit as exc:
            return LayoutResult(layout, "", fits=False, world_size=world_size, needed_bytes=exc.needed_bytes,
                                note=one_line(exc))
        except GaplanError as exc:  # the layout cannot be estimated for this model (no blocks to shard, ...)
            return LayoutResult(layout, "", fits=None, world_size=world_size, note=one_line(exc),
                                extra={"error": True})
        param_count = result.param_count
        plan = result.plan
        check = probe_command(layout_spec.to_dict(), effective_batch, world_size, device_kind=device_kind,
                              target=target, memory_limit=requested_limit, margin=margin)
        return LayoutResult(
            layout, "", fits=True, peak_bytes=result.plan_peak_bytes or result.peak_bytes,
            edge_peak_bytes=result.peak_bytes, max_micro_batch=result.max_micro_batch,
            micro_batch=plan["micro_batch"], grad_accum_steps=plan["grad_accum_steps"], world_size=world_size,
            command=result.launch_command, check_command=check,
            extra={"capped": result.capped, "static_bytes": result.static_bytes, "trace_seconds": round(result.trace_seconds, 3),
                   "host_bytes": max((r.detail.get("host_bytes", 0) for r in result.rows), default=0)})

    for layout, precision, note in candidates:
        if note:
            result = LayoutResult(layout, "", fits=None, world_size=world_size, note=note)
        else:
            result = _best_grad_sync(layout, run, grad_sync, effective_batch // world_size)
        result.precision_label = precision.label_for(dtype)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return LayoutComparison(
        model=spec.model, param_count=param_count, seq_len=seq_len, device_kind=device_kind,
        target=the_budget.target.name if the_budget.target else None, memory_limit_bytes=int(the_budget.limit_bytes),
        usable_bytes=int(the_budget.usable_bytes), world_size=world_size, nodes=nodes, effective_batch=effective_batch,
        dtype=dtype, results=results, seconds=time.perf_counter() - started, margin=float(margin))


def spec_of(spec: WorkloadSpec, layout: Layout) -> WorkloadSpec:
    """``spec`` trained the ``layout``'s way (its parallel, precision, checkpointing, offload and gradient sync)."""
    settings = dict(parallel=layout.parallel, grad_checkpointing=ON if layout.grad_checkpointing else OFF,
                    cpu_offload=layout.cpu_offload, weights_dtype=layout.weights_dtype, dtype=layout.dtype,
                    grad_sync=layout.grad_sync)
    return dataclasses.replace(spec, **settings).validate()


def _best_grad_sync(layout: Layout, run: Callable[[Layout], LayoutResult], grad_sync: str, share: int) -> LayoutResult:
    """The layout's result with the better gradient sync (``auto``), or the one asked for."""
    if layout.parallel != "fsdp":
        return run(layout)
    if grad_sync != "auto":
        return run(dataclasses.replace(layout, grad_sync=grad_sync))
    last = run(dataclasses.replace(layout, grad_sync="last"))
    if last.fits is None or (last.fits and (last.max_micro_batch or 0) >= share):
        return last
    every = run(dataclasses.replace(layout, grad_sync="every"))
    best = min((last, every), key=sort_key)
    other = every if best is last else last
    if other.fits:
        best.note = "; ".join(filter(None, [best.note, f"grad-sync {other.layout.grad_sync}: B* {other.max_micro_batch}"]))
    best.extra["other_grad_sync"] = {"grad_sync": other.layout.grad_sync, "fits": other.fits,
                                     "max_micro_batch": other.max_micro_batch,
                                     "grad_accum_steps": other.grad_accum_steps}
    return best


def _is_function(spec: WorkloadSpec) -> bool:
    from gaplan.workload.spec import model_source_kind

    return model_source_kind(spec.model) == "function"
