"""McCandlish et al.'s trade-off as gaplan states it: pure arithmetic, checked exhaustively on a grid."""

import math

import pytest

from gaplan.plan.goodput import balanced_batch, noise_scale_summary, samples_factor, steps_factor


def test_at_the_noise_scale_steps_and_samples_each_cost_twice_their_minimum():
    for noise in (1.0, 7.5, 42.0, 1000.0):
        assert samples_factor(noise, noise) == steps_factor(noise, noise) == 2.0


def test_the_factors_move_opposite_ways_and_trade_exactly():
    for noise in (3.0, 42.0, 900.0):
        for batch in range(1, 600, 7):
            # S/S_min - 1 = B_noise / B and E/E_min - 1 = B / B_noise: their product is 1 everywhere
            assert math.isclose((steps_factor(batch, noise) - 1) * (samples_factor(batch, noise) - 1), 1.0)
            assert samples_factor(batch + 1, noise) > samples_factor(batch, noise)
            assert steps_factor(batch + 1, noise) < steps_factor(batch, noise)


def test_the_balanced_batch_is_the_nearest_power_of_two_that_the_ranks_divide():
    for noise in [0.3, 1, 1.4, 1.5, 3, 42, 45.3, 46, 1000]:
        for world in (1, 2, 4, 8):
            batch = balanced_batch(noise, world)
            assert batch % world == 0 and batch >= world
            if batch > world:
                assert abs(math.log2(batch) - math.log2(max(noise, 1))) <= 0.5 + 1e-9
    assert balanced_batch(42) == 32 and balanced_batch(46) == 64


@pytest.mark.parametrize("effective, noise, words", [
    (256, 42, ["6.1x the measured noise scale (~42)", "near 32", "25% of the samples", "2.0x the steps"]),
    (32, 200, ["0.16x", "near 256", "25% of the steps", "2.0x the samples"]),
    (64, 50, ["1.3x", "both spent well"]),
    (64, -3, ["not positive yet"]),
])
def test_the_summary_line_says_what_the_model_implies(effective, noise, words):
    line = noise_scale_summary(effective, noise)
    assert "\n" not in line
    for word in words:
        assert word in line, line
