"""The adaptive schedule's test (:mod:`gaplan.plan.growth_test`) against its formula worked by hand, and its error
rate on windows drawn at the boundary."""

import math
import random

import pytest

from gaplan.plan.growth_test import MIN_STEPS, SHORT_WINDOW, StepNoise, Z, growth_test


def test_the_margin_is_the_mean_of_tr_s_minus_2e_g_in_standard_errors():
    # d = tr(S) - 2 x 4 x |G|^2 per step: 12 - 8 = 4, 10 - 16 = -6, 30 - 8 = 22, 20 - 8 = 12
    window = [StepNoise(12.0, 1.0), StepNoise(10.0, 2.0), StepNoise(30.0, 1.0), StepNoise(20.0, 1.0)]
    test = growth_test(window, 2.0, 4, min_steps=1)
    mean = (4 - 6 + 22 + 12) / 4
    spread = math.sqrt(sum((d - mean) ** 2 for d in (4, -6, 22, 12)) / 3)
    assert test.margin == pytest.approx(mean / (spread / 2), rel=1e-12)
    assert test.noise_scale == pytest.approx(72 / 5, rel=1e-12)  # mean tr(S) 18 over mean |G|^2 1.25
    assert test.needed == pytest.approx(Z * math.sqrt(1 + SHORT_WINDOW / 4), rel=1e-12)
    assert test.grow is (test.margin > test.needed)


def test_it_never_grows_on_fewer_than_its_minimum_steps_or_a_gradient_at_or_below_zero():
    clear = [StepNoise(100.0 + i % 2, 1.0) for i in range(MIN_STEPS)]
    assert growth_test(clear[:-1], 2.0, 4).grow is False and growth_test(clear, 2.0, 4).grow is True
    lost = [StepNoise(100.0 + i % 2, -1.0 + 0.5 * (i % 2)) for i in range(100)]
    test = growth_test(lost, 2.0, 4)
    assert test.noise_scale is None and test.grow is False
    assert StepNoise.of(math.nan, 1.0, 1.0) is None and StepNoise.of(2.0, 3.0, 4.0) == StepNoise(3.0, 8.0)


@pytest.mark.parametrize("below,rate", [(0.0, 0.08), (0.25, 0.01)])
def test_looked_at_after_every_step_it_rarely_grows_at_or_below_the_boundary(below, rate):
    """400 runs of 150 Gaussian steps whose d has mean ``-below`` standard deviations (0: B_noise exactly 2E), the
    test asked after every step: the share of runs that ever grow (5.5% and 0.25% here; docs/adaptive.md)."""
    rng = random.Random(0)
    grown = 0
    for _ in range(400):
        window = []
        for _ in range(150):
            window.append(StepNoise(8.0 + rng.gauss(-below, 1.0), 1.0))
            if growth_test(window, 2.0, 4).grow:
                grown += 1
                break
    assert grown / 400 <= rate, grown
