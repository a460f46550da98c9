"""``gaplan probe`` as a library function: the probe, the tuner, the estimate's seed, plan.json (and with
``report`` the measurements of :mod:`gaplan.workflows.bench`).

The CLI parses options, calls one of these and prints what they return; Python users call them
the same way. Progress goes out through callbacks, never to a terminal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gaplan.core.constants import DEFAULT_CPU_BUDGET, SEARCH_CAP
from gaplan.core.errors import GaplanError
from gaplan.core.options import OptionError
from gaplan.core.progress import Say, quiet
from gaplan.core.trial import Trial
from gaplan.runs.folder import PLAN_JSON, path_in
from gaplan.runs.probe_result import ProbeResult, save_probe
from gaplan.workflows.goodput import choose_by_goodput
from gaplan.workflows.probe_settings import ProbeOptions
from gaplan.workload.spec import WorkloadSpec


@dataclass
class ProbeRun:
    """What :func:`run_probe` did: the probe (its plan chosen), where it is saved, the report, the tuner's reason."""

    result: ProbeResult
    plan_path: str
    report_files: list[str] | None
    tuner_reason: str | None
    estimate_seed: int | None = None
    verdict: str | None = None  # the bench's, with --report: the plan against the large batch, with its interval
    contention: str | None = None  # the bench's, with --report: what its timings say about the machine

    @property
    def train_command(self) -> str:
        """The ``gaplan train`` that trains this workload with this plan, as a shell command (as
        :attr:`gaplan.workflows.probe_tokens.TokenProbeRun.train_command` gives a token probe's)."""
        import shlex

        from gaplan.plan.layouts import workload_flags

        return shlex.join(["gaplan", "train", *workload_flags(self.result.workload.to_dict()), "--plan",
                           self.plan_path])


def run_probe(spec: WorkloadSpec, out: str, options: ProbeOptions | None = None, *, device: str = "auto",
              memory_limit: int | None = None, on_trial: Callable[[Trial], None] | None = None,
              on_row: Callable[[Any], None] | None = None, say: Say = quiet,
              on_bench_trial: Callable[[int, str, float | None], None] | None = None,
              on_bench_start: Callable[[Any], None] | None = None, **fields: Any) -> ProbeRun:
    """Probe (tuned as asked), save ``plan.json`` in ``out``, and with ``report`` bench, break down and report.

    ``options`` (default :class:`ProbeOptions`'s) with any of its fields given by keyword over it."""
    from gaplan.benchmark.tuner import tune
    from gaplan.workflows.bench import write_measurements

    o = dataclasses.replace(options or ProbeOptions(), **fields)
    seeds: list[int] = []  # the estimate's B*, once the probe has asked for it

    def seed() -> int:
        """Where the search starts, worked out while the worker starts (the probe calls it; twice when tuning)."""
        if seeds:
            return seeds[0]
        by_default = o.seed_from_estimate is None
        try:
            if by_default and not estimate_is_trusted(spec, device, o.world_size):
                return 1
            seeds.append(estimate_start(spec, device, memory_limit, o.margin, o.search_cap, o.threads, say))
        except GaplanError as exc:
            # Asked for by name, its error is the answer; so is an option this device refuses (the trials would too).
            if not by_default or isinstance(exc, OptionError):
                raise
            say(f"estimate: {exc}; searching from 1")  # the probe itself says what fits; the seed was a head start
            return 1
        return seeds[0]

    by_goodput = o.objective == "goodput"
    # By goodput the search reaches the range's top (B* may be needed there); the plan is chosen after it.
    searched = max(o.effective_batch, o.goodput.bounds(o.effective_batch)[1]) if by_goodput else o.effective_batch
    tuned = tune(spec, objective="max-micro-batch" if by_goodput else o.objective,
                 grad_checkpointing=o.grad_checkpointing, device=device,
                 memory_limit=memory_limit, effective_batch=searched, bench_large_batch=o.report,
                 bench_settings=o.bench, on_trial=on_trial, on_row=on_row, on_stage=lambda text: say(text + " ..."),
                 on_bench_trial=on_bench_trial,
                 on_bench_start=on_bench_start or (lambda outlook: say(outlook.describe() + " ...")),
                 margin=o.margin, world_size=o.world_size, search_cap=o.search_cap, threads=o.threads,
                 start=1 if o.seed_from_estimate is False else seed)
    result = dataclasses.replace(tuned.result, command=o.command)
    reason = tuned.decision.reason if result.tuner else None
    if by_goodput:
        result, _ = choose_by_goodput(result, o.effective_batch, o.goodput, o.bench, out, device=device,
                                      memory_limit=memory_limit, threads=o.threads, say=say, on_row=on_row,
                                      on_bench_trial=on_bench_trial, on_bench_start=on_bench_start)
        reason = result.tuner["reason"]
    plan_path = path_in(out, PLAN_JSON)
    save_probe(result, plan_path)
    written = write_measurements(out, result, tuned.benches, on_row, say) if o.report else None
    bench = tuned.benches[0] if o.report and tuned.benches else None
    return ProbeRun(result, plan_path, written, reason, seeds[0] if seeds else None,
                    bench.verdict or None if bench else None, bench.contention or None if bench else None)


def estimate_is_trusted(spec: WorkloadSpec, device: str, world_size: int) -> bool:
    """Whether a probe starts from the estimate by default: one process of a family the zoo measured
    (:mod:`gaplan.estimate.trust`), not compiled (a compiled trial also holds the compiler, which the estimate does
    not count). Elsewhere the estimate may be further off, and a seed that misses costs trials."""
    from gaplan.estimate.trust import trust_of
    from gaplan.workload.build import load_model_config, model_source_kind

    if world_size > 1 or spec.parallel == "fsdp" or spec.compile or model_source_kind(spec.model) == "function":
        return False
    config, _, _ = load_model_config(spec)
    kind = "cpu" if device == "cpu" else "cuda"
    return trust_of(getattr(config, "model_type", None), spec.to_dict(), kind).measured


def estimate_start(spec: WorkloadSpec, device: str, memory_limit: int | None, margin: float, search_cap: int | None,
                   threads: int | None, say: Say = quiet) -> int:
    """The estimate's B* for this device and budget: where a seeded probe starts its search."""
    from gaplan.devices.backend import resolve_device
    from gaplan.estimate import estimate

    device = resolve_device(device)
    kind = "cpu" if device == "cpu" else "cuda"
    limit = memory_limit or (DEFAULT_CPU_BUDGET if kind == "cpu" else None)
    if limit is None:
        from gaplan.devices.backend import cuda_total_bytes

        limit = cuda_total_bytes(device)
    limit = int(limit * (1 - margin))

    def traced() -> dict:
        predicted = estimate(spec, memory_limit=limit, device_kind=kind, effective_batch=1, threads=threads,
                             search_cap=search_cap or SEARCH_CAP)
        return {"max_micro_batch": predicted.max_micro_batch, "trace_count": predicted.trace_count,
                "trace_seconds": predicted.trace_seconds}

    from gaplan.devices.card import imports_initialize_cuda

    if imports_initialize_cuda(device, spec):  # bitsandbytes' import would initialize CUDA here: traced in a child
        from gaplan.core.fork import run_in_child

        found = run_in_child(traced)
        if "error" in found:
            raise GaplanError(str(found.get("message", found["error"])).strip().splitlines()[-1])
    else:
        found = traced()
    say(f"estimate: B* = {found['max_micro_batch']} ({found['trace_count']} traces on fake tensors, "
        f"{found['trace_seconds']:.1f} s); starting the search there")
    return found["max_micro_batch"]
