"""Pure search for the largest micro-batch that fits, over a ``measure(b)`` callable.

The search finds the exact edge B* (B* fits, B*+1 does not). Peak memory is close
to linear in the micro-batch, so once two sizes have fitted, the line through the
two largest predicts the edge; the search jumps there and verifies both sides.
A guided jump is only taken when, whatever its outcome, plain doubling and
bisection could still finish within ``2*log2(B*) + 2`` trials for every edge the
line leaves plausible (at least half its prediction). So the bound holds for any
``measure`` that reports no peaks (plain search) and for any whose memory line
predicts the edge within a factor of two; real peaks are linear to a few percent.
No torch: this is plain arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class Observation(Protocol):
    """What one trial taught: did it fit, and (when it did) its peak bytes."""

    @property
    def fits(self) -> bool: ...

    @property
    def peak_bytes(self) -> int | None: ...


@dataclass(frozen=True)
class SearchResult:
    """The edge found and every trial run, in order, as ``(micro_batch, observation)``."""

    edge: int
    trials: list[tuple[int, Observation]] = field(default_factory=list)
    capped: bool = False  # True when ``max_batch`` itself fitted: the real edge may be larger

    @property
    def trial_count(self) -> int:
        return len(self.trials)


def trial_bound(edge: int) -> int:
    """The most trials the search may use for an edge: ``floor(2*log2(B*) + 2)``."""
    return math.floor(2 * math.log2(edge) + 2 + 1e-9) if edge >= 1 else 1


def _fallback_cost(lo: int, hi: int | None) -> int:
    """Worst-case trials left for plain doubling + bisection, beyond the edge-dependent part.

    With ``hi`` known, bisection of ``(lo, hi)`` takes ``ceil(log2(hi - lo))`` trials.
    With ``hi`` unknown, doubling to the first failure then bisecting costs
    ``2j + 1 + ceil(log2 lo)`` for an edge in ``[2^j lo, 2^(j+1) lo)``; the ``2j``
    cancels against the bound, so only ``1 + ceil(log2 lo)`` is returned.
    """
    if hi is None:
        return 1 + math.ceil(math.log2(lo) - 1e-9)
    return math.ceil(math.log2(hi - lo) - 1e-9) if hi - lo > 1 else 0


def _predict_edge(points: list[tuple[int, int]], limit_bytes: int) -> int | None:
    """Edge predicted by a line through the measured peaks, or None.

    The line goes through the largest fitting size and a point far enough below it
    (the largest at or under half its size) for the slope not to drown in noise.
    """
    if len(points) < 2:
        return None
    points = sorted(points)
    b2, p2 = points[-1]
    below = [pt for pt in points[:-1] if pt[0] <= b2 / 2]
    b1, p1 = below[-1] if below else points[0]
    slope = (p2 - p1) / (b2 - b1)
    if slope <= 0:
        return None
    return math.floor(b2 + (limit_bytes - p2) / slope)


def find_edge(
    measure: Callable[[int], Observation],
    limit_bytes: int | None = None,
    start: int = 1,
    max_batch: int | None = None,
) -> SearchResult:
    """Find the largest ``b`` with ``measure(b).fits``, assuming fitting is monotone in ``b``.

    Args:
        measure: runs one trial at micro-batch ``b``.
        limit_bytes: the memory the peaks are compared with; enables guided jumps.
        start: first size tried (an estimate's prediction, or 1).
        max_batch: stop growing here; if it fits, the result is ``capped``.

    Returns:
        The edge (0 when even ``b = 1`` does not fit) and the trials.
    """
    if start < 1 or (max_batch is not None and max_batch < 1):
        raise ValueError("start and max_batch must be positive")
    if max_batch is not None:
        start = min(start, max_batch)
    seen: dict[int, Observation] = {}
    trials: list[tuple[int, Observation]] = []
    lo, hi = 0, None  # lo fits (0: nothing known), hi fails (None: unknown)
    walked_down = False  # the line already sent us just under a failure, and it failed too

    def run(b: int) -> bool:
        nonlocal lo, hi
        observation = measure(b)
        seen[b] = observation
        trials.append((b, observation))
        if observation.fits:
            lo = max(lo, b)
        else:
            hi = b if hi is None else min(hi, b)
        return observation.fits

    run(start)
    while True:
        if hi is not None and hi == lo + 1:
            return SearchResult(lo, trials)
        if hi == 1:
            return SearchResult(0, trials)
        if max_batch is not None and lo >= max_batch:
            return SearchResult(lo, trials, capped=True)
        points = [(b, o.peak_bytes) for b, o in seen.items() if o.fits and o.peak_bytes is not None]
        predicted = _predict_edge(points, limit_bytes) if limit_bytes is not None else None
        candidate = _guided_candidate(seen, lo, hi, predicted, max_batch)
        if candidate is not None and hi is not None and candidate == hi - 1 and walked_down:
            candidate = None  # the line keeps overshooting: stop trusting it on this side
        if candidate is None or not _guided_is_safe(len(trials) + 1, lo, hi, candidate, predicted):
            candidate = _plain_candidate(lo, hi, max_batch, predicted)
            walked_down = False
        elif hi is not None and candidate == hi - 1:
            walked_down = True
        run(candidate)


def _plausible(predicted: int | None) -> tuple[int, int | None]:
    """The sizes the line leaves plausible for the edge: within a factor of two of its prediction."""
    if predicted is None:
        return 0, None
    return max(predicted, 1) // 2, 2 * max(predicted, 1) + 1


def _plain_candidate(lo: int, hi: int | None, max_batch: int | None, predicted: int | None) -> int:
    """Doubling while no failure is known, bisection after, both kept to the plausible sizes."""
    plausible_lo, plausible_hi = _plausible(predicted)
    if hi is None:
        grown = max(2 * lo, 1)
        if plausible_hi is not None and lo < plausible_hi < grown:
            grown = plausible_hi
        return grown if max_batch is None else min(grown, max_batch)
    low = max(lo, plausible_lo - 1) if plausible_lo - 1 < hi - 1 else lo
    return max(1, (low + hi) // 2) if low >= 1 else max(1, hi // 2)


def _guided_is_safe(used: int, lo: int, hi: int | None, candidate: int, predicted: int | None) -> bool:
    """Whatever the guided trial shows, can plain search still finish within the bound?

    Edges are assumed to lie within a factor of two of the line's prediction, and
    the plain search that follows keeps to those sizes, so the accounting matches.
    """
    if predicted is None:
        return False
    plausible_lo, plausible_hi = _plausible(predicted)
    upper = plausible_hi if hi is None else min(hi, plausible_hi)
    # it fits: the edge is in [candidate, upper)
    if candidate + 1 < upper and used + _fallback_cost(candidate, upper) > trial_bound(candidate):
        return False
    # it fails: the edge is in [max(lo, plausible_lo), candidate)
    if lo < 1:
        return True
    low = max(lo, plausible_lo - 1) if plausible_lo - 1 < candidate - 1 else lo
    return used + _fallback_cost(low, candidate) <= trial_bound(max(lo, min(plausible_lo, candidate - 1)))


def _guided_candidate(
    seen: dict[int, Observation], lo: int, hi: int | None, predicted: int | None, max_batch: int | None
) -> int | None:
    """The size the memory line points at, kept strictly inside the bracket."""
    if predicted is None:
        return None
    upper = hi - 1 if hi is not None else None
    if max_batch is not None:
        upper = max_batch if upper is None else min(upper, max_batch)
    if predicted <= lo:
        candidate = lo + 1  # the line says lo is the edge: verify the side above it
    elif upper is not None and predicted >= upper:
        candidate = upper  # the line says hi-1 or more: verify just under the failure
    else:
        candidate = predicted
    if candidate in seen or candidate <= lo or (hi is not None and candidate >= hi):
        return None
    return candidate
