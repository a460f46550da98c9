"""``gaplan plan`` on one device: estimate each lever row of :mod:`gaplan.plan.levers`, model its time, and pick.

Each row is the user's workload with the row's levers set (optimizer, loss, checkpointing), estimated by
:func:`gaplan.estimate.estimate` (fake tensors, nothing allocated) for B*, the split of ``E`` and the peak at the
plan's micro-batch; its time per optimizer step is :func:`gaplan.plan.lever_cost.step_cost`'s. With
:func:`measure_levers` each row that fits is then probed and timed on this machine, in rounds, so each rate has the
bench's 95% interval. The pick is :func:`gaplan.plan.lever_pick.pick`'s. Nothing is printed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from gaplan.core.errors import DoesNotFit, GaplanError, one_line
from gaplan.plan.layouts import LayoutComparison
from gaplan.plan.lever_cost import RATES, CostInputs, step_cost
from gaplan.plan.lever_pick import LeverComparison, LeverResult
from gaplan.plan.levers import (
    Base,
    cuda_only,
    lever_rows,
    not_compared,
    parse_levers,
    row_recompute,
    row_settings,
)
from gaplan.plan.split import default_search_cap, make_plan
from gaplan.workload.spec import DTYPE_BYTES, WorkloadSpec

# An offloading row's traced host copies (gaplan.estimate.trace.Tracer.extra): bytes a micro-step, bytes a sample.
HOST_BYTES = ("host_bytes_per_micro_step", "host_bytes_per_sample")


def compare_levers(
    spec: WorkloadSpec,
    *,
    effective_batch: int,
    levers: str | Sequence[str] | None = None,
    memory_limit: int | None = None,
    target: str | None = None,
    device_kind: str = "cuda",
    threads: int | None = None,
    margin: float = 0.0,
    on_result: Callable[[LeverResult], None] | None = None,
    known_base: LeverResult | None = None,
) -> LeverComparison:
    """Estimate each lever row of ``spec`` (``levers``: ``--levers``' names, default the non-optimizer ones) on one
    device and model its time per optimizer step.

    ``known_base``: the base row already estimated (the layout table's DDP row of the same workload), not traced again.

    Raises:
        GaplanError: bad input (an unknown lever, effective batch, target, margin), before any trace.
    """
    from gaplan.estimate import estimate
    from gaplan.estimate.budget import check_device_kind, check_margin, margin_budget

    check_device_kind(device_kind)
    selected = parse_levers(levers)
    make_plan(effective_batch, 1, 1)  # a bad effective batch, before any work
    check_margin(margin)
    spec = spec.validate()
    if spec.parallel != "ddp":
        raise GaplanError("the lever table is for one device: use --parallel ddp (the layouts compare FSDP)")
    the_budget, memory_limit = margin_budget(device_kind, memory_limit, target, margin)
    base = Base(optimizer=spec.optimizer, loss=spec.loss, grad_checkpointing=spec.grad_checkpointing,
                offload_activations=spec.offload_activations, compile=spec.compile)
    started = time.perf_counter()
    inputs = cost_inputs(spec, device_kind)
    cap = default_search_cap(effective_batch, 1)
    results: list[LeverResult] = []
    for row in lever_rows(selected, base, device_kind):
        if not row and known_base is not None and not spec.offload_activations:  # (its host copies: traced here)
            result = dataclasses.replace(known_base, levers=(), model_seconds=_model_seconds(
                inputs, spec, row, base, effective_batch, known_base.grad_accum_steps, known_base.extra))
        else:
            result = _estimate_row(estimate, spec, row, base, inputs, effective_batch=effective_batch,
                                   memory_limit=memory_limit, target=target, device_kind=device_kind, cap=cap,
                                   threads=threads)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return LeverComparison(
        model=spec.model, device_kind=device_kind, target=the_budget.target.name if the_budget.target else None,
        memory_limit_bytes=int(the_budget.limit_bytes), usable_bytes=int(the_budget.usable_bytes),
        effective_batch=effective_batch, base=base, results=results, not_compared=not_compared(selected, base, device_kind),
        cost_source=RATES[device_kind].source, seconds=time.perf_counter() - started, workload=spec.to_dict())


def row_spec(spec: WorkloadSpec, row: Sequence[str]) -> WorkloadSpec:
    """``spec`` with the row's levers set (checked: a lever that does not apply raises GaplanError)."""
    return dataclasses.replace(spec, **row_settings(row)).validate()


def _estimate_row(estimate, spec: WorkloadSpec, row: tuple[str, ...], base: Base, inputs: CostInputs | None, *,
                  effective_batch: int, memory_limit: int | None, target: str | None, device_kind: str, cap: int,
                  threads: int | None) -> LeverResult:
    """One row estimated and its time modelled; a row that cannot be estimated says why in its note."""
    why_not_here = cuda_only(row) if device_kind == "cpu" else ""
    note = f"estimate only: {why_not_here} (not run on the CPU)" if why_not_here else ""
    if "compile" in row:  # its memory is traced; its speed is not modelled
        note = "; ".join(filter(None, [note, "time (model): the eager kernels'"]))
    try:
        the_spec = row_spec(spec, row)
        result = estimate(the_spec, memory_limit=memory_limit, target=target, effective_batch=effective_batch,
                          device_kind=device_kind, search_cap=cap, threads=threads, trace_plan=True)
    except DoesNotFit as exc:
        return LeverResult(row, fits=False, needed_bytes=exc.needed_bytes, note=one_line(exc))
    except GaplanError as exc:  # the lever does not apply to this model (a chunked loss on a classifier, ...)
        return LeverResult(row, fits=None, note=one_line(exc))
    plan = result.plan
    model_seconds = _model_seconds(inputs, the_spec, row, base, effective_batch, plan["grad_accum_steps"],
                                   result.extra)
    return LeverResult(
        row, fits=True, max_micro_batch=result.max_micro_batch, micro_batch=plan["micro_batch"],
        grad_accum_steps=plan["grad_accum_steps"], peak_bytes=result.plan_peak_bytes or result.peak_bytes,
        model_seconds=model_seconds, note=note, command=result.launch_command,
        extra={"capped": result.capped, "static_bytes": result.static_bytes, "cuda_only": bool(why_not_here),
               **{key: result.extra[key] for key in HOST_BYTES if key in result.extra}})


def _model_seconds(inputs: CostInputs | None, spec: WorkloadSpec, row: Sequence[str], base: Base, effective_batch: int,
                   grad_accum_steps: int | None, extra: dict) -> float | None:
    """The row's modelled time per optimizer step (None without the model's counts or a split); ``extra``: its
    estimate's, whose traced host copies (offloading) are a line in a micro-step's samples."""
    offloads = base.offload_activations or "offload" in row
    if inputs is None or not grad_accum_steps or (offloads and not all(key in extra for key in HOST_BYTES)):
        return None
    blocks, head = row_recompute(row, base)
    per_micro_step, per_sample = (extra[key] if offloads else 0 for key in HOST_BYTES)
    return step_cost(inputs, effective_batch=effective_batch, grad_accum_steps=grad_accum_steps,
                     optimizer=spec.optimizer, recompute_blocks=blocks, recompute_head=head,
                     host_bytes=grad_accum_steps * per_micro_step + effective_batch * per_sample).total_s


def lever_selection(text: str | None, world_size: int) -> tuple[str, ...]:
    """``--levers`` read and checked against the world size: the lever table is for one device (``()``: no table).

    Raises:
        GaplanError: an unknown lever, or ``--levers`` with more than one rank, in one line.
    """
    selected = parse_levers(text)
    if world_size > 1:
        if text is not None and selected:
            raise GaplanError("--levers compares the levers on one device: it goes with --world-size 1 (over ranks, "
                              "gaplan plan compares the layouts)")
        return ()
    return selected


def levers_after_layouts(layouts: LayoutComparison, spec: WorkloadSpec, levers: Sequence[str], *,
                         memory_limit: int | None = None, threads: int | None = None,
                         on_result: Callable[[LeverResult], None] | None = None) -> LeverComparison | None:
    """The lever table on one device, on the precision of the layouts' DDP pick (else of their first DDP row
    estimated; else ``spec``'s own), whose estimate is the base row. None when no lever is selected."""
    from gaplan.workflows.plan import spec_of

    if not levers:
        return None
    ddp = [r for r in layouts.ranked if r.layout.parallel == "ddp" and r.fits is not None]
    known = None
    if ddp:
        first = ddp[0]
        spec = spec_of(spec, first.layout)
        known = LeverResult((), fits=first.fits, max_micro_batch=first.max_micro_batch, micro_batch=first.micro_batch,
                            grad_accum_steps=first.grad_accum_steps, peak_bytes=first.peak_bytes,
                            needed_bytes=first.needed_bytes, note=first.note, command=first.command,
                            extra={"capped": first.extra.get("capped")})
    return compare_levers(spec, effective_batch=layouts.effective_batch, levers=levers, memory_limit=memory_limit,
                          target=layouts.target, device_kind=layouts.device_kind, threads=threads,
                          margin=layouts.margin, on_result=on_result, known_base=known)


def cost_inputs(spec: WorkloadSpec, device_kind: str) -> CostInputs | None:
    """The cost model's counts of ``spec``'s model, built on the meta device (None for a ``module:function`` model,
    whose weights and tokens gaplan cannot read without building it)."""
    from gaplan.data.tasks.registry import task_component
    from gaplan.workload.build import build_workload
    from gaplan.workload.spec import model_source_kind

    if model_source_kind(spec.model) == "function":
        return None
    meta = dataclasses.replace(spec, optimizer="sgd", loss="plain")  # the counts do not depend on these
    workload = build_workload(meta, "meta")
    model = workload.model
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    head = getattr(model, "get_output_embeddings", lambda: None)()
    head_params = int(head.weight.numel()) if head is not None and getattr(head, "weight", None) is not None else 0
    tokens = workload.seq_len or 1
    if task_component(workload.task).encoder_decoder:  # the decoder's target tokens run too
        tokens += spec.target_len or max(tokens // 2, 1)
    return CostInputs(param_count=params, trainable_count=trainable, head_params=head_params, tokens_per_sample=tokens,
                      weight_bytes=DTYPE_BYTES.get(spec.weights_dtype, 4), device_kind=device_kind)


def measure_levers(comparison: LeverComparison, *, device: str, memory_limit: int | None = None,
                   threads: int | None = None, repeats: int = 2, rounds: int = 2,
                   on_result: Callable[[LeverResult], None] | None = None) -> LeverComparison:
    """``comparison`` with every row that fits probed and timed on ``device``: B*, split and peak become the
    probe's; ``samples_per_s`` and its 95% interval the bench's, over ``rounds`` rounds of ``repeats`` steps.

    A row the device cannot run keeps its estimate with a note, and so does one that does not fit once measured.
    """
    from gaplan.benchmark.measurement import BenchSettings
    from gaplan.workflows.plan_measure import probe_and_time

    spec = WorkloadSpec.from_dict(comparison.workload)
    settings = BenchSettings(repeats=repeats, warmup=1, min_rounds=rounds, max_rounds=rounds, large_batch=False)
    effective = comparison.effective_batch
    measured: list[LeverResult] = []
    for result in comparison.results:
        if result.fits and not (device == "cpu" and result.extra.get("cuda_only")):
            the_spec = row_spec(spec, result.levers)
            estimated = {"estimated_max_micro_batch": result.max_micro_batch}
            try:
                done = probe_and_time(the_spec, device=device, memory_limit=memory_limit, effective=effective,
                                      threads=threads, settings=settings)
            except DoesNotFit as exc:
                result = dataclasses.replace(result, fits=False, note=f"measured: {one_line(exc)}",
                                             extra={**result.extra, **estimated, "measured": True})
            except GaplanError as exc:
                result = dataclasses.replace(result, note=f"not measured: {one_line(exc)}")
            else:
                probed, row, plan = done.probed, done.row, done.probed.plan
                result = dataclasses.replace(
                    result, max_micro_batch=probed.max_micro_batch, micro_batch=plan.micro_batch,
                    grad_accum_steps=plan.grad_accum_steps, peak_bytes=done.peak_bytes,
                    samples_per_s=row.samples_per_s, samples_per_s_low=row.samples_per_s_low,
                    samples_per_s_high=row.samples_per_s_high, command=done.command,
                    extra={**result.extra, **estimated, "measured": True, "rounds": row.rounds,
                           "step_seconds_median": row.step_seconds_median})
            if on_result is not None:
                on_result(result)
        measured.append(result)
    return dataclasses.replace(comparison, results=measured, measured_on=device)
