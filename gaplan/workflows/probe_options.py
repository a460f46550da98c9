"""``gaplan probe``'s command line as one object: the workload's spec, the probe's :class:`ProbeOptions`, the device and
budget, the data, the mode (by samples or ``--batch-by tokens``) and the run folder, checked once at construction
(:meth:`ProbeCommand.__post_init__`), and :func:`run_probe_command`, which runs it. The CLI parses text into it
(:func:`gaplan.workflows.parse_options.command_from_options`) and prints what it raises; a Python caller gets the
same refusals, word for word.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gaplan.core.checkpointing import AUTO
from gaplan.core.errors import GaplanError
from gaplan.core.options import OUTPUT, check_applies, nested, option
from gaplan.core.outputs import check_writable
from gaplan.core.progress import Say, quiet
from gaplan.data.source import DataSource
from gaplan.runs.claim import claim_run_folder
from gaplan.runs.folder import default_run_dir
from gaplan.workflows.parse_options import (
    check_by_tokens,
    data_given,
    granule_of,
    target_budget,
)
from gaplan.workflows.probe_settings import BY_GOODPUT, BY_SAMPLES, TIMED, TIMING_OPTIONS, ProbeOptions
from gaplan.workload.spec import WorkloadSpec


@dataclass(frozen=True)
class ProbeCommand:
    """One ``gaplan probe``: what to probe (``spec``), how (``probe``), where (``device``, ``memory_limit`` in bytes
    or ``target``'s usable memory), by samples or ``batch_by="tokens"`` over ``source``, into ``out``."""

    spec: WorkloadSpec
    probe: ProbeOptions = nested(ProbeOptions)
    device: str = "auto"
    memory_limit: int | None = None
    target: str | None = None  # a GPU of gaplan estimate --list-targets to emulate (its usable memory is the budget)
    batch_by: str = "samples"
    granule: int | None = None  # by tokens: a probed budget is a multiple of it (None: 64)
    source: DataSource | None = nested(DataSource)  # --data (by tokens, or goodput's measuring run); None without it
    emit: str | None = option(None, section=OUTPUT, choices=("hf",), applies=BY_SAMPLES,
                              help="Also print the plan as code to paste: hf = transformers TrainingArguments.")
    out: str | None = None  # the run folder (None: reports/probe-<model>-<time>)
    overwrite: bool = False  # replace the run that ``out`` holds (its files only), else that is refused
    ranks: int = field(default=1, init=False)  # processes each trial runs (the world size under FSDP)

    def __post_init__(self) -> None:
        if self.out is None:  # named once, so what is printed after names what was written
            object.__setattr__(self, "out", default_run_dir("probe", self.spec.model))
        if self.target:
            object.__setattr__(self, "memory_limit", target_budget(self.target, self.memory_limit, self.device))
            object.__setattr__(self, "target", None)  # the budget now holds it (replace() does not redo it)
        object.__setattr__(self, "source", data_given(self.source))
        probe = self.probe
        granule_of(self.granule, self.batch_by)  # kept as given: replace() checks it again
        by_goodput = probe.objective == "goodput"
        if not by_goodput:
            check_applies(probe.goodput, BY_GOODPUT)
        if not self.timing:  # (by tokens, nothing is timed either)
            check_applies(probe.bench, TIMED, TIMING_OPTIONS)
        probe.bench.check_interval()
        if self.by_tokens:
            self._check_by_tokens()
            return
        if self.source is not None and not by_goodput:
            raise GaplanError("--data applies to --batch-by tokens and to --objective goodput's measuring run here (a "
                              "probe by samples runs full-length batches)")
        if by_goodput and probe.report:
            raise GaplanError("--report times the plan of --effective-batch; with --objective goodput, report on the "
                              "chosen plan afterwards: gaplan bench --plan OUT/plan.json")
        if self.timing and self.spec.parallel == "fsdp":
            raise GaplanError("--report, --objective throughput|goodput and --grad-checkpointing auto time one device; "
                              "a sharded run's splits are timed by gaplan bench --parallel fsdp --world-size W")
        if self.timing and probe.world_size != 1:
            raise GaplanError("--report, --objective throughput|goodput and --grad-checkpointing auto time one device: "
                              "use --world-size 1")
        from gaplan.probing.edge import trial_ranks

        object.__setattr__(self, "ranks", trial_ranks(self.spec, probe.world_size))  # fsdp needs 2 ranks or more

    def _check_by_tokens(self) -> None:
        check_by_tokens(self.spec, self.source, self.probe.world_size, "probe")
        check_applies(self, BY_SAMPLES)  # the probe's options of a probe by samples, and --emit
        if self.probe.grad_checkpointing == AUTO:
            raise GaplanError("--grad-checkpointing auto applies to a probe by samples: give on or off with --batch-by "
                              "tokens")

    @property
    def by_tokens(self) -> bool:
        return self.batch_by == "tokens"

    @property
    def timing(self) -> bool:
        """Whether the probe times splits after the search (the report, a throughput or goodput tuner, auto)."""
        probe = self.probe
        return probe.report or probe.objective in ("throughput", "goodput") or probe.grad_checkpointing == AUTO


def run_probe_command(command: ProbeCommand, *, say: Say = quiet, on_trial: Callable | None = None,
                      on_row: Callable | None = None, on_bench_trial: Callable | None = None,
                      on_bench_start: Callable | None = None, on_profile: Callable | None = None,
                      config_toml: str | None = None):
    """Probe as ``command`` asks: a :class:`gaplan.workflows.probe.ProbeRun` by samples, a
    :class:`gaplan.workflows.probe_tokens.TokenProbeRun` by tokens. The run folder is checked before any work;
    ``config_toml`` (the options as ``--config`` reads them) is saved in it once the probe is done."""
    from gaplan.runs.schema import save_run_config  # pandas: not at import, where the CLI builds probe's options

    out = command.out
    check_writable(out)
    with claim_run_folder(out, "probe", overwrite=command.overwrite):
        run = _run_probe_command(command, say=say, on_trial=on_trial, on_row=on_row, on_bench_trial=on_bench_trial,
                                 on_bench_start=on_bench_start, on_profile=on_profile)
        save_run_config(out, config_toml)
        return run


def _run_probe_command(command: ProbeCommand, *, say: Say, on_trial: Callable | None, on_row: Callable | None,
                       on_bench_trial: Callable | None, on_bench_start: Callable | None, on_profile: Callable | None):
    out = command.out
    probe = command.probe
    if command.by_tokens:
        from gaplan.workflows.probe_tokens import run_token_probe

        return run_token_probe(command.spec, out, command.source, device=command.device,
                               memory_limit=command.memory_limit,
                               granule=granule_of(command.granule, command.batch_by),
                               effective_batch=probe.effective_batch, threads=probe.threads, command=probe.command,
                               say=say, on_trial=on_trial, on_profile=on_profile)
    from gaplan.workflows.probe import run_probe

    each = (f"{command.ranks} fresh processes in one process group, each under the budget" if command.ranks > 1
            else "a fresh process")
    say(f"probing {command.spec.model} (each trial: {each}, 2 optimizer steps of 2 micro-steps) ...")
    if command.timing:
        say("after the probe, --report / --objective throughput time splits in interleaved rounds (the forecast of "
            "how long follows the probe; --time-budget bounds it)")
    return run_probe(command.spec, out, probe, device=command.device, memory_limit=command.memory_limit,
                     on_trial=on_trial, on_row=on_row, say=say, on_bench_trial=on_bench_trial,
                     on_bench_start=on_bench_start)
