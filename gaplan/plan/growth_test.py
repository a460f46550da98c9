"""The adaptive schedule's decision: is the gradient noise scale at least ``threshold`` times the batch? No torch.

Each measured step gives unbiased estimates of ``tr(S)`` and ``|G|^2`` (:mod:`gaplan.training.noise_scale`, one
step's, not smoothed), so ``d = tr(S) - c |G|^2`` with ``c = threshold x E x items per sample`` has mean
``tr(S) - c |G|^2``, positive exactly when ``B_noise >= threshold x E`` in samples. A ratio of noisy means is skewed
and a smoothed one long remembers the old batch; this mean is neither: the test is on the mean of ``d`` over the steps
measured at the current batch (the window, reset at each change, its last :data:`WINDOW` steps), Fieller's way of
testing a ratio.

The batch doubles when that mean clears zero by ``z sqrt(1 + n0 / n)`` standard errors (``n`` steps in the window,
at least :data:`MIN_STEPS`). The widening for short windows has the shape of Robbins' normal-mixture boundary
(Robbins 1970; Howard et al. 2021, "time-uniform confidence sequences"): a test looked at after every step must be
stricter while it has few steps, and more so for a per-step estimate that is heavy-tailed (two micro-batches of one
sample each: kurtosis near 90 on the regression in the tests). ``|G|^2`` averaging at or below zero is not
measured: no growth. The error rates and delays this gives on problems with a known noise scale are in
docs/adaptive.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z = 2.0  # standard errors the window's mean must clear, for a long window
SHORT_WINDOW = 40.0  # n0: the bound is sqrt(1 + n0 / n) wider at n steps (2.24 x z at 10 steps, 1.41 x at 40)
MIN_STEPS = 10  # no decision on fewer steps at the current batch
WINDOW = 150  # the window's longest: the noise scale drifts as training goes on, and older steps are staler


@dataclass(frozen=True)
class StepNoise:
    """One step's own (unsmoothed, unbiased) estimates: ``tr(S)`` per item, and ``|G|^2`` per item times the
    step's items per sample (so ``grad_var / grad_sq`` is the noise scale in samples)."""

    grad_var: float
    grad_sq: float

    @classmethod
    def of(cls, grad_sq: float, grad_var: float, items_per_sample: float) -> StepNoise | None:
        """From a step's per-item estimates; None where they are not finite (nothing measured)."""
        if not (math.isfinite(grad_sq) and math.isfinite(grad_var) and items_per_sample > 0):
            return None
        return cls(float(grad_var), float(grad_sq) * items_per_sample)


@dataclass(frozen=True)
class GrowthTest:
    """The test of ``B_noise >= threshold x batch`` over a window of steps: the window's noise scale, and by how
    many standard errors its ``d`` mean cleared zero against how many it had to."""

    steps: int
    noise_scale: float | None  # mean tr(S) / mean |G|^2 over the window, in samples (None: |G|^2 <= 0)
    margin: float  # the mean of d in standard errors (-inf where not measurable)
    needed: float  # what it had to clear
    grow: bool

    def describe(self, threshold: float, batch: int) -> str:
        shown = f"{self.noise_scale:.1f}" if self.noise_scale is not None else "not measured (|G|^2 <= 0)"
        return (f"noise scale {shown} over the {self.steps} steps at {batch}: {self.margin:.2f} standard errors above "
                f"{threshold:g} x {batch}, {self.needed:.2f} needed")


def growth_test(window: Sequence[StepNoise], threshold: float, batch: int, z: float = Z,
                short_window: float = SHORT_WINDOW, min_steps: int = MIN_STEPS) -> GrowthTest:
    """Whether the steps of ``window``, all measured at effective batch ``batch``, show ``B_noise >= threshold x
    batch``."""
    n = len(window)
    needed = z * math.sqrt(1 + short_window / n) if n else math.inf
    if n < 2:
        return GrowthTest(n, None, -math.inf, needed, False)
    mean_var = math.fsum(s.grad_var for s in window) / n
    mean_sq = math.fsum(s.grad_sq for s in window) / n
    scale = mean_var / mean_sq if mean_sq > 0 else None
    c = threshold * batch
    d = [s.grad_var - c * s.grad_sq for s in window]
    mean = math.fsum(d) / n
    spread = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1))
    if spread > 0:
        margin = mean / (spread / math.sqrt(n))
    else:
        margin = math.inf if mean > 0 else -math.inf
    grow = scale is not None and n >= min_steps and margin > needed
    return GrowthTest(n, scale, margin, needed, grow)
