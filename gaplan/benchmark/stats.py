"""The statistics of a benchmark measured in interleaved rounds: estimates, 95% intervals, verdicts. No torch.

A round times every split once, one after the other, so whatever slows the machine for a while (another job, a
thermal limit, a page cache being filled) hits all of them in that round. A ratio is therefore taken *per round*
(the plan's samples/s over the large batch's, in the same round) and its interval comes from the spread of those
paired ratios: drift that hits both cancels, and noise that hits one widens the interval instead of deciding the
verdict. Rates and ratios are positive and their noise is multiplicative (a step twice as slow, never a negative
one), so estimates are geometric means with a Student-t interval on the logarithms.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gaplan.core.lines import ci_words

CONFIDENCE = 0.95
# Student's t at 97.5% (a two-sided 95% interval), by degrees of freedom; between keys the smaller df is used,
# which makes an interval a little wider, never narrower.
_T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
          11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
          20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
# A compute-bound process keeps at least one core busy: CPU time well below wall time means it waited for a core.
CONTENDED_CPU_PER_WALL = 0.8
# Rounds of one split that differ by more than this (coefficient of variation) are noise, not the split.
CONTENDED_SPREAD = 0.15


def t_critical(degrees_of_freedom: int) -> float:
    """Student's t for a two-sided 95% interval."""
    if degrees_of_freedom < 1:
        raise ValueError("an interval needs at least two values")
    return _T_975[max(k for k in _T_975 if k <= degrees_of_freedom)]


@dataclass(frozen=True)
class Estimate:
    """A positive quantity measured ``count`` times: its geometric mean and 95% interval (None from one value)."""

    value: float
    low: float | None
    high: float | None
    count: int

    @property
    def relative_half_width(self) -> float | None:
        """How far the interval reaches either side of the estimate, as a fraction (0.05: about ±5%)."""
        if self.low is None or self.high is None:
            return None
        return math.sqrt(self.high / self.low) - 1.0

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies in the interval (an estimate without one contains everything)."""
        return self.low is None or self.high is None or self.low <= value <= self.high


def estimate(values: Sequence[float]) -> Estimate:
    """The geometric mean of positive ``values`` and its 95% interval (t on the logarithms)."""
    if not values or any(v <= 0 or not math.isfinite(v) for v in values):
        raise ValueError(f"an estimate needs positive finite values (got {list(values)!r})")
    logs = [math.log(v) for v in values]
    centre = statistics.fmean(logs)
    if len(logs) < 2:
        return Estimate(values[0], None, None, 1)
    half = t_critical(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Estimate(math.exp(centre), math.exp(centre - half), math.exp(centre + half), len(logs))


def paired_ratio(numerator: Sequence[float | None], denominator: Sequence[float | None]) -> Estimate | None:
    """The ratio of two rates measured in the same rounds: one ratio per round both measured, then :func:`estimate`."""
    ratios = [n / d for n, d in zip(numerator, denominator, strict=True) if n and d]
    return estimate(ratios) if ratios else None


def verdict(ratio: Estimate, subject: str = "the plan", reference: str = "a true large batch") -> str:
    """One sentence that names the noise; an interval that includes 1 is never called faster or slower."""
    if ratio.low is None or ratio.high is None:
        return (f"{subject} ran at {ratio.value:.2f}x {reference} in one round: no interval, so no verdict "
                "(run more rounds)")
    interval = ci_words(ratio.low, ratio.high)
    if ratio.low > 1.0:
        judged = "faster"
    elif ratio.high < 1.0:
        judged = "slower"
    else:
        judged = "no measurable difference"
    return f"{subject} runs at {ratio.value:.2f}x {reference} ({interval}: {judged})"


def spread(values: Sequence[float]) -> float | None:
    """The coefficient of variation of ``values`` (None below two)."""
    if len(values) < 2:
        return None
    return statistics.stdev(values) / statistics.fmean(values)


@dataclass(frozen=True)
class Contention:
    """Signs that something else was using the machine while the benchmark ran."""

    cpu_per_wall: float | None  # process CPU seconds per wall second of the timed steps, over every split
    worst_spread: float | None  # the largest coefficient of variation of one split's rounds
    worst_split: str | None

    @property
    def contended(self) -> bool:
        return bool((self.cpu_per_wall is not None and self.cpu_per_wall < CONTENDED_CPU_PER_WALL)
                    or (self.worst_spread is not None and self.worst_spread > CONTENDED_SPREAD))

    def describe(self) -> str:
        """One line: what was seen, or that nothing was."""
        signs = []
        if self.cpu_per_wall is not None and self.cpu_per_wall < CONTENDED_CPU_PER_WALL:
            signs.append(f"the timed steps got {self.cpu_per_wall:.2f} CPU seconds per wall second (a step that "
                         "waits for nothing gets at least 1: they waited for a core)")
        if self.worst_spread is not None and self.worst_spread > CONTENDED_SPREAD:
            signs.append(f"{self.worst_split}'s rounds differ by {self.worst_spread:.0%} (coefficient of variation)")
        if not signs:
            seen = [what for what, known in (("CPU time kept up with wall time", self.cpu_per_wall is not None),
                                             ("rounds agreed", self.worst_spread is not None)) if known]
            if not seen:  # a GPU's one round: nothing was compared
                return "contention not measured (one round, no CPU time to compare)"
            # one round has no spread to compare: said, not "rounds agreed"
            return f"no sign of contention ({'; '.join(seen)}{'' if self.worst_spread is not None else '; one round'})"
        return "the machine looks contended: " + "; ".join(signs) + ". The intervals include that noise."


def contention(cpu_seconds: float | None, wall_seconds: float, rounds_by_split: dict[str, Sequence[float]]) -> Contention:
    """From the timed steps' CPU and wall seconds (``cpu_seconds`` None where not meaningful, e.g. a GPU that
    the CPU waits for) and each split's per-round rates."""
    per_wall = cpu_seconds / wall_seconds if cpu_seconds is not None and wall_seconds > 0 else None
    spreads = {name: s for name, values in rounds_by_split.items() if (s := spread(values)) is not None}
    worst = max(spreads, key=spreads.get) if spreads else None
    return Contention(per_wall, spreads[worst] if worst else None, worst)
