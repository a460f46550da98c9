"""The lever rows' results and the pick: the fastest row to the effective batch. No torch.

Every row that fits reaches ``E`` (its accumulation steps make up the rest), so the rows differ in time only.
The rule (:func:`pick`):

* a measured row (``samples_per_s``, from ``gaplan plan --measure``) beats every unmeasured one; among measured
  rows, the highest samples/s wins;
* otherwise the least modelled time per optimizer step (:mod:`gaplan.plan.lever_cost`), where times within
  :data:`MODEL_TIE` of the least count as a tie: the model leaves out more than that (attention, kernel launches),
  so it does not swap the optimizer or add a lever for a smaller modelled gain;
* ties go to the row with fewer levers (the smaller change to the user's workload), then to the table's order.

A measured row whose 95% interval reaches the pick's is "within the interval" (:func:`compare_measured`): the
bench cannot tell them apart, and the report says so rather than calling the pick faster.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from gaplan.plan.levers import Base, row_label, row_tradeoffs

MODEL_TIE = 0.02  # modelled times within 2% of the least are a tie (the cost model is coarser than that)


@dataclass
class LeverResult:
    """One row: its levers, what the estimate (or the probe) said, its modelled and measured time."""

    levers: tuple[str, ...]
    fits: bool | None  # None: not estimated (``note`` says why)
    max_micro_batch: int | None = None
    micro_batch: int | None = None
    grad_accum_steps: int | None = None
    peak_bytes: int | None = None  # at the plan's micro-batch
    model_seconds: float | None = None  # modelled time of one optimizer step (lever_cost)
    samples_per_s: float | None = None  # measured
    samples_per_s_low: float | None = None  # its 95% interval (None from one round)
    samples_per_s_high: float | None = None
    needed_bytes: int | None = None
    note: str = ""
    command: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return row_label(self.levers)

    def to_dict(self) -> dict:
        return asdict(self) | {"label": self.label}


def sort_key(result: LeverResult, order: int = 0) -> tuple:
    """Better first: fits; measured and fastest; else the least modelled time; then fewer levers, table order."""
    measured = result.samples_per_s is not None
    return (0 if result.fits else 1, 0 if measured else 1, -(result.samples_per_s or 0.0),
            result.model_seconds if result.model_seconds is not None else float("inf"), len(result.levers), order)


def rank(results: Iterable[LeverResult]) -> list[LeverResult]:
    """The rows, best first (:func:`sort_key`; table order breaks the last ties)."""
    return [r for _, r in sorted(enumerate(results), key=lambda pair: sort_key(pair[1], pair[0]))]


def pick(results: Iterable[LeverResult]) -> LeverResult | None:
    """The row to train with, or None when none fits (see the module for the rule)."""
    ranked = rank(results)
    if not ranked or not ranked[0].fits:
        return None
    best = ranked[0]
    if best.samples_per_s is not None or best.model_seconds is None:
        return best
    tied = [r for r in ranked if r.fits and r.samples_per_s is None and r.model_seconds is not None
            and r.model_seconds <= best.model_seconds * (1 + MODEL_TIE)]
    return min(tied, key=lambda r: (len(r.levers), ranked.index(r)))


def compare_measured(chosen: LeverResult, other: LeverResult) -> str:
    """``slower``, ``within the interval`` or ``faster``: ``other`` against the measured pick, by their intervals.

    ``faster`` means the other row's interval lies wholly above the pick's: :func:`pick` never allows it, since the
    pick has the highest rate and an interval holds its own estimate.
    """
    low = other.samples_per_s_low if other.samples_per_s_low is not None else other.samples_per_s
    high = other.samples_per_s_high if other.samples_per_s_high is not None else other.samples_per_s
    pick_low = chosen.samples_per_s_low if chosen.samples_per_s_low is not None else chosen.samples_per_s
    pick_high = chosen.samples_per_s_high if chosen.samples_per_s_high is not None else chosen.samples_per_s
    if None in (low, high, pick_low, pick_high):
        raise ValueError("both rows must be measured")
    if low > pick_high:
        return "faster"
    if high < pick_low:
        return "slower"
    return "within the interval"


@dataclass
class LeverComparison:
    """Every lever row estimated (and, with --measure, timed) for one model on one device, and the pick."""

    model: str
    device_kind: str
    target: str | None
    memory_limit_bytes: int
    usable_bytes: int
    effective_batch: int
    base: Base
    results: list[LeverResult]
    not_compared: list[tuple[str, str]] = field(default_factory=list)  # (lever, why)
    cost_source: str = ""  # the rates the modelled times are at
    measured_on: str | None = None
    seconds: float = 0.0
    workload: dict = field(default_factory=dict)  # the base row's WorkloadSpec.to_dict(): what every row changes

    @property
    def base_result(self) -> LeverResult | None:
        return next((r for r in self.results if not r.levers), None)

    def relative_time(self, result: LeverResult) -> float | None:
        """The row's modelled time over the base row's (None when either has none)."""
        base = self.base_result
        if base is None or not base.model_seconds or result.model_seconds is None:
            return None
        return result.model_seconds / base.model_seconds

    @property
    def pick(self) -> LeverResult | None:
        return pick(self.results)

    def tradeoffs(self, result: LeverResult) -> list[str]:
        """What the row costs or changes against the base, one sentence a lever."""
        return row_tradeoffs(result.levers, self.base)

    def within_interval(self) -> list[LeverResult]:
        """The measured rows the bench cannot tell from the measured pick."""
        chosen = self.pick
        if chosen is None or chosen.samples_per_s is None:
            return []
        return [r for r in self.results if r is not chosen and r.fits and r.samples_per_s is not None
                and compare_measured(chosen, r) == "within the interval"]

    def to_dict(self) -> dict:
        chosen = self.pick
        data = {k: v for k, v in asdict(self).items() if k not in ("results", "base", "not_compared")}
        data["base"] = {**asdict(self.base), "loss": str(self.base.loss)}  # its text, as --loss takes it
        data["results"] = [self._row(r) for r in self.results]
        data["pick"] = self._row(chosen) if chosen is not None else None
        data["not_compared"] = [{"lever": name, "why": why} for name, why in self.not_compared]
        data["within_interval"] = [r.label for r in self.within_interval()]
        data["seconds"] = round(self.seconds, 3)
        return data

    def _row(self, result: LeverResult) -> dict:
        return result.to_dict() | {"relative_time": self.relative_time(result), "tradeoffs": self.tradeoffs(result)}
