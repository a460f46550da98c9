"""McCandlish et al.'s trade-off as gaplan states it: pure arithmetic, checked exhaustively on a grid."""

import math

import pytest

from gaplan.plan.goodput import (
    balanced_batch,
    candidate_effective_batches,
    noise_scale_summary,
    rank_by_goodput,
    samples_factor,
    scaled_learning_rate,
    statistical_efficiency,
    steps_factor,
)


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
    assert not line.startswith("noise scale"), line  # its callers name it ("noise scale: noise scale: ..." was said)
    for word in words:
        assert word in line, line


def test_statistical_efficiency_is_pollux_s_and_inverts_the_samples_factor():
    for noise in (0.5, 3.0, 16.0, 400.0):
        for reference in (1, 8, 64, 256):
            assert statistical_efficiency(reference, noise, reference) == 1.0
            for batch in (1, 2, 5, 64, 1024):
                efficiency = statistical_efficiency(batch, noise, reference)
                assert efficiency == pytest.approx(samples_factor(reference, noise) / samples_factor(batch, noise))
                assert (efficiency < 1) == (batch > reference)


def test_goodput_ranks_by_rate_times_efficiency_and_its_choice_does_not_depend_on_the_reference():
    rates = {4: 68.0, 8: 83.9, 16: 83.8, 32: 90.7, 64: 92.0, 128: 93.5}  # examples/noise_scale_time_to_loss.py
    for noise in (0.5, 2.0, 16.0, 64.0, 500.0, 1e5):
        choices = set()
        for reference in rates:
            rows = rank_by_goodput(rates, noise, reference)
            assert [r.goodput for r in rows] == sorted((r.goodput for r in rows), reverse=True)
            for row in rows:
                assert row.goodput == pytest.approx(rates[row.effective_batch]
                                                    * statistical_efficiency(row.effective_batch, noise, reference))
            choices.add(rows[0].effective_batch)
        assert len(choices) == 1, (noise, choices)
    assert rank_by_goodput(rates, 16.3, 64)[0].effective_batch == 8  # that run's measured noise scale
    assert rank_by_goodput({4: 70.0, 8: 84.0}, 16.0, 64)[0].effective_batch == 4  # a tie (280 each): fewer samples
    assert rank_by_goodput(rates, 1e5, 64)[0].effective_batch == 128  # no noise: the fastest wins
    assert rank_by_goodput({8: 10.0, 16: 20.0}, 1e9, 8)[0].effective_batch == 16
    assert [r.effective_batch for r in rank_by_goodput({4: 0.0, 8: None, 16: 5.0}, 4.0, 8)] == [16]  # unmeasured out
    with pytest.raises(ValueError, match="positive"):
        rank_by_goodput(rates, 0.0, 64)
    with pytest.raises(ValueError, match="positive"):
        rank_by_goodput(rates, math.nan, 64)


def test_candidates_are_the_powers_of_two_in_range_its_ends_and_the_asked_batch_divisible_by_the_ranks():
    assert candidate_effective_batches(4, 128, 64) == [4, 8, 16, 32, 64, 128]
    assert candidate_effective_batches(3, 100, 48) == [3, 4, 8, 16, 32, 48, 64, 100]
    assert candidate_effective_batches(4, 16, 64) == [4, 8, 16]  # the asked batch is outside the range
    assert candidate_effective_batches(6, 6, 6) == [6]
    for world in (1, 2, 3, 4, 8):
        for low in range(1, 40):
            for high in range(low, 80, 7):
                found = candidate_effective_batches(low, high, high, world)
                assert found == sorted(set(found))
                assert all(b % world == 0 and b >= world for b in found)
                assert all(min(low, world) <= b <= max(high, world) for b in found)
    with pytest.raises(ValueError):
        candidate_effective_batches(8, 4, 4)


def test_the_learning_rate_scales_as_asked_and_never_silently():
    assert scaled_learning_rate(1e-3, 8, 64, "none") == 1e-3
    assert scaled_learning_rate(1e-3, 8, 64, "linear") == pytest.approx(1.25e-4)
    assert scaled_learning_rate(1e-3, 8, 64, "sqrt") == pytest.approx(1e-3 / math.sqrt(8))
    assert scaled_learning_rate(1e-3, 256, 64, "linear") == pytest.approx(4e-3)
    with pytest.raises(ValueError, match="linear"):
        scaled_learning_rate(1e-3, 8, 64, "cubic")
