"""The largest token budget T* that fits, from the data's lengths and two exact probes. Torch-free.

A micro-batch packed within T tokens is ``n`` samples padded to a length ``l`` with ``n * l <= T``.
Memory grows with ``n`` at every ``l``, so the worst batches are the fullest ones at the extremes of
the data's lengths: ``T // L_max`` samples of the longest length (attention grows with the length),
and ``T // L_min`` samples of the shortest (per-sequence overheads grow with the count). The sample
probe finds the exact edge at one length, B*(L): B*(L) samples fit and B*(L) + 1 do not. So the
budget T fits both shapes exactly while ``T // L <= B*(L)``, that is ``T <= (B*(L) + 1) * L - 1``:

    T* = min over L in (L_min, L_max) of ((B*(L) + 1) * L - 1), rounded down to the granule,

and T* + granule overflows one shape by one sample, where the probe saw the OOM.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from gaplan.core.errors import GaplanError
from gaplan.core.options import OptionError

DEFAULT_GRANULE = 64  # tokens: budgets are multiples of it


@dataclass(frozen=True)
class LengthProfile:
    """The token lengths of a corpus's samples: extremes, percentiles and a histogram."""

    count: int
    shortest: int
    longest: int
    median: float
    p90: float
    p99: float
    mean: float
    histogram: tuple[tuple[int, int, int], ...]  # (from, to, samples), 10 equal bins over shortest..longest

    @classmethod
    def of(cls, lengths: Sequence[int], bins: int = 10) -> LengthProfile:
        if not lengths:
            raise GaplanError("no samples: a length profile needs at least one")
        ordered = sorted(lengths)
        low, high = ordered[0], ordered[-1]
        width = max(1, -(-(high - low + 1) // bins))
        counts: dict[int, int] = {}
        for length in ordered:
            counts[(length - low) // width] = counts.get((length - low) // width, 0) + 1
        histogram = tuple((low + b * width, min(high, low + (b + 1) * width - 1), counts.get(b, 0))
                          for b in range(-(-(high - low + 1) // width)))

        def percentile(q: float) -> float:
            return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])

        return cls(len(ordered), low, high, float(statistics.median(ordered)), percentile(0.9), percentile(0.99),
                   statistics.fmean(ordered), histogram)

    def describe(self) -> str:
        return (f"{self.count} samples of {self.shortest} to {self.longest} tokens: median {self.median:g}, "
                f"p90 {self.p90:g}, p99 {self.p99:g}, mean {self.mean:.1f}")

    def to_dict(self) -> dict:
        data = asdict(self)
        data["histogram"] = [list(row) for row in self.histogram]
        return data


@dataclass(frozen=True)
class TokenBudget:
    """T* and what it rests on: the edge B*(L) at the shortest and the longest length."""

    token_budget: int
    granule: int
    shortest: int
    longest: int
    short_edge: int  # B* at the shortest length (or the search cap it reached: the long shape binds)
    long_edge: int  # B* at the longest length
    binding: str  # "longest" or "shortest": the shape T* + granule overflows

    def describe(self) -> str:
        return (f"T* = {self.token_budget} tokens per micro-batch (granule {self.granule}): "
                f"{self.token_budget // self.longest} x {self.longest} tokens (B* {self.long_edge} at the longest) "
                f"and {self.token_budget // self.shortest} x {self.shortest} (B* {self.short_edge} at the shortest) "
                f"fit; {self.token_budget + self.granule} overflows the {self.binding}")

    def to_dict(self) -> dict:
        return asdict(self)


LONG_SEARCH_CAP = 4096  # samples of the longest length the probe tries at most (T* up to 4097 x L_max)


def check_granule(granule: int) -> int:
    if not isinstance(granule, int) or isinstance(granule, bool) or granule < 1:
        raise OptionError(f"granule must be a positive number of tokens (got {granule!r})", "granule")
    return granule


def budget_from_edges(shortest: int, short_edge: int, longest: int, long_edge: int, granule: int) -> TokenBudget:
    """T* from the exact edges at the two lengths (pure; see the module docstring)."""
    check_granule(granule)
    if not 1 <= shortest <= longest:
        raise GaplanError(f"lengths must satisfy 1 <= shortest <= longest (got {shortest}, {longest})")
    long_limit = (long_edge + 1) * longest - 1
    short_limit = (short_edge + 1) * shortest - 1
    limit = min(long_limit, short_limit)
    budget = limit // granule * granule
    if budget < longest:
        raise GaplanError(f"no token budget in granules of {granule} holds one sample of the longest length "
                          f"{longest} (it fits up to {limit} tokens): use a smaller --granule or more memory")
    return TokenBudget(budget, granule, shortest, longest, short_edge, long_edge,
                       "longest" if long_limit <= short_limit else "shortest")


def short_search_cap(longest: int, long_edge: int, shortest: int) -> int:
    """How far the probe at the shortest length need search: past ``(B*(L_max) + 1) * L_max`` tokens the long
    shape binds anyway."""
    return max(1, ((long_edge + 1) * longest - 1) // shortest)
