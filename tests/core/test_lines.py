"""The one-line texts: an interval is printed as numbers only where it says something."""

import math
from types import SimpleNamespace

import pytest

from gaplan.benchmark.stats import estimate
from gaplan.core.lines import THROUGHPUT_HEADER, TOO_WIDE, WIDE_INTERVAL, interval_text, throughput_line


def test_an_interval_is_its_two_ends_or_nothing_where_one_is_missing():
    assert interval_text(9.5, 11.25, "{:.1f}") == " (9.5-11.2)"
    assert interval_text(None, 3.0, "{:.2f}") == interval_text(1.0, math.nan, "{:.2f}") == ""


def test_two_rounds_that_disagree_give_an_interval_too_wide_to_print_as_numbers():
    # Two rounds: one degree of freedom, t = 12.7; rates of 10 and 20 (a busy machine) give 0.17 to 1156 (a sweep saw
    # "10.7 (0.0-11349543758.0)" printed).
    rates = estimate([10.0, 20.0])
    assert rates.high > WIDE_INTERVAL * rates.low
    assert interval_text(rates.low, rates.high, "{:.1f}") == TOO_WIDE
    assert interval_text(0.0, 1.0, "{:.2f}") == TOO_WIDE
    # The same rates over enough rounds are an interval again.
    many = estimate([10.0, 20.0, 14.0, 15.0, 13.0, 16.0])
    assert interval_text(many.low, many.high, "{:.1f}") == f" ({many.low:.1f}-{many.high:.1f})"


@pytest.mark.parametrize("rounds", [[10.0, 20.0], [10.0, 20.0, 14.0, 15.0, 13.0, 16.0], [10.0, 11.5]])
def test_a_bench_line_keeps_its_columns_under_the_header(rounds):
    rates, ratios = estimate(rounds), estimate([r / 3.0 for r in rounds])
    row = SimpleNamespace(split="4x8", samples_per_s=rates.value, samples_per_s_low=rates.low,
                          samples_per_s_high=rates.high, ratio_to_large_batch=ratios.value, ratio_low=ratios.low,
                          ratio_high=ratios.high, note="", probe_peak_bytes=None, peak_bytes=2**20,
                          bounded=True)
    line = throughput_line(row)
    assert line.index("x ") == THROUGHPUT_HEADER.index("x large batch") and line.endswith("1.00 MiB")


@pytest.mark.parametrize("probe_peak, timing_peak, bounded, shown", [
    (150 * 2**20, 197 * 2**20, False, "150.00 MiB"),  # the probe's peak at the micro-batch
    (None, 140 * 2**20, True, "140.00 MiB"),  # timed under the budget: the same measure
    # a resident peak timed without the budget is not the peak (step): 197.63 MiB was shown for a plan whose B* under a
    # 160 MiB budget peaked at 157 (the report showed "-", and the resident peak in its own column)
    (None, 197 * 2**20, False, "-"),
])
def test_a_bench_line_shows_the_peak_step_only(probe_peak, timing_peak, bounded, shown):
    row = SimpleNamespace(split="16 x2", samples_per_s=10.0, samples_per_s_low=None, samples_per_s_high=None,
                          ratio_to_large_batch=1.0, ratio_low=None, ratio_high=None, note="",
                          probe_peak_bytes=probe_peak, peak_bytes=timing_peak, bounded=bounded)
    assert throughput_line(row).split()[-1 if shown == "-" else -2:] == shown.split()
