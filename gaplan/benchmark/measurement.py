"""What a benchmark is asked and what it answers: its settings, the splits it times, its rows and result. No torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import ClassVar

from gaplan.core.constants import LARGE_BATCH_KIND as LARGE_BATCH
from gaplan.core.constants import LARGEST_FIT_KIND as LARGEST_FIT
from gaplan.core.constants import PLAN_KIND as PLAN
from gaplan.core.constants import SPLIT_KIND as SPLIT
from gaplan.core.lines import ci_words
from gaplan.core.options import TIMING, OptionError, option, positive_finite
from gaplan.plan.split import split_text


@dataclass(frozen=True)
class BenchSettings:
    """How the splits are timed (``gaplan bench``'s options by field), checked once."""

    CONFIG_TABLE: ClassVar[str] = "timing"  # its options' table in a config file: [COMMAND.timing]

    repeats: int = option(2, section=TIMING, help="Timed optimizer steps per split in each round.")
    # The first step allocates the optimizer's states: it lies, so every trial runs untimed steps first.
    warmup: int = option(1, section=TIMING, help="Untimed optimizer steps first, in every timed run.")
    min_rounds: int = option(3, name="rounds", section=TIMING, help=(
        "Interleaved rounds at least (each times every split once, in a fresh process)."))
    max_rounds: int = option(10, section=TIMING, help="Rounds at most.")
    ci_target: float = option(0.05, section=TIMING, help=(
        "Stop once the plan's ratio to the large batch is known to this fraction (95% interval)."))
    time_budget_s: float = option(300.0, name="time_budget", section=TIMING, metavar="SECONDS", help=(
        "Past --rounds, start no round that would end after this many seconds of timing."))
    all_splits: bool = option(False, section=TIMING, help=(
        "Time every split from B* down by powers of two (default: the plan and its two neighbours)."))
    large_batch: bool = True  # also time the true large batch, the reference of the ratios

    def __post_init__(self) -> None:
        # Said by option name (rounds, time_budget), as the command line has them.
        for name, value in (("repeats", self.repeats), ("rounds", self.min_rounds), ("max_rounds", self.max_rounds)):
            if value < 1:
                raise OptionError(f"{name} must be a positive integer (got {value})", name)
        if self.warmup < 0:
            raise OptionError(f"warmup must be 0 or more (got {self.warmup})", "warmup")
        if not 0 < self.ci_target < 1:
            raise OptionError(f"ci_target must be between 0 and 1, e.g. 0.05 for ±5% (got {self.ci_target})",
                              "ci_target")
        if not positive_finite(self.time_budget_s):
            raise OptionError(f"time_budget must be positive, in seconds (got {self.time_budget_s})", "time_budget")

    def check_interval(self) -> None:
        """Rounds that stop by an interval: at most ``max_rounds``, and two at least to give one (checked where splits
        are timed by it: a bench by tokens runs a fixed number of rounds, one or more than ``max_rounds`` included)."""
        if self.max_rounds < self.min_rounds:
            raise OptionError(f"max_rounds ({self.max_rounds}) must be at least rounds ({self.min_rounds})",
                              "max_rounds", "rounds")
        if self.min_rounds < 2 and self.max_rounds > 1:
            raise OptionError("rounds must be at least 2 to give an interval (or max_rounds 1: one look, no interval)",
                              "rounds", "max_rounds")


@dataclass(frozen=True)
class SplitMeasurement:
    """One row of ``throughput.csv``: a split's rate over its rounds, with 95% intervals."""

    split: str
    kind: str  # plan | split | large-batch | largest-fit
    micro_batch: int
    grad_accum_steps: int
    effective_batch: int
    repeats: int  # timed optimizer steps, over all rounds
    step_seconds_median: float | None
    step_seconds_min: float | None
    step_seconds_max: float | None
    samples_per_s: float | None  # geometric mean of the rounds' rates
    tokens_per_s: float | None  # positions/s: bench samples are full length, so every position is a real token
    peak_bytes: int | None
    fits_budget: bool  # by the probe: its micro-batches are at most B*
    bounded: bool  # timed under the budget's allocator settings (False: as a user's run, no budget)
    ratio_to_large_batch: float | None = None
    note: str = ""
    rounds: int = 0
    samples_per_s_low: float | None = None
    samples_per_s_high: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None
    cpu_per_wall: float | None = None  # CPU seconds per wall second of its timed steps (None on CUDA)
    # The probe's peak (step) at this micro-batch, under the budget (its trial's, else the memory line's): the one
    # peak the probe, the plan and training name. ``peak_bytes`` is the resident peak while timing, without it.
    probe_peak_bytes: int | None = None


@dataclass
class BenchResult:
    """Every split measured, with ratios against the reference (the true large batch when it was run)."""

    effective_batch: int
    rows: list[SplitMeasurement] = field(default_factory=list)
    rounds: int = 0
    stopped_because: str = ""
    verdict: str = ""  # the plan against the reference, with its interval (gaplan.benchmark.stats.verdict)
    contention: str = ""  # what the timings say about the machine (gaplan.benchmark.stats.Contention.describe)
    contended: bool = False
    wall_seconds: float = 0.0
    round_rates: dict[str, list[float | None]] = field(default_factory=dict)  # samples/s of each split, round by round

    @property
    def reference(self) -> SplitMeasurement | None:
        measured = [r for r in self.rows if r.samples_per_s and r.kind in (LARGE_BATCH, LARGEST_FIT)]
        return next((r for r in measured if r.kind == LARGE_BATCH), measured[0] if measured else None)

    def best_fitting(self) -> SplitMeasurement | None:
        """The split with the highest measured samples/s among those that keep E and fit the budget."""
        candidates = [r for r in self.rows if r.kind in (PLAN, SPLIT) and r.fits_budget and r.samples_per_s]
        return max(candidates, key=lambda r: r.samples_per_s) if candidates else None

    def fastest_text(self) -> str | None:
        """The fastest split that fits, and whether it is measurably faster than the next: their rates taken round
        by round, paired as the plan's ratio is (an interval over 1 names no winner); None without one."""
        from gaplan.benchmark.stats import paired_ratio

        best = self.best_fitting()
        if best is None:
            return None
        text = f"fastest split that fits: {best.split} at {best.samples_per_s:.1f} samples/s"
        others = [r for r in self.rows if r.kind in (PLAN, SPLIT) and r.fits_budget and r.samples_per_s and r is not best]
        runner = max(others, key=lambda r: r.samples_per_s) if others else None
        rates = self.round_rates
        if runner is None or best.split not in rates or runner.split not in rates:
            return text
        ratio = paired_ratio(rates[best.split], rates[runner.split])
        if ratio is None or ratio.low is None or ratio.contains(1.0):
            return text + f" (not measurably faster than {runner.split}: x{ratio.value if ratio else 1:.2f}" + (
                f", {ci_words(ratio.low, ratio.high)})" if ratio and ratio.low is not None else ", one round)")
        return text + f" (x{ratio.value:.2f} {runner.split}, {ci_words(ratio.low, ratio.high)})"

    def plan_vs_large_batch(self) -> dict | None:
        """``{"ratio": r, "ci": [low, high], "reference": kind}``: the plan's samples/s over the reference's."""
        plan = next((r for r in self.rows if r.kind == PLAN and r.ratio_to_large_batch), None)
        reference = self.reference
        if plan is None or reference is None:
            return None
        interval = None if plan.ratio_low is None else [plan.ratio_low, plan.ratio_high]
        return {"ratio": plan.ratio_to_large_batch, "ci": interval, "reference": reference.kind,
                "verdict": self.verdict}

    def to_records(self) -> list[dict]:
        return [asdict(r) for r in self.rows]

    def to_dict(self) -> dict:
        """What ``gaplan bench --json`` prints (with the run folder)."""
        return {"effective_batch": self.effective_batch, "rounds": self.rounds, "stopped_because": self.stopped_because,
                "verdict": self.verdict, "plan_vs_large_batch": self.plan_vs_large_batch(), "contended": self.contended,
                "contention": self.contention, "wall_seconds": round(self.wall_seconds, 1),
                "round_rates": self.round_rates, "rows": self.to_records()}


def split_label(sizes: tuple[int, ...], world_size: int = 1) -> str:
    """``32 x 2``, an uneven split written out (:func:`gaplan.plan.split.split_text`), then ``x W ranks``."""
    return split_text(sizes) + (f" x {world_size} ranks" if world_size > 1 else "")


@dataclass(frozen=True)
class Job:
    """One split to time in every round: its sizes, and what its row says."""

    kind: str
    sizes: tuple[int, ...]
    fits_budget: bool
    note: str = ""


@dataclass(frozen=True)
class Outlook:
    """What a benchmark is about to time, and about how long it will take (said before it starts)."""

    labels: list[str]
    round_seconds: float | None  # expected, from the probe's trial times (None without them)
    settings: BenchSettings

    def describe(self) -> str:
        s = self.settings
        rounds = ("1 round" if s.max_rounds == 1 else f"{s.min_rounds} interleaved rounds"
                  if s.min_rounds == s.max_rounds else f"{s.min_rounds} to {s.max_rounds} interleaved rounds")
        text = f"timing {len(self.labels)} split{'s' if len(self.labels) > 1 else ''} ({', '.join(self.labels)}) in {rounds}"
        if self.round_seconds is None:
            return f"{text}, at most {_duration(s.time_budget_s)} (--time-budget)"
        least = self.round_seconds * s.min_rounds  # the minimum always runs; the budget bounds the rest
        most = max(least, min(self.round_seconds * s.max_rounds, s.time_budget_s + self.round_seconds))
        return f"{text}: about {_duration(least)}, at most {_duration(most)} (--rounds, --time-budget, --max-rounds)"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
