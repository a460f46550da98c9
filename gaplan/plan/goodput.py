"""What a measured gradient noise scale says about the effective batch: McCandlish et al. 2018's model. No torch.

Training to a given loss takes ``S = S_min (1 + B_noise / B)`` optimizer steps and ``E = E_min (1 + B / B_noise)``
samples at batch ``B``: below the noise scale a larger batch makes each step count for more, above it most of
every extra sample is wasted. At equal samples per second (accumulation keeps them nearly so), time follows samples.
"""

from __future__ import annotations

import math


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
        return "noise scale: not positive yet (too few steps, or a loss near its minimum): nothing to say"
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
