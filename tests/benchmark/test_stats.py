"""The benchmark's statistics: estimates, intervals, verdicts and contention. Pure arithmetic, no torch."""

import itertools
import math
import random
import statistics

import pytest

from gaplan.benchmark.stats import (
    CONTENDED_CPU_PER_WALL,
    CONTENDED_SPREAD,
    Estimate,
    contention,
    estimate,
    paired_ratio,
    t_critical,
    verdict,
)


def test_t_critical_matches_the_table_and_never_narrows_between_keys():
    assert t_critical(1) == pytest.approx(12.706)
    assert t_critical(2) == pytest.approx(4.303)
    assert t_critical(30) == pytest.approx(2.042)
    assert t_critical(22) == t_critical(20)  # between keys: the smaller df, the wider interval
    assert t_critical(10_000) == pytest.approx(1.980)
    values = [t_critical(df) for df in range(1, 200)]
    assert all(a >= b for a, b in itertools.pairwise(values)), "t falls as the degrees of freedom grow"
    with pytest.raises(ValueError):
        t_critical(0)


def test_an_estimate_is_the_geometric_mean_with_a_t_interval_on_the_logs():
    values = [10.0, 12.0, 11.0, 9.5]
    got = estimate(values)
    logs = [math.log(v) for v in values]
    half = 3.182 * statistics.stdev(logs) / 2
    assert got.value == pytest.approx(math.exp(statistics.fmean(logs)))
    assert (got.low, got.high) == (pytest.approx(math.exp(statistics.fmean(logs) - half)),
                                   pytest.approx(math.exp(statistics.fmean(logs) + half)))
    assert got.count == 4
    assert got.relative_half_width == pytest.approx(math.exp(half) - 1)
    assert got.low < got.value < got.high


def test_one_value_has_no_interval_and_equal_values_a_point():
    alone = estimate([5.0])
    assert (alone.value, alone.low, alone.high, alone.relative_half_width) == (5.0, None, None, None)
    assert alone.contains(100.0)  # no interval: nothing is excluded
    same = estimate([3.0, 3.0, 3.0])
    assert same.low == pytest.approx(3.0) and same.high == pytest.approx(3.0)
    with pytest.raises(ValueError):
        estimate([])
    with pytest.raises(ValueError):
        estimate([1.0, 0.0])
    with pytest.raises(ValueError):
        estimate([1.0, float("nan")])


def test_a_paired_ratio_cancels_drift_that_hits_both_splits():
    # The machine slows down 3x over the rounds; the plan is always 0.9x the large batch.
    large = [20.0, 15.0, 10.0, 7.0]
    plan = [0.9 * v for v in large]
    paired = paired_ratio(plan, large)
    assert paired.value == pytest.approx(0.9)
    assert paired.relative_half_width == pytest.approx(0.0, abs=1e-12)
    unpaired = estimate(plan).value / estimate(large).value
    assert unpaired == pytest.approx(0.9)  # the same centre, but each rate alone is uncertain:
    assert estimate(plan).relative_half_width > 0.4


def test_a_paired_ratio_skips_rounds_either_split_missed():
    assert paired_ratio([10.0, None, 12.0], [10.0, 11.0, None]).count == 1
    assert paired_ratio([None], [1.0]) is None
    with pytest.raises(ValueError):
        paired_ratio([1.0], [1.0, 2.0])


