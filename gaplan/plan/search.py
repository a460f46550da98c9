"""Pure search for the largest micro-batch that fits, over a ``measure(b)`` callable.

The search finds the exact edge B* (B* fits, B*+1 does not):

1. grow by doubling from ``start``;
2. once three fitted sizes lie on one line of peak memory (activations dominate;
   below that the optimizer step or gradient buffers set a flat floor), jump to
   where the line meets the budget;
3. jump again with the line redrawn through the new point (at most three
   jumps; a line that says the edge is a size already known to fit is checked
   one above it, one that says past a failure is checked one below it), then
   step up by 1.5% of the size (doubling the step) while no failure is known,
   and bisect the bracket left.

While the line is not trusted (the first secants cross the bend out of a flat
start), a doubling that the last secant says would fail is replaced by a trial
where that secant meets the budget. The doublings before any failure may be
*sketches* (a cheaper trial, e.g. one optimizer step of two): they only draw
the line, and the edge is always a size the full trial fitted; when full trials keep failing just above
a sketched size, one full trial beside it checks the sketch before bisecting further.

Without peaks (or a line) this is doubling then bisection, at most
``2*log2(B*) + 1`` trials. With a line the jump costs one trial and saves the
doublings past it; the bound ``2*log2(B*) + 2`` is checked by property tests on
devices whose memory is linear past a flat start, with a few percent of wobble.
No torch: this is plain arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gaplan.core.trial import Trial


@dataclass(frozen=True)
class SearchResult:
    """The edge found and every trial run, in order."""

    edge: int
    trials: list[Trial] = field(default_factory=list)
    capped: bool = False  # True when ``max_batch`` itself fitted: the real edge may be larger

    @property
    def trial_count(self) -> int:
        return len(self.trials)


# Full failures inside the bracket above a sketched edge before one full trial checks beside it. Measured on
# simulated devices (tests/plan/test_search.py): at 1 the check costs faithful sketches more than it saves optimistic
# ones on average; at 3 it lowers both means and cuts an optimistic sketch's worst case from 13 extra trials to 6.
SKETCH_DOUBTS = 3
MAX_JUMPS = 3  # guided trials at most; a line that missed three times is not worth following


def trial_bound(edge: int) -> int:
    """The most trials the search may use for an edge: ``floor(2*log2(B*) + 2)``."""
    return math.floor(2 * math.log2(edge) + 2 + 1e-9) if edge >= 1 else 1


def _predict_edge(points: list[tuple[int, int]], limit_bytes: int) -> int | None:
    """Edge predicted by a line through the measured peaks, or None while the line is not trusted.

    Peak memory is a maximum of a constant (at small sizes the optimizer step or a
    weight-sized gradient buffer sets it) and a line in ``b``, so the first points can
    lie on a flat stretch. The line is trusted once two consecutive secants, each over
    a doubling of ``b`` or more, agree on the slope within 15%, and the peak grew by
    at least 5% over each.
    """
    if len(points) < 3:
        return None
    points = sorted(points)

    def below_half(b: int) -> tuple[int, int] | None:
        lower = [pt for pt in points if pt[0] <= b / 2]
        return lower[-1] if lower else None

    b3, p3 = points[-1]
    second = below_half(b3)
    first = below_half(second[0]) if second else None
    if first is None:
        return None
    (b1, p1), (b2, p2) = first, second
    slope = (p3 - p2) / (b3 - b2)
    earlier = (p2 - p1) / (b2 - b1)
    if slope <= 0 or abs(slope - earlier) > 0.15 * slope:
        return None
    if p2 - p1 < 0.05 * p2 or p3 - p2 < 0.05 * p3:
        return None  # a nearly flat stretch: agreeing slopes there are noise, not activations
    return math.floor(b3 + (limit_bytes - p3) / slope)


def _secant_edge(points: list[tuple[int, int]], limit_bytes: int) -> int | None:
    """Edge predicted by the last secant over a doubling (the line not trusted yet), if the peak grew 5% over it.

    Used only where the next doubling would already overshoot it: the first secants can cross the bend out of
    the flat start, so they disagree, but the last one is the best line there is, and a trial where it meets
    the budget brackets the edge far tighter than a doubling that fails.
    """
    points = sorted(points)
    if len(points) < 2:
        return None
    b2, p2 = points[-1]
    lower = [pt for pt in points if pt[0] <= b2 / 2]
    if not lower:
        return None
    b1, p1 = lower[-1]
    if p2 <= p1 or p2 - p1 < 0.05 * p2:  # flat (peaks that read 0 too: a small trial in a large forked process)
        return None
    return math.floor(b2 + (limit_bytes - p2) * (b2 - b1) / (p2 - p1))


def find_edge(
    measure: Callable[[int], Trial],
    limit_bytes: int | None = None,
    start: int = 1,
    max_batch: int | None = None,
    sketch: Callable[[int], Trial] | None = None,
) -> SearchResult:
    """Find the largest ``b`` with ``measure(b).fits``, assuming fitting is monotone in ``b``.

    Args:
        measure: runs one trial at micro-batch ``b``; the memory line uses its ``line_peak_bytes``.
        limit_bytes: the memory the peaks are compared with; enables the guided jump.
        start: first size tried: 1, or a prediction (an estimate's B*), checked one above or
            below next and then stepped away from by a growing stride like the line's answer.
        max_batch: stop growing here; if it fits, the result is ``capped``.
        sketch: a cheaper trial (part of ``measure``'s schedule, e.g. one optimizer step of two) for the sizes
            that only draw the line: the doublings before any failure. Its failure is a failure of ``measure``
            too; its success is not final: the edge is always a size ``measure`` fitted, measured again when
            a sketch put it there (and searched on below when it then fails).

    Returns:
        The edge (0 when even ``b = 1`` does not fit) and the trials.
    """
    if start < 1 or (max_batch is not None and max_batch < 1):
        raise ValueError("start and max_batch must be positive")
    cap = max_batch
    if cap is not None:
        start = min(start, cap)
    seen: dict[int, Trial] = {}
    trials: list[Trial] = []
    lo, hi = 0, None  # lo fits (0: nothing known), hi fails (None: unknown)
    sketched: set[int] = set()  # sizes whose last trial was a sketch
    suspect = None  # the largest sketched fit when the first failure came: checked once beside it if doubted
    doubted = 0  # full failures since, inside the bracket above it

    def run(b: int, light: bool = False) -> None:
        nonlocal lo, hi, suspect, doubted
        light = light and sketch is not None
        trial = (sketch if light else measure)(b)
        (sketched.add if light else sketched.discard)(b)
        seen[b] = trial
        trials.append(trial)
        if not trial.fits:
            if hi is None and lo in sketched:
                suspect = lo
            elif hi is not None and suspect is not None and not light:
                doubted += 1
            hi = b if hi is None else min(hi, b)
        lo = max((size for size, t in seen.items() if t.fits and (hi is None or size < hi)), default=0)

    run(start, light=start == 1)
    # "grow" doubles; "guided" follows the line and then steps away from its answer;
    # "bisect" halves the bracket. The line is only taken up while growing: inside a
    # bracket bisection is already optimal and a missed jump would only cost trials.
    # A start above 1 is a prediction (an estimate's B*): verify beside it as after a jump.
    phase = "guided" if start > 1 else "grow"
    jumps = 0  # trials placed by the line
    stride = 0  # the step away from the line's answer, doubled each time
    while True:
        if lo in sketched and ((hi is not None and hi == lo + 1) or (cap is not None and lo >= cap)):
            run(lo)  # the answer would rest on a sketch: measure it in full (if it fails, search on below)
            continue
        if hi is not None and hi == lo + 1:
            return SearchResult(lo, trials)
        if hi == 1:
            return SearchResult(0, trials)
        if cap is not None and lo >= cap:
            return SearchResult(lo, trials, capped=True)
        predicted = None
        candidate = None
        if phase != "bisect" and limit_bytes is not None and jumps < MAX_JUMPS:
            points = [(b, t.line_peak_bytes) for b, t in seen.items() if t.fits and t.line_peak_bytes is not None]
            predicted = _predict_edge(points, limit_bytes)
            if predicted is None and phase == "grow" and hi is None and lo > 0:
                secant = _secant_edge(points, limit_bytes)
                if secant is not None and lo < secant < _plain_candidate(lo, hi, cap):
                    candidate, phase = secant, "secant"  # the doubling would fail: trial where the secant says
                    jumps += 1
        if phase == "grow" and predicted is not None and predicted >= lo and hi is None:
            phase = "guided"
        if candidate is None and phase == "secant":
            # The secant's answer fitted: step up from it as from the line's. It failed: the secant is less sure
            # than the line (it may have crossed the bend), so bisect the bracket, tighter than a failed doubling's.
            phase = "guided" if seen[trials[-1].micro_batch].fits else "bisect"
        if candidate is None and phase == "guided":
            if predicted is not None and lo < predicted and (hi is None or predicted < hi):
                candidate = predicted
                jumps += 1
            else:  # the line's answer was a little off: step away from the last trial, 1, ~1.5%, doubling
                last = trials[-1].micro_batch
                stride = 2 * stride if stride > 1 else (max(2, last // 64) if stride else 1)
                step = last + stride if seen[last].fits else last - stride
                if lo < step and (hi is None or step < hi):
                    candidate = step
                else:
                    phase = "bisect"
        elif phase == "grow" and hi is not None:
            phase = "bisect"
        doubt_sketch = doubted >= SKETCH_DOUBTS and lo == suspect and lo in sketched
        if candidate is None and phase == "bisect" and doubt_sketch and hi > lo + 1:
            # Full trials keep failing above the sketched edge: the sketch may have been optimistic (it passed a
            # size the full trial fails). Bisecting on would spend log2(bracket) failures finding that out; one
            # full trial beside it settles it.
            candidate, suspect = lo + 1, None
        if candidate is None:
            candidate = _plain_candidate(lo, hi, cap)
        if cap is not None:
            candidate = min(candidate, cap)
        run(candidate, light=phase == "grow" and hi is None)


def _plain_candidate(lo: int, hi: int | None, cap: int | None) -> int:
    """Doubling while no failure is known, bisection after."""
    if hi is None:
        grown = max(2 * lo, 1)
        return grown if cap is None else min(grown, cap)
    return max(1, (lo + hi) // 2)


def fit_memory_line(points: list[tuple[int, int]]) -> tuple[float, float] | None:
    """Least-squares ``(intercept, slope)`` of peak bytes over micro-batch, on the linear part.

    The flat start (small sizes, where the optimizer step sets the peak) is left out: only
    points at a quarter of the largest size or more are used, or the two largest when fewer
    than two are that large. None with fewer than two sizes.
    """
    if not points:
        return None
    largest = max(b for b, _ in points)
    used = sorted({(b, p) for b, p in points if b >= largest / 4})
    if len({b for b, _ in used}) < 2:  # the search jumped: the two largest sizes are the best line there is
        used = sorted({(b, p) for b, p in points})[-2:]
    if len({b for b, _ in used}) < 2:
        return None
    return least_squares_line(used)


def least_squares_line(points: list[tuple[int, int]]) -> tuple[float, float]:
    """``(intercept, slope)`` of the least-squares line through ``(b, peak)`` points (two sizes at least)."""
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_p = sum(p for _, p in points) / n
    slope = sum((b - mean_b) * (p - mean_p) for b, p in points) / sum((b - mean_b) ** 2 for b, _ in points)
    return mean_p - slope * mean_b, slope
