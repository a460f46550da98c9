"""Throughput of the plan against other splits and against a true large batch.

Gradient accumulation makes a large batch fit; it does not make it fast. For the
effective batch E this times whole optimizer steps (warm-up steps excluded,
several repeats, median and spread) for the plan, for every micro-batch from B*
down by powers of two (each with its accumulation steps), and for the true large
batch (micro-batch E, no accumulation). Every run is a fresh trial process under
the probe's budget. On CPU a large batch that does not fit is run without the
budget, for reference, and labelled so; on CUDA it is not run: the memory line
says what it would need, and the largest batch that fits is the reference.

A sharded workload (``--parallel fsdp``) is timed as it trains: every run is a trial of all W ranks
(:mod:`gaplan.worker.ranks`), each rank takes E/W samples per step split into its micro-batches, the
step time is the slowest rank's, and samples/s count the whole step (E samples over all ranks).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from gaplan.core.constants import LARGE_BATCH_KIND as LARGE_BATCH
from gaplan.core.constants import LARGEST_FIT_KIND as LARGEST_FIT
from gaplan.core.constants import PLAN_KIND as PLAN
from gaplan.core.constants import SPLIT_KIND as SPLIT
from gaplan.core.errors import GaplanError
from gaplan.core.trial import Trial
from gaplan.core.units import format_bytes
from gaplan.devices.cpu import available_bytes as cpu_available_bytes
from gaplan.plan.search import fit_memory_line
from gaplan.plan.split import make_plan
from gaplan.runs.probe_result import ProbeResult
from gaplan.worker.client import WorkerProcess


@dataclass(frozen=True)
class SplitMeasurement:
    """One row of ``throughput.csv``."""

    split: str
    kind: str  # plan | split | large-batch | largest-fit
    micro_batch: int
    grad_accum_steps: int
    effective_batch: int
    repeats: int
    step_seconds_median: float | None
    step_seconds_min: float | None
    step_seconds_max: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    peak_bytes: int | None
    fits_budget: bool
    bounded: bool  # measured under the budget (False: a reference run without it)
    ratio_to_large_batch: float | None = None
    note: str = ""


@dataclass
class BenchResult:
    """Every split measured, with ratios against the reference (the true large batch when it was run)."""

    effective_batch: int
    rows: list[SplitMeasurement] = field(default_factory=list)

    @property
    def reference(self) -> SplitMeasurement | None:
        measured = [r for r in self.rows if r.samples_per_s and r.kind in (LARGE_BATCH, LARGEST_FIT)]
        return next((r for r in measured if r.kind == LARGE_BATCH), measured[0] if measured else None)

    def best_fitting(self) -> SplitMeasurement | None:
        """The split with the highest measured samples/s among those that keep E and fit the budget."""
        candidates = [r for r in self.rows if r.kind in (PLAN, SPLIT) and r.fits_budget and r.samples_per_s]
        return max(candidates, key=lambda r: r.samples_per_s) if candidates else None

    def to_records(self) -> list[dict]:
        return [asdict(r) for r in self.rows]


def candidate_splits(effective_batch: int, max_micro_batch: int, world_size: int = 1) -> list[tuple[str, tuple[int, ...]]]:
    """The plan, then B*, B*/2, B*/4, ... 1 (each as an even split of E), without repeats: (kind, sizes).

    Over ``world_size`` ranks the sizes are one rank's (of its E/W samples per step).
    """
    splits = [(PLAN, make_plan(effective_batch, max_micro_batch, world_size).micro_batch_sizes)]
    micro = max_micro_batch
    while micro >= 1:
        sizes = make_plan(effective_batch, micro, world_size).micro_batch_sizes
        if all(sizes != s for _, s in splits):
            splits.append((SPLIT, sizes))
        micro //= 2
    return splits


def bench(
    probed: ProbeResult,
    effective_batch: int | None = None,
    repeats: int = 3,
    warmup: int = 1,
    threads: int | None = None,
    large_batch: bool = True,
    on_row: Callable[[SplitMeasurement], None] | None = None,
    available_bytes: Callable[[], int | None] | None = None,
    splits: list[tuple[str, tuple[int, ...]]] | None = None,
    over_ranks: bool = False,
) -> BenchResult:
    """Time the splits of ``effective_batch`` (default: the probe's plan) on the probe's device and budget.

    Args:
        splits: ``(kind, sizes)`` to time instead of :func:`candidate_splits`.
        large_batch: also time the true large batch (the reference of the ratios).
        over_ranks: time a replicated (DDP) plan over its W ranks too, each rank a process with E/W samples
            and DDP's all-reduce, as a sharded plan always is (``gaplan plan --measure`` compares them).
    """
    if repeats < 1 or warmup < 0:
        raise GaplanError(f"--repeats must be at least 1 and --warmup at least 0 (got {repeats}, {warmup})")
    effective = effective_batch or probed.plan.effective_batch
    # A sharded workload is timed over its ranks (each trial runs all of them); anything else in one process.
    world = probed.plan.world_size if probed.workload.parallel == "fsdp" or over_ranks else 1
    make_plan(effective, effective, world)  # a bad effective batch fails here, before any work
    share = effective // world  # one rank's samples per step
    edge = probed.max_micro_batch
    result = BenchResult(effective)
    available_bytes = available_bytes or cpu_available_bytes

    def add(row: SplitMeasurement) -> None:
        result.rows.append(row)
        if on_row is not None:
            on_row(row)

    with WorkerProcess(probed.workload, probed.device, probed.probe_limit_bytes, threads=threads,
                       ranks=world) as worker:
        def measure(kind: str, sizes: tuple[int, ...], unbounded: bool = False, note: str = "") -> SplitMeasurement:
            outcome = worker.trial(max(sizes), optimizer_steps=warmup + repeats, sizes=list(sizes), unbounded=unbounded)
            return _row(kind, sizes, outcome, warmup, repeats, unbounded, note, world)

        for kind, sizes in candidate_splits(effective, edge, world) if splits is None else splits:
            add(measure(kind, sizes))
        if large_batch:
            same = next((r for r in result.rows if r.grad_accum_steps == 1 and r.samples_per_s), None)
            if share <= edge and same is not None:  # the plan is the large batch already: no second run
                add(_with_note(SplitMeasurement(**{**asdict(same), "kind": LARGE_BATCH}),
                               "the same run as the plan: E fits in one micro-batch"))
            elif share <= edge:
                add(measure(LARGE_BATCH, (share,)))
            else:
                need = _predicted_need(probed, share)
                budget = format_bytes(probed.probe_limit_bytes) if probed.probe_limit_bytes else None
                free = available_bytes() if probed.device == "cpu" else None
                if probed.device == "cpu" and (need is None or free is None or need * world < 0.8 * free):
                    row = measure(LARGE_BATCH, (share,), unbounded=True)
                    # Not "needs <peak>": the peak is resident memory, which reads below the budget's address-space
                    # count. What is known is that E > B*, and B*+1 ran out of memory.
                    note = (f"over the {budget} budget (B* = {edge}); measured unbounded for reference" if budget
                            else "measured without a budget for reference (no probe ran)")
                    add(_with_note(row, note))
                else:
                    where = ("this machine's free memory" if probed.device == "cpu"
                             else f"the {budget} budget" if budget else "the device's memory")
                    per_rank = " per rank" if world > 1 else ""
                    add(_not_run(effective, f"needs ~{format_bytes(need)}{per_rank} (from the memory line), more than "
                                            f"{where}; not run", world))
                    add(measure(LARGEST_FIT, (edge,), note=f"the largest batch that fits ({edge}), as the reference"))
    reference = result.reference
    if reference is not None and reference.samples_per_s:
        result.rows = [_with_ratio(r, reference.samples_per_s) for r in result.rows]
    return result


def _row(kind: str, sizes: tuple[int, ...], trial: Trial, warmup: int, repeats: int, unbounded: bool,
         note: str, world_size: int = 1) -> SplitMeasurement:
    effective = sum(sizes) * world_size  # ``sizes`` are one rank's; every rank takes as many
    label = _label(sizes, world_size)
    if not trial.fits:
        return SplitMeasurement(label, kind, max(sizes), len(sizes), effective, 0, None, None, None, None, None, None,
                                False, not unbounded, note=f"out of memory: {trial.error}")
    timed = trial.step_seconds[warmup:]
    median = statistics.median(timed)
    tokens = trial.tokens_per_step
    return SplitMeasurement(label, kind, max(sizes), len(sizes), effective, len(timed), median, min(timed), max(timed),
                            effective / median, tokens / median if tokens else None, trial.peak_bytes,
                            fits_budget=not unbounded, bounded=not unbounded, note=note)


def _label(sizes: tuple[int, ...], world_size: int = 1) -> str:
    micro = max(sizes)
    uneven = "" if len(set(sizes)) == 1 else f" ({min(sizes)}-{micro})"
    ranks = f" x {world_size} ranks" if world_size > 1 else ""
    return f"{micro} x {len(sizes)}{uneven}{ranks}"


def _not_run(effective: int, note: str, world_size: int = 1) -> SplitMeasurement:
    share = effective // world_size
    return SplitMeasurement(_label((share,), world_size), LARGE_BATCH, share, 1, effective, 0, None, None, None, None,
                            None, None, False, False, note=note)


def _with_note(row: SplitMeasurement, note: str) -> SplitMeasurement:
    return SplitMeasurement(**{**asdict(row), "note": note})


def _with_ratio(row: SplitMeasurement, reference: float) -> SplitMeasurement:
    ratio = round(row.samples_per_s / reference, 4) if row.samples_per_s else None
    return SplitMeasurement(**{**asdict(row), "ratio_to_large_batch": ratio})


def _predicted_need(probed: ProbeResult, micro_batch: int) -> int | None:
    """Peak bytes at ``micro_batch`` from the line through the probe's measured peaks."""
    points = [(t.micro_batch, t.line_peak_bytes) for t in probed.trials if t.fits and t.line_peak_bytes]
    line = fit_memory_line(points)
    return None if line is None else int(line[0] + line[1] * micro_batch)
