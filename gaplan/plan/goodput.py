"""What a measured gradient noise scale says about the effective batch: McCandlish et al. 2018's model. No torch.

Training to a given loss takes ``S = S_min (1 + B_noise / B)`` optimizer steps and ``E = E_min (1 + B / B_noise)``
samples at batch ``B``: below the noise scale a larger batch makes each step count for more, above it most of
every extra sample is wasted. At equal samples per second (accumulation keeps them nearly so), time follows samples.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


def samples_factor(batch: float, noise_scale: float) -> float:
    """``E / E_min``: the samples to reach a loss at ``batch``, over the fewest any batch needs."""
    return 1 + batch / noise_scale


def steps_factor(batch: float, noise_scale: float) -> float:
    """``S / S_min``: the optimizer steps to reach a loss at ``batch``, over the fewest any batch needs."""
    return 1 + noise_scale / batch


def balanced_batch(noise_scale: float, world_size: int = 1) -> int:
    """The power of two nearest the noise scale (and a multiple of the world size): where steps and samples each
    cost about twice their minimum."""
    power = 2 ** max(0, round(math.log2(max(noise_scale, 1.0))))
    return max(world_size, power - power % world_size)


def noise_scale_summary(effective_batch: int, noise_scale: float, world_size: int = 1) -> str:
    """One line for people: the effective batch against the measured noise scale, and what the model implies."""
    if not noise_scale > 0 or not math.isfinite(noise_scale):
        return "not positive yet (too few steps, or a loss near its minimum): nothing to say"  # the caller names it
    ratio = effective_batch / noise_scale
    other = balanced_batch(noise_scale, world_size)
    if ratio >= 2 and other < effective_batch:
        share = samples_factor(other, noise_scale) / samples_factor(effective_batch, noise_scale)
        more_steps = steps_factor(other, noise_scale) / steps_factor(effective_batch, noise_scale)
        return (f"effective batch {effective_batch} is {ratio:.1f}x the measured noise scale (~{noise_scale:.0f}): "
                f"an effective batch near {other} reaches the same loss with about {share:.0%} of the samples, "
                f"so about {share:.0%} of the time at the same samples/s, in {more_steps:.1f}x the steps "
                f"(McCandlish et al.'s model; the learning rate is yours to rescale)")
    if ratio <= 0.5 and other > effective_batch:
        share = steps_factor(other, noise_scale) / steps_factor(effective_batch, noise_scale)
        return (f"effective batch {effective_batch} is {ratio:.2f}x the measured noise scale (~{noise_scale:.0f}): "
                f"an effective batch near {other} reaches the same loss in about {share:.0%} of the steps, for "
                f"{samples_factor(other, noise_scale) / samples_factor(effective_batch, noise_scale):.1f}x the samples "
                f"(McCandlish et al.'s model; the learning rate is yours to rescale)")
    return (f"effective batch {effective_batch} is {ratio:.1f}x the measured noise scale (~{noise_scale:.0f}): near "
            f"it, steps and samples are both spent well (McCandlish et al.'s model)")


# --- Choosing the effective batch by goodput (Pollux, OSDI 2021) ---------------------------------------------------
# Pollux's statistical efficiency of batch M against the batch M0 a run was tuned at is (B_noise + M0) / (B_noise + M):
# the progress a sample makes at M relative to one at M0 (McCandlish's samples factor, inverted). Goodput is the
# measured samples/s times it: progress per second. Its argmax over M does not depend on M0.

LR_SCALINGS = ("none", "linear", "sqrt")
# A batch schedule's rule where none is given: the square root keeps Adam's update noise as the batch changes (Malladi
# et al. 2022); an unscaled rate at a small batch is the full rate on a noisy gradient.
SCHEDULE_LR_SCALING = "sqrt"


def statistical_efficiency(batch: float, noise_scale: float, reference: float) -> float:
    """Progress per sample at ``batch`` relative to ``reference`` (1 at the reference; below 1 for larger batches)."""
    return (noise_scale + reference) / (noise_scale + batch)


@dataclass(frozen=True)
class GoodputRow:
    """One effective batch: its measured samples/s, its statistical efficiency and their product."""

    effective_batch: int
    samples_per_s: float
    efficiency: float
    goodput: float

    def to_dict(self) -> dict:
        return asdict(self)


def rank_by_goodput(samples_per_s: dict[int, float], noise_scale: float, reference: int) -> list[GoodputRow]:
    """Every measured effective batch with its goodput, the best first (ties: the smaller batch, fewer samples)."""
    if not noise_scale > 0 or not math.isfinite(noise_scale):
        raise ValueError(f"the noise scale must be positive and finite (got {noise_scale})")
    rows = [GoodputRow(batch, rate, statistical_efficiency(batch, noise_scale, reference),
                       rate * statistical_efficiency(batch, noise_scale, reference))
            for batch, rate in samples_per_s.items() if rate and rate > 0]
    return sorted(rows, key=lambda row: (-row.goodput, row.effective_batch))


def candidate_effective_batches(low: int, high: int, asked: int, world_size: int = 1) -> list[int]:
    """The effective batches to time: the powers of two in [low, high], both bounds and the asked one, each a
    multiple of the world size (rounded down, never below it)."""
    if not 1 <= low <= high:
        raise ValueError(f"the effective batch range must satisfy 1 <= low <= high (got {low}:{high})")
    found = {low, high, asked} if low <= asked <= high else {low, high}
    power = 1
    while power <= high:
        if power >= low:
            found.add(power)
        power *= 2
    return sorted({max(world_size, batch - batch % world_size) for batch in found})


def scaled_learning_rate(learning_rate: float, batch: int, reference: int, rule: str) -> float:
    """The learning rate for ``batch`` when ``learning_rate`` was set for ``reference``: as is, linearly, or by
    the square root of the batch ratio."""
    if rule not in LR_SCALINGS:
        raise ValueError(f"lr scaling must be one of {', '.join(LR_SCALINGS)} (got {rule!r})")
    ratio = batch / reference
    return learning_rate * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[rule]
