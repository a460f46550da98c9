"""Each command's object run: :func:`run_probe_command`, :func:`run_bench_command`, :func:`run_estimate_command` and
:func:`run_plan_command` take the checked object (``ProbeCommand`` ...: their options, in ``*_options.py``) and do the
work; ``gaplan train``'s is :func:`gaplan.workflows.train.run_train`. A probe's and a bench's run folder is checked
before any work and claimed while it runs (:func:`gaplan.runs.claim.claim_run_folder`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gaplan.core.outputs import check_writable
from gaplan.core.progress import Say, quiet
from gaplan.plan.split import default_search_cap
from gaplan.runs.claim import claim_run_folder
from gaplan.workflows.bench_options import BenchCommand
from gaplan.workflows.estimate_options import EstimateCommand
from gaplan.workflows.parse_options import granule_of
from gaplan.workflows.plan_options import PlanCommand
from gaplan.workflows.probe_options import ProbeCommand


def _in_run_folder(command: Any, kind: str, config_toml: str | None, work: Callable[[], Any],
                   inputs: tuple[str, ...] = ()) -> Any:
    """``work()`` with ``command.out`` checked first and claimed while it runs (``inputs``: files it reads, which
    ``--overwrite`` must not remove); ``config_toml`` (the options as ``--config`` reads them) saved there after."""
    from gaplan.runs.schema import save_run_config  # pandas: not at import, where the CLI builds the options

    check_writable(command.out)
    with claim_run_folder(command.out, kind, overwrite=command.overwrite, inputs=inputs):
        result = work()
        save_run_config(command.out, config_toml)
        return result


def _by_tokens(command: ProbeCommand | BenchCommand) -> dict[str, Any]:
    """What a probe and a bench by tokens both take from their command: the workload, the folder, the data, the
    device, the budget and the granule (``run_token_probe``'s and ``run_token_bench``'s first arguments)."""
    return {"spec": command.spec, "out": command.out, "data": command.source, "device": command.device,
            "memory_limit": command.memory_limit, "granule": granule_of(command.granule, command.batch_by)}


def run_probe_command(command: ProbeCommand, *, say: Say = quiet, on_trial: Callable | None = None,
                      on_row: Callable | None = None, on_bench_trial: Callable | None = None,
                      on_bench_start: Callable | None = None, on_profile: Callable | None = None,
                      config_toml: str | None = None):
    """Probe as ``command`` asks: a :class:`gaplan.workflows.probe.ProbeRun` by samples, a
    :class:`gaplan.workflows.probe_tokens.TokenProbeRun` by tokens."""
    probe = command.probe

    def work() -> Any:
        if command.by_tokens:
            from gaplan.workflows.probe_tokens import run_token_probe

            return run_token_probe(**_by_tokens(command), effective_batch=probe.effective_batch, threads=probe.threads,
                                   command=probe.command, say=say, on_trial=on_trial, on_profile=on_profile)
        from gaplan.workflows.probe import run_probe

        each = (f"{command.ranks} fresh processes in one process group, each under the budget" if command.ranks > 1
                else "a fresh process")
        say(f"probing {command.spec.model} (each trial: {each}, 2 optimizer steps of 2 micro-steps) ...")
        if command.timing:
            say("after the probe, --report / --objective throughput time splits in interleaved rounds (the forecast "
                "of how long follows the probe; --time-budget bounds it)")
        return run_probe(command.spec, command.out, probe, device=command.device, memory_limit=command.memory_limit,
                         on_trial=on_trial, on_row=on_row, say=say, on_bench_trial=on_bench_trial,
                         on_bench_start=on_bench_start)

    return _in_run_folder(command, "probe", config_toml, work)


def run_bench_command(command: BenchCommand, *, say: Say = quiet, on_trial: Callable | None = None,
                      on_bench_trial: Callable | None = None, on_start: Callable | None = None,
                      on_profile: Callable | None = None, on_run: Callable | None = None,
                      config_toml: str | None = None):
    """Bench as ``command`` asks: by samples ``(measured, report files)`` of
    :func:`gaplan.workflows.bench.probe_and_bench`; by tokens a
    :class:`gaplan.workflows.bench_tokens.TokenBenchResult`."""
    settings = command.settings

    def work() -> Any:
        if command.by_tokens:
            from gaplan.workflows.bench_tokens import run_token_bench

            return run_token_bench(**_by_tokens(command), effective_batch=command.effective_batch, warmup=settings.warmup,
                                   repeats=settings.repeats, rounds=settings.min_rounds, threads=command.threads,
                                   command=command.command, say=say, on_trial=on_trial, on_profile=on_profile,
                                   on_run=on_run)
        from gaplan.workflows.bench import probe_and_bench

        return probe_and_bench(command.spec, command.out, command.effective_batch, settings,
                               device=command.device, memory_limit=command.memory_limit, plan_file=command.plan_file,
                               grad_checkpointing=command.grad_checkpointing, world_size=command.world_size,
                               threads=command.threads, command=command.command, say=say, on_trial=on_trial,
                               on_bench_trial=on_bench_trial, on_start=on_start)

    return _in_run_folder(command, "bench", config_toml, work, (command.plan_file,) if command.plan_file else ())


def run_estimate_command(command: EstimateCommand, *, say: Say = quiet):
    """The :class:`gaplan.estimate.EstimateResult` of ``command`` (``say``: one progress line first)."""
    from gaplan.estimate import estimate

    rank = f"one rank of {command.ranks} ({command.spec.parallel}) " if command.ranks > 1 else ""
    say(f"tracing {rank}{command.spec.model} on fake tensors (nothing is allocated) ...")
    return estimate(command.spec, memory_limit=command.memory_limit, target=command.target,
                    effective_batch=command.effective_batch, sizes=list(command.sizes) if command.sizes else None,
                    device_kind=command.device_kind, threads=command.threads, world_size=command.ranks,
                    nodes=command.machines,
                    search_cap=command.search_cap or default_search_cap(command.effective_batch, command.ranks))


@dataclass(frozen=True)
class PlanDone:
    """What :func:`run_plan_command` made: the layouts compared, the lever table (None over ranks or with no lever),
    the files written and their folder."""

    comparison: Any
    levers: Any
    files: list[str]
    out: str

    def to_dict(self) -> dict[str, Any]:
        """The layouts (and the lever table) as ``--json`` prints them, with the folder and its files."""
        from gaplan.report.layout_report import report_dict
        from gaplan.report.lever_report import report_dict as lever_dict

        levers = {"levers": lever_dict(self.levers)} if self.levers is not None else {}
        return {**report_dict(self.comparison), **levers, "out": self.out, "files": self.files}

    @property
    def launch_command(self) -> str | None:
        """The command that trains the pick: the lever table's on one device, else the layouts'."""
        chosen = (self.levers.pick if self.levers is not None else None) or self.comparison.pick
        return chosen.command if chosen is not None and chosen.command else None


def run_plan_command(command: PlanCommand, *, say: Say = quiet, on_result: Callable | None = None,
                     on_measured: Callable | None = None, on_lever: Callable | None = None) -> PlanDone:
    """Estimate every layout of ``command`` (with ``measure``, then probe and time those that fit here), then on one
    device the lever rows, and write the report into ``command.out``, checked first and claimed while it runs, as a
    probe's. ``on_result(layout result)`` follows each estimate, ``on_measured(layout result, its split as text)``
    each measurement and ``on_lever(lever result)`` each lever row, estimated or measured."""
    return _in_run_folder(command, "plan", None, lambda: _plan(command, say, on_result, on_measured, on_lever))


def _plan(command: PlanCommand, say: Say, on_result: Callable | None, on_measured: Callable | None,
          on_lever: Callable | None) -> PlanDone:
    from gaplan.report.layout_report import write_layout_report
    from gaplan.workflows.plan import compare_layouts

    spec = command.spec
    if command.measure:  # it probes here: a device this machine lacks is refused before any estimate
        from gaplan.devices.backend import resolve_device

        resolve_device(command.device)
    say(f"estimating {len(command.layouts)} layout(s) x 3 precisions of {spec.model} for {command.ranks} rank(s) on "
        "fake tensors (nothing is allocated) ...")
    comparison = compare_layouts(
        spec, world_size=command.ranks, nodes=command.machines, effective_batch=command.effective_batch,
        memory_limit=command.memory_limit, target=command.target, device_kind=command.device, dtype=spec.dtype,
        machinery=list(command.layouts), grad_sync=command.grad_sync, threads=command.threads,
        margin=command.margin, on_result=on_result)
    if command.measure:
        from gaplan.workflows.plan_measure import measure_layouts

        fitting = sum(1 for r in comparison.results if r.fits)
        say(f"measuring the {fitting} layout(s) that fit on this machine ({command.device}, {command.ranks} "
            "rank(s)): an exact probe and a timed plan each ...")
        estimated = comparison
        comparison = measure_layouts(comparison, spec, device=command.device, memory_limit=command.memory_limit,
                                     threads=command.threads, repeats=command.repeats,
                                     on_result=on_measured and (lambda r: on_measured(r, estimated.split(r))))
    files = write_layout_report(command.out, comparison)
    levers = _lever_table(command, comparison, say, on_lever)
    if levers is not None:
        from gaplan.report.lever_report import write_lever_report

        files = sorted(files + write_lever_report(command.out, levers))
    return PlanDone(comparison, levers, files, command.out)


def _lever_table(command: PlanCommand, comparison: Any, say: Say, on_lever: Callable | None) -> Any:
    """The lever table on one device (estimated, then measured with ``measure``), or None."""
    from gaplan.workflows.plan_levers import levers_after_layouts, measure_levers

    if not command.lever_names:
        return None
    say(f"estimating the lever rows ({', '.join(command.lever_names)}) on one device ...")
    table = levers_after_layouts(comparison, command.spec, command.lever_names, memory_limit=command.memory_limit,
                                 threads=command.threads, on_result=on_lever)
    if command.measure and table is not None:
        say("measuring the lever rows that fit: an exact probe and two timed rounds each ...")
        table = measure_levers(table, device=command.device, memory_limit=command.memory_limit,
                               threads=command.threads, repeats=command.repeats, on_result=on_lever)
    return table
