"""What ``gaplan probe`` is asked beyond the workload and the device (:class:`ProbeOptions`), and goodput's range
and measuring run (:class:`GoodputOptions`): each field with help is its command-line option. No torch, no pandas
(the CLI imports it to build its options)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from gaplan.benchmark.measurement import BenchSettings
from gaplan.core.checkpointing import OFF, Checkpointing, check_typed
from gaplan.core.constants import DEFAULT_EFFECTIVE_BATCH, EFFECTIVE_BATCH_HELP
from gaplan.core.options import MEMORY, PLAN, TIMING, OptionError, nested, option, option_name
from gaplan.data.source import DataSource
from gaplan.workflows.parse_options import parse_batch_range

OBJECTIVES = ("max-micro-batch", "throughput", "goodput")

# Where a probe's own options apply.
BY_GOODPUT, BY_SAMPLES = "`--objective goodput`", "a probe by samples (not `--batch-by tokens`)"
TIMED = "`--report`, `--objective throughput|goodput` and `--grad-checkpointing auto` (how their splits are timed)"
# How splits are timed (BenchSettings' options): they apply where the probe times splits.
TIMING_OPTIONS = tuple(option_name(f) for f in dataclasses.fields(BenchSettings) if "help" in f.metadata)


@dataclass(frozen=True)
class GoodputOptions:
    """The range of effective batches to choose from and the measuring run (``--batch-range``, ``--measure-steps``).

    ``batch_range`` (low, high) defaults to E/16 .. 4E of the asked-for effective batch E."""

    CONFIG_TABLE: ClassVar[str] = "goodput"  # its options' table in a config file: [COMMAND.goodput]

    batch_range: tuple[int, int] | None = option(None, section=PLAN, parse=parse_batch_range, metavar="LOW:HIGH",
                                                 applies=BY_GOODPUT, help=(
        "--objective goodput: the effective batches to choose from (default E/16:4E)."))
    measure_steps: int = option(30, section=PLAN, applies=BY_GOODPUT, help=(
        "--objective goodput: optimizer steps of the run that measures the noise scale."))
    source: DataSource = nested(DataSource)  # the measuring run's data (``--data``; default: the synthetic corpus)

    def __post_init__(self) -> None:
        if self.measure_steps < 2:
            raise OptionError(f"measure_steps must be at least 2 (got {self.measure_steps}): the noise scale is "
                              "smoothed over steps", "measure_steps")
        if self.batch_range is not None:
            low, high = self.batch_range
            if not 1 <= low <= high:
                raise OptionError(f"the batch range must be LOW:HIGH with 1 <= LOW <= HIGH (got {low}:{high})",
                                  "batch_range")

    def bounds(self, asked: int) -> tuple[int, int]:
        if self.batch_range is not None:
            return self.batch_range
        return max(1, asked // 16), 4 * asked


@dataclass(frozen=True)
class ProbeOptions:
    """What ``gaplan probe`` is asked, beyond the workload and the device: the plan's batch, the search, the tuner,
    the report. Built from the parsed options by field (:func:`gaplan.core.options.from_options`)."""

    effective_batch: int = option(DEFAULT_EFFECTIVE_BATCH, section=PLAN, help=EFFECTIVE_BATCH_HELP)
    world_size: int = option(1, section=PLAN, help=(
        "Processes the batch is split over (with --parallel fsdp, 2 or more: every trial runs them all)."))
    margin: float = option(0.0, section=MEMORY, applies=BY_SAMPLES, help=(
        "Fraction of the budget kept free (e.g. 0.05 for longer batches later)."))
    search_cap: int | None = option(None, section=PLAN, aliases=("--max-micro-batch",), applies=BY_SAMPLES, help=(
        "Do not try micro-batches above this (default: the effective batch per device, ceil(E/W): a larger one is "
        "never used by the plan)."))
    objective: str = option("max-micro-batch", section=PLAN, choices=OBJECTIVES, applies=BY_SAMPLES, help=(
        "Plan with the largest micro-batch; with the split of highest measured throughput (times every split: "
        "minutes); or goodput: measure the gradient noise scale in a short run at --effective-batch, time the plans "
        "of --batch-range, and plan the effective batch of most samples/s x statistical efficiency."))
    grad_checkpointing: Checkpointing | str | None = OFF  # the blocks, or AUTO ("auto": the tuner decides); None: off
    report: bool = option(False, section=TIMING, applies=BY_SAMPLES, help=(
        "Also time the splits against a true large batch, break memory down by category, and write report.md/html, "
        "CSVs and PNGs to the run folder."))
    bench: BenchSettings = nested(BenchSettings)  # how --report and --objective throughput time the splits
    goodput: GoodputOptions = nested(GoodputOptions)  # --objective goodput: its range and measuring run
    # None: where the zoo measured the model's family (estimate_is_trusted).
    seed_from_estimate: bool | None = option(None, section=PLAN, applies=BY_SAMPLES, help=(
        "Start the search at gaplan estimate's predicted edge (traced on fake tensors first) and verify both sides. "
        "Default: on where the model's family is in the estimate's zoo of measured architectures (one process, not "
        "compiled), off elsewhere."))
    threads: int | None = None
    command: str | None = None

    def __post_init__(self) -> None:
        for name in ("effective_batch", "world_size", "search_cap", "threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise OptionError(f"{name} must be a positive integer (got {value})", name)
        from gaplan.devices.cpu import check_threads
        from gaplan.estimate.budget import check_margin

        check_margin(self.margin)
        check_threads(self.threads)
        if self.grad_checkpointing is None:  # not given (the workload spec's default)
            object.__setattr__(self, "grad_checkpointing", OFF)
        check_typed(self.grad_checkpointing, auto=True)
        if self.objective not in OBJECTIVES:
            raise OptionError(f"objective must be one of {', '.join(OBJECTIVES)} (got {self.objective!r})",
                              "objective")
