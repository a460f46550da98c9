"""The probe: real steady-state trials at growing micro-batches, searched to the exact edge.

Trials run in a worker process under the memory budget (:mod:`gaplan.worker.serve`);
the search (:mod:`gaplan.plan.search`) decides which sizes to try; the plan
(:mod:`gaplan.plan.split`) turns the edge into accumulation steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gaplan.core.constants import DEFAULT_CPU_BUDGET, DEFAULT_EFFECTIVE_BATCH
from gaplan.core.errors import DoesNotFit, GaplanError
from gaplan.core.options import OptionError, check_positive_ints
from gaplan.core.trial import Trial
from gaplan.core.units import format_bytes, parse_bytes
from gaplan.devices.backend import cuda_total_bytes, resolve_device
from gaplan.devices.cpu import available_bytes
from gaplan.plan.search import find_edge
from gaplan.plan.split import default_search_cap, make_plan
from gaplan.runs.probe_result import ProbeResult
from gaplan.worker.client import WorkerProcess
from gaplan.workload.spec import WorkloadSpec


def _check_ready(info: dict, spec: WorkloadSpec, limit_bytes: int, ranks: int = 1) -> None:
    limit = info.get("limit_bytes") or limit_bytes
    if info.get("error") == "does-not-fit" or (info.get("static_bytes") or 0) > limit:
        needed = info.get("static_bytes")
        what = f"needs at least {format_bytes(needed)} " if needed else "needs more memory than that "
        where = f" per rank (sharded over {ranks} ranks)" if ranks > 1 else ""
        raise DoesNotFit(f"{spec.model} does not fit in {format_bytes(limit)}{where}: "
                         f"it {what}for weights, gradients and optimizer states", needed)


def trial_ranks(spec: WorkloadSpec, world_size: int) -> int:
    """How many ranks each trial runs: the world size for a sharded workload (its memory depends on it), else 1.

    Raises:
        GaplanError: ``--parallel fsdp`` with fewer than 2 ranks.
    """
    if spec.parallel != "fsdp":
        return 1
    if world_size < 2:
        raise OptionError(f"parallel fsdp: FSDP shards over at least 2 ranks; give world_size 2 or more "
                          f"(got {world_size})", "parallel", "world_size")
    return world_size


def check_gpus_for_ranks(device: str, ranks: int) -> None:
    """On CUDA a trial of ``ranks`` ranks runs one per local GPU, cuda:0 to cuda:ranks-1 (on CPU: processes here)."""
    if ranks < 2 or not device.startswith("cuda"):
        return
    from gaplan.devices.card import cuda_cards

    count = cuda_cards().count  # asked in a child: this process forks the ranks' trials after
    if count < ranks:
        raise GaplanError(f"--parallel fsdp --world-size {ranks}: a trial runs every rank on its own GPU of "
                          f"this machine (cuda:0 to cuda:{ranks - 1}), and it has {count}")


def probe(
    spec: WorkloadSpec | None = None,
    device: str = "auto",
    memory_limit: int | str | None = None,
    margin: float = 0.0,
    effective_batch: int = DEFAULT_EFFECTIVE_BATCH,
    world_size: int = 1,
    start: int | Callable[[], int] = 1,
    search_cap: int | None = None,
    threads: int | None = None,
    ddp: bool | None = None,
    optimizer_steps: int = 2,
    on_trial: Callable[[Trial], None] | None = None,
) -> ProbeResult:
    """Find the largest micro-batch that fits ``device`` at steady state, and plan ``effective_batch``.

    Args:
        spec: the workload (default: the built-in small causal LM).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        memory_limit: the budget in bytes (CPU default :data:`DEFAULT_CPU_BUDGET`; CUDA: the card). On CUDA a given
            limit is a card's memory: the allocator's cap is that less the context's allowance, and NCCL's above
            one rank (:mod:`gaplan.devices.reserve`); the result's ``probe_limit_bytes`` is the cap.
        margin: fraction of the budget kept free as headroom (trials run under ``(1 - margin) * budget``).
        search_cap: no trial above this; default ``ceil(effective_batch / world_size)``, since a larger
            micro-batch is never of use to the plan (when it fits, the result says ``capped``).
        ddp: trials wrap the model in DistributedDataParallel (its gradient buckets count); default: when
            ``world_size`` > 1, since that run trains under DDP. Not used for a sharded workload
            (``spec.parallel == "fsdp"``): each of its trials runs ``world_size`` ranks in one process group
            (processes on this machine, gloo, each under ``memory_limit``; on CUDA cuda:0 to cuda:W-1),
            and a size fits only if it fits on every rank (:mod:`gaplan.worker.ranks`).
        start: the search's first micro-batch, or a function that returns it, called while the worker starts.
        optimizer_steps: accumulated optimizer steps per trial (each in a fresh process); two by
            default, so the answer is checked past the first step, not only at it. The doublings that only
            draw the memory line run one (sketches: :func:`gaplan.plan.search.find_edge`).
        on_trial: called after each trial, for progress display.

    Raises:
        DoesNotFit: when even micro-batch 1 does not fit.
    """
    if spec is not None and not isinstance(spec, WorkloadSpec):  # probe("tiny-gpt2")
        raise GaplanError(f"probe takes a WorkloadSpec (got {spec!r}): probe(WorkloadSpec(model=...))")
    spec = (spec or WorkloadSpec()).validate()
    ranks = trial_ranks(spec, world_size)
    from gaplan.estimate.budget import check_margin

    check_margin(margin)
    if memory_limit is not None:
        memory_limit = parse_bytes(memory_limit)
    check_positive_ints(threads=threads, optimizer_steps=optimizer_steps, start=None if callable(start) else start)
    make_plan(effective_batch, default_search_cap(effective_batch, world_size), world_size)  # a bad batch fails here
    if search_cap is None:
        search_cap = default_search_cap(effective_batch, world_size)
    if search_cap < 1:
        raise GaplanError(f"the search cap must be a positive integer (got {search_cap})")
    started = time.perf_counter()
    budget_is_default = memory_limit is None
    # "auto" needs torch to resolve (2-3 s to import): the worker imports it anyway, so it resolves the device
    # there while this process goes on, unless the budget needs the device first (a margin off the default).
    resolve_in_worker = device == "auto" and ranks == 1 and (memory_limit is not None or margin == 0)
    if not resolve_in_worker:
        device = resolve_device(device)
        check_gpus_for_ranks(device, ranks)
        if device == "cpu" and memory_limit is None:
            memory_limit = DEFAULT_CPU_BUDGET
        if device.startswith("cuda") and memory_limit is None:
            memory_limit = cuda_total_bytes(device)  # the whole card, so that --margin applies to it too
        if device == "cpu":
            check_cpu_budget(memory_limit, ranks)
    probe_limit = None if memory_limit is None else int(memory_limit * (1 - margin))
    ddp = (world_size > 1 if ddp is None else ddp) and ranks == 1
    # A --memory-limit is the card's memory: on CUDA the worker takes the context's allowance (and NCCL's, above
    # one rank) off it before it caps the allocator (gaplan.devices.reserve), as the estimate does.
    with WorkerProcess(spec, device, probe_limit, threads=threads, ddp=ddp, ranks=ranks,
                       card_limit=not budget_is_default) as worker:
        if callable(start):  # worked out while the worker starts (its imports take seconds): an estimate's edge
            start = start()
        info = worker.info
        memory_limit = memory_limit or info["limit_bytes"]
        probe_limit = info["limit_bytes"]
        if resolve_in_worker:
            device = info.get("device") or resolve_device(device)  # a does-not-fit reply names none
            if device == "cpu":
                check_cpu_budget(memory_limit)
        _check_ready(info, spec, probe_limit, ranks)

        def measure(micro_batch: int, steps: int = optimizer_steps) -> Trial:
            trial = worker.trial(micro_batch, optimizer_steps=steps)
            if on_trial is not None:
                on_trial(trial)
            return trial

        # The doublings only draw the memory line (its peaks are the forward/backward ones): one optimizer step
        # is enough there, the optimizer states existing already. The answer never rests on one (see find_edge).
        sketch = (lambda micro_batch: measure(micro_batch, 1)) if optimizer_steps > 1 else None
        result = find_edge(measure, probe_limit, start=start, max_batch=search_cap, sketch=sketch)
    edge = result.edge
    if edge == 0:
        raise DoesNotFit(f"{spec.model} does not fit in {format_bytes(probe_limit)} even at micro-batch 1 "
                         f"(weights, gradients and optimizer states alone take {format_bytes(info['static_bytes'])})",
                         info["static_bytes"])
    return ProbeResult(
        workload=spec, device=device, memory_limit_bytes=int(memory_limit), margin=margin,
        probe_limit_bytes=int(probe_limit), budget_is_default=budget_is_default,
        max_micro_batch=edge, capped=result.capped, trials=result.trials,
        plan=make_plan(effective_batch, edge, world_size), param_count=info["param_count"],
        static_bytes=info["static_bytes"], task=info["task"], seq_len=info["seq_len"], ddp=ddp,
        wall_seconds=time.perf_counter() - started, world_size=world_size, trial_ranks=ranks,
        worker_seconds=worker.start_seconds,
    )


def check_in_fresh_process(spec: WorkloadSpec, device: str, limit_bytes: int | None, micro_batch: int,
                           optimizer_steps: int = 2, threads: int | None = None, world_size: int = 1) -> bool:
    """Train ``optimizer_steps`` accumulated steps at ``micro_batch`` in a new process; True if it fits.

    A sharded workload runs ``world_size`` ranks, each under ``limit_bytes``: True if it fits on every one.
    """
    ranks = trial_ranks(spec, world_size)
    with WorkerProcess(spec, resolve_device(device), limit_bytes, threads=threads, ranks=ranks) as worker:
        if worker.info.get("error") == "does-not-fit":
            return False
        return worker.trial(micro_batch, optimizer_steps=optimizer_steps).fits


def check_cpu_budget(memory_limit: int, ranks: int = 1) -> None:
    """A CPU budget must be real: one above the memory this machine has free would only end in the OOM killer.

    ``ranks`` trial processes at once (a sharded trial) each have the budget: all of them must fit.
    """
    free = available_bytes()
    if free is None or memory_limit * ranks <= free:
        return
    if ranks > 1:
        raise GaplanError(f"--memory-limit {format_bytes(memory_limit)} per rank x {ranks} ranks is more than this "
                          f"machine's available memory ({format_bytes(free)}): every rank of a trial runs here, "
                          "under its own budget")
    raise GaplanError(f"--memory-limit {format_bytes(memory_limit)} is more than this machine's available memory "
                      f"({format_bytes(free)}): a CPU budget must fit in it")