def test_the_verdict_names_its_interval_and_never_judges_across_one():
    assert verdict(Estimate(0.97, 0.91, 1.04, 4)) == \
        "the plan runs at 0.97x a true large batch (95% CI 0.91-1.04: no measurable difference)"
    assert verdict(Estimate(0.80, 0.75, 0.86, 4)).endswith("(95% CI 0.75-0.86: slower)")
    assert verdict(Estimate(1.20, 1.05, 1.37, 4)).endswith("(95% CI 1.05-1.37: faster)")
    assert "no interval, so no verdict" in verdict(Estimate(0.5, None, None, 1))
    # Ends more than 10x apart: the tables' "(CI too wide)" rule, not "95% CI 0.03-5.44" beside it (sweep 19)
    assert verdict(Estimate(0.40, 0.03, 5.44, 3)).endswith("(CI too wide: no measurable difference)")
    assert "the largest batch that fits" in verdict(Estimate(0.9, 0.8, 1.0, 3), reference="the largest batch that fits")
    generator = random.Random(0)
    for _ in range(2000):
        low = generator.uniform(0.3, 1.7)
        high = low * generator.uniform(1.0, 2.0)
        text = verdict(Estimate(math.sqrt(low * high), low, high, 3))
        if low <= 1.0 <= high:
            assert text.endswith("no measurable difference)"), text
        else:
            assert text.endswith("faster)" if low > 1 else "slower)"), text


def test_contention_from_cpu_time_and_from_the_spread_of_rounds():
    calm = contention(cpu_seconds=19.0, wall_seconds=10.0, rounds_by_split={"32 x 2": [20.0, 20.5, 19.8]})
    assert not calm.contended and calm.describe().startswith("no sign of contention")
    starved = contention(cpu_seconds=5.0, wall_seconds=10.0, rounds_by_split={"32 x 2": [20.0, 20.5, 19.8]})
    assert starved.contended and starved.cpu_per_wall == pytest.approx(0.5) and 0.5 < CONTENDED_CPU_PER_WALL
    assert "0.50 CPU seconds per wall second" in starved.describe()
    noisy = contention(cpu_seconds=None, wall_seconds=10.0,
                       rounds_by_split={"32 x 2": [20.0, 20.5, 19.8], "16 x 4": [5.0, 21.7, 12.0]})
    assert noisy.contended and noisy.worst_split == "16 x 4" and noisy.worst_spread > CONTENDED_SPREAD
    assert "16 x 4's rounds differ by" in noisy.describe() and "CPU seconds" not in noisy.describe()
    one_round = contention(cpu_seconds=None, wall_seconds=1.0, rounds_by_split={"a": [1.0]})
    assert one_round.worst_spread is None and not one_round.contended
    # what was not compared is not said to agree (one round said "rounds agreed")
    assert calm.describe() == "no sign of contention (CPU time kept up with wall time; rounds agreed)"
    assert one_round.describe() == "contention not measured (one round, no CPU time to compare)"
    cpu_one = contention(cpu_seconds=9.5, wall_seconds=10.0, rounds_by_split={"a": [1.0]})
    assert cpu_one.describe() == "no sign of contention (CPU time kept up with wall time; one round)"


@pytest.mark.parametrize("runner_rounds, said", [
    # rounds that cross: 132 against 125 samples/s is no measurable winner (it was named the fastest without a word)
    ([150.0, 100.0, 128.0], "fastest split that fits: 22,21,21 at 132.5 samples/s (not measurably faster than 16 x 4: "
                            "x1.07, 95% CI 0.61-1.86)"),  # docs/bench-and-reports.md quotes it
    # rounds that keep their order: a winner, with its ratio and interval
    ([110.0, 112.0, 109.0], "fastest split that fits: 22,21,21 at 132.5 samples/s (x1.20 16 x 4, 95% CI 1.1"),
])
def test_the_fastest_split_is_named_a_winner_only_where_its_rounds_say_so(runner_rounds, said):
    from gaplan.benchmark.measurement import BenchResult, SplitMeasurement
    from gaplan.core.constants import PLAN_KIND, SPLIT_KIND

    best_rounds = [130.0, 135.0, 132.5]

    def row(split, kind, rates):
        return SplitMeasurement(split, kind, 16, 4, 64, 3, 0.5, 0.4, 0.6, statistics.geometric_mean(rates), None,
                                2**20, True, True)

    measured = BenchResult(64, [row("22,21,21", SPLIT_KIND, best_rounds), row("16 x 4", PLAN_KIND, runner_rounds)],
                           round_rates={"22,21,21": best_rounds, "16 x 4": runner_rounds})
    assert measured.fastest_text().startswith(said), measured.fastest_text()
