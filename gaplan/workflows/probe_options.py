"""``gaplan probe``'s command line as one object: the workload's spec, the probe's :class:`ProbeOptions`, the device and
budget, the data, the mode (by samples or ``--batch-by tokens``) and the run folder, checked once at construction
(:meth:`ProbeCommand.__post_init__`), and :func:`gaplan.workflows.run_commands.run_probe_command` runs it. The CLI
parses text into it (:func:`gaplan.workflows.parse_options.command_from_options`) and prints what it raises; a Python
caller gets the same refusals, word for word.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gaplan.core.checkpointing import AUTO
from gaplan.core.errors import GaplanError
from gaplan.core.options import OUTPUT, check_applies, nested, option
from gaplan.data.source import DataSource
from gaplan.runs.folder import default_run_dir
from gaplan.workflows.parse_options import (
    check_by_tokens,
    check_command_fields,
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
        check_command_fields(self)
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
