"""``gaplan bench``'s command line as one object: the workload's spec, the effective batch and ranks, how splits are
timed, by samples or ``--batch-by tokens`` over the data, and the run folder, checked once at construction
(:meth:`BenchCommand.__post_init__`); :func:`gaplan.workflows.run_commands.run_bench_command` runs it. The CLI parses
text into it (:func:`gaplan.workflows.parse_options.command_from_options`) and prints what it raises; a Python caller
gets the same refusals, word for word.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gaplan.benchmark.measurement import BenchSettings
from gaplan.core.checkpointing import Checkpointing, check_choice
from gaplan.core.constants import DEFAULT_EFFECTIVE_BATCH, EFFECTIVE_BATCH_HELP, PLAN_FILE_HELP
from gaplan.core.errors import GaplanError
from gaplan.core.options import OUTPUT, PLAN, TIMING, check_applies, check_positive_ints, nested, option
from gaplan.data.source import DataSource
from gaplan.runs.folder import default_run_dir
from gaplan.workflows.parse_options import (
    check_by_tokens,
    check_command_fields,
    data_given,
    granule_of,
)
from gaplan.workload.spec import WorkloadSpec

# Where the options of a bench by samples apply.
BENCH_BY_SAMPLES = "a bench by samples (`--batch-by tokens` runs `--rounds` rounds of the two plans)"
BY_SAMPLES_TIMING = ("max_rounds", "ci_target", "time_budget", "all_splits")  # timing options of a bench by samples


@dataclass(frozen=True)
class BenchCommand:
    """One ``gaplan bench``: ``spec``'s plan for ``effective_batch`` timed against its neighbours and a true large
    batch (by samples), or the token plan against the samples plan on ``source`` (``batch_by="tokens"``)."""

    spec: WorkloadSpec
    effective_batch: int = option(DEFAULT_EFFECTIVE_BATCH, section=PLAN, help=EFFECTIVE_BATCH_HELP)
    plan_file: str | None = option(None, section=PLAN, flag="--plan", metavar="PLAN.JSON", applies=BENCH_BY_SAMPLES,
                                   help=PLAN_FILE_HELP)
    world_size: int = option(1, section=PLAN, applies="`--parallel fsdp` (a DDP split is timed in one process)", help=(
        "With --parallel fsdp: the ranks (2 or more) every timed run trains on, each under the budget."))
    device: str = "auto"
    memory_limit: int | None = None
    threads: int | None = None
    grad_checkpointing: Checkpointing | str | None = None  # as given: None, the blocks, or AUTO (with plan_file)
    no_large_batch: bool = option(False, section=TIMING, applies=BENCH_BY_SAMPLES,
                                  help="Do not run the true large batch (micro-batch = E).")
    # How splits are timed; by tokens, its repeats, warmup and rounds (a fixed number, each plan once a round).
    settings: BenchSettings = nested(BenchSettings)
    batch_by: str = "samples"
    granule: int | None = None  # by tokens: a probed budget is a multiple of it (None: 64)
    source: DataSource | None = nested(DataSource)  # --data (by tokens); None without it
    command: str | None = None  # the command line, recorded in plan.json
    out: str | None = option(None, section=OUTPUT, metavar="DIR", help="Run folder (default reports/bench-<model>-<time>).")
    overwrite: bool = False  # replace the run that ``out`` holds (its files only), else that is refused

    def __post_init__(self) -> None:
        check_command_fields(self)
        check_positive_ints(effective_batch=self.effective_batch, threads=self.threads, world_size=self.world_size)
        from gaplan.devices.cpu import check_threads

        check_threads(self.threads)
        object.__setattr__(self, "source", data_given(self.source))
        check_choice(self.grad_checkpointing, self.plan_file)
        granule_of(self.granule, self.batch_by)  # kept as given: replace() checks it again
        if self.out is None:  # named once, so what is printed after names what was written
            object.__setattr__(self, "out", default_run_dir("bench", self.spec.model))
        if self.by_tokens:
            check_by_tokens(self.spec, self.source, self.world_size, "bench")
            if self.plan_file:
                raise GaplanError("--plan is a samples plan: gaplan bench --batch-by tokens probes T* and B* for --data")
            check_applies(self, BENCH_BY_SAMPLES)
            check_applies(self.settings, BENCH_BY_SAMPLES, BY_SAMPLES_TIMING)
            return
        from gaplan.plan.split import make_plan
        from gaplan.probing.edge import trial_ranks

        self.settings.check_interval()
        if self.no_large_batch:  # the flag's (a Python caller's settings may say so themselves)
            object.__setattr__(self, "settings", replace(self.settings, large_batch=False))
        if self.source is not None:
            raise GaplanError("--data applies to --batch-by tokens here (bench by samples times full-length batches)")
        if trial_ranks(self.spec, self.world_size) == 1 and self.world_size != 1:
            raise GaplanError("--world-size applies to --parallel fsdp here (every timed run trains all its ranks); "
                              "a replicated (DDP) split is timed in one process: use --world-size 1")
        make_plan(self.effective_batch, self.effective_batch, self.world_size)  # E must divide over the ranks

    @property
    def by_tokens(self) -> bool:
        return self.batch_by == "tokens"
