"""The edge search over traced sizes: a line through the micro-steps' peaks, then the whole step traced at the edge.

The micro-steps are traced at two (or more) sizes; the line through the two largest predicts the
largest micro-batch ``B*`` that fits. The whole step is then traced at ``B*`` and ``B* + 1``, and
the prediction corrected (secant, then bisection) until the edge is exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gaplan.core.errors import DoesNotFit, GaplanError
from gaplan.core.units import format_bytes
from gaplan.plan.search import least_squares_line

if TYPE_CHECKING:
    from gaplan.estimate.budget import Budget
    from gaplan.estimate.trace import Tracer
    from gaplan.workload.build import WorkloadSpec

DEFAULT_SIZES = (1, 2)  # micro-batches whose micro-steps draw the line
MAX_CHECK_TRACES = 12  # full-step traces spent finding the exact edge after the prediction


def check_sizes(sizes: Sequence[int] | None) -> tuple[int, ...]:
    """The traced sizes, sorted and distinct (:data:`DEFAULT_SIZES` for None)."""
    if sizes is None:
        return DEFAULT_SIZES
    values = sorted({int(s) for s in sizes}) if all(isinstance(s, int) and s >= 1 for s in sizes) else []
    if len(values) < 2:
        raise GaplanError(f"the traced sizes must be at least two different positive integers (got {list(sizes)})")
    return tuple(values)


def secant(points: dict[int, int]) -> tuple[float, float]:
    """(intercept, slope) of the line through the two largest traced sizes."""
    (b1, p1), (b2, p2) = sorted(points.items())[-2:]
    slope = (p2 - p1) / (b2 - b1)
    return p2 - slope * b2, slope


def predict(points: dict[int, int], budget: int, cap: int) -> int:
    """The largest micro-batch (1 to ``cap``) whose point on the secant is within ``budget``."""
    intercept, slope = secant(points)
    if slope <= 0:
        return cap
    return max(1, min(cap, math.floor((budget - intercept) / slope)))


def find_edge(tracer: Tracer, the_budget: Budget, sizes: tuple[int, ...], cap: int,
              spec: WorkloadSpec) -> tuple[int, bool, tuple[float, float]]:
    """(B*, capped, line). Raises DoesNotFit when micro-batch 1 does not fit."""
    usable = the_budget.usable_bytes
    optimizer_step = tracer.optimizer_step()
    if optimizer_step.peak_bytes > usable:
        raise DoesNotFit(
            f"{spec.model} does not fit in {the_budget.in_words}: weights, gradients and optimizer states with the "
            f"optimizer step's temporaries take {format_bytes(optimizer_step.peak_bytes)} before any activation",
            optimizer_step.peak_bytes)
    # The line is drawn through tracked bytes; the device's overhead (CPU only) is a constant over it.
    micro_rows = {b: tracer.micro_steps(b) for b in sizes}
    line_points = {b: row.tracked_total for b, row in micro_rows.items()}
    steps: dict[int, bool] = {}  # micro-batch -> the whole step fits

    def budget() -> int:
        return usable - tracer.overhead()

    def bracket() -> tuple[int, int | None]:
        lo = max((b for b, fits in steps.items() if fits), default=0)
        hi = min((b for b, fits in steps.items() if not fits), default=None)
        return lo, hi

    candidate = predict(line_points, budget(), cap)
    for _ in range(MAX_CHECK_TRACES):
        lo, hi = bracket()
        if hi == 1:
            row = tracer.last_step(1)
            raise DoesNotFit(f"{spec.model} does not fit in {the_budget.in_words} even at micro-batch 1: one step's "
                             f"peak is {format_bytes(row.peak_bytes)}", row.peak_bytes)
        if lo >= cap:
            return cap, True, least_squares_line(sorted(line_points.items()))
        if hi is not None and hi == lo + 1:
            return lo, False, least_squares_line(sorted(line_points.items()))
        b = min(max(candidate, lo + 1), hi - 1 if hi is not None else cap)
        if b in micro_rows:  # both phases already traced at b, and they never overlap: the step's peak is the larger
            row = tracer.composed_step(micro_rows[b], optimizer_step)
        else:
            row = tracer.step(b)
        steps[b] = row.peak_bytes <= usable
        if row.tracked_total > optimizer_step.tracked_total:  # the micro-steps set this peak: a point of the line
            line_points[b] = row.tracked_total
        lo, hi = bracket()
        predicted = predict(line_points, budget(), cap)
        if len(steps) >= MAX_CHECK_TRACES // 2:  # the line keeps missing: bisect (or double) what is left
            candidate = (lo + hi) // 2 if hi is not None else 2 * lo
        elif steps[b]:
            candidate = predicted if predicted > b else b + 1
        else:
            candidate = predicted if predicted < b else b - 1
    raise GaplanError(f"{spec.model}: the estimate did not settle on an edge in {MAX_CHECK_TRACES} traces")
