"""The edge search over fake ``measure`` functions with known edges."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gaplan.core.trial import Trial
from gaplan.plan.search import find_edge, trial_bound


def linear_device(edge, intercept, slope, wobble=0.0, report_peaks=True, floor_until=0):
    """Peaks on a line (with a smooth wobble of a few percent); the budget sits between edge and edge+1.

    ``floor_until``: below this size the peak is flat (set by the optimizer step, as on real devices).
    """
    limit = intercept + slope * (edge + 0.5)
    calls = []

    def measure(b):
        calls.append(b)
        peak = intercept + slope * max(b, floor_until) * (1 + wobble * ((b % 7) - 3) / 3)
        fits = b <= edge
        return Trial(b, fits, int(peak) if fits and report_peaks else None)

    return measure, int(limit), calls


@settings(max_examples=300, deadline=None)
@given(edge=st.integers(1, 3000), intercept=st.integers(2**20, 2**31), slope=st.integers(2**10, 2**28),
       wobble=st.sampled_from([0.0, 0.01, 0.03]), report_peaks=st.booleans(), floor=st.floats(0, 0.9))
def test_finds_exact_edge_within_bound(edge, intercept, slope, wobble, report_peaks, floor):
    measure, limit, calls = linear_device(edge, intercept, slope, wobble, report_peaks, int(floor * edge))
    result = find_edge(measure, limit)
    assert result.edge == edge
    assert result.trial_count <= trial_bound(edge)
    assert len(set(calls)) == len(calls), "a size was tried twice"


@settings(max_examples=200, deadline=None)
@given(edge=st.integers(1, 5000))
def test_plain_search_without_peaks_is_exact(edge):
    result = find_edge(lambda b: Trial(b, b <= edge, None))
    assert result.edge == edge and result.trial_count <= trial_bound(edge)


@settings(max_examples=100, deadline=None)
@given(edge=st.integers(1, 3000), peak=st.sampled_from([0, 1, 2**20]))
def test_flat_peaks_fall_back_to_plain_search(edge, peak):
    """Peaks that do not grow (0 where a small trial in a large forked process reuses resident pages) draw no line."""
    result = find_edge(lambda b: Trial(b, b <= edge, peak if b <= edge else None), limit_bytes=2**30)
    assert result.edge == edge and result.trial_count <= trial_bound(edge)


@pytest.mark.parametrize("edge", [4, 12, 37, 100, 1000])
def test_linear_memory_needs_few_trials(edge):
    measure, limit, _ = linear_device(edge, 300 * 2**20, 70 * 2**20)
    assert find_edge(measure, limit).trial_count <= 5


def test_the_line_waits_for_three_collinear_points():
    """A flat start (the optimizer step sets the peak) must not send the search to a far-off jump."""
    measure, limit, calls = linear_device(89, 100 * 2**20, 3 * 2**20, floor_until=10)
    result = find_edge(measure, limit)
    assert result.edge == 89
    assert max(calls) < 2 * 89, "a line drawn through the flat start would have jumped far past the edge"
    assert result.trial_count <= 9


def test_a_bend_out_of_the_flat_start_takes_the_last_secant():
    """Peaks of a real probe (tiny-gpt2, seq 32, 256 MiB; MiB): the secants 4-8 and 8-16 disagree (the bend out of the
    flat start), so the line is never trusted. The doubling to 32 would fail, so the search tries where the last
    secant meets the budget (24) instead: that brackets the edge tighter, and B* = 21 takes 9 trials, not 10."""
    mib = 2**20
    peaks = {1: 112.0, 2: 111.4, 4: 113.7, 8: 147.7, 16: 201.8, 20: 228.3, 21: 234.8}

    def measure(b):
        return Trial(b, b <= 21, int(peaks[b] * mib) if b <= 21 else None)

    assert [t.micro_batch for t in find_edge(measure, 256 * mib).trials] == [1, 2, 4, 8, 16, 24, 20, 22, 21]
    blind = [t.micro_batch for t in find_edge(lambda b: Trial(b, b <= 21, None), 256 * mib).trials]
    assert blind == [1, 2, 4, 8, 16, 32, 24, 20, 22, 21]


def test_nothing_fits():
    result = find_edge(lambda b: Trial(b, False, None))
    assert result.edge == 0 and result.trial_count == 1


def test_cap():
    result = find_edge(lambda b: Trial(b, True, 1000 * b), limit_bytes=10**12, max_batch=64)
    assert result.edge == 64 and result.capped


def test_start_above_edge():
    result = find_edge(lambda b: Trial(b, b <= 9, 100 * b if b <= 9 else None), limit_bytes=950, start=40)
    assert result.edge == 9


def test_bound_values():
    assert [trial_bound(b) for b in (1, 2, 3, 4, 12)] == [2, 4, 5, 6, 9]


@pytest.mark.parametrize("edge, start, most", [(35, 35, 2), (35, 36, 2), (35, 34, 4), (89, 80, 8), (200, 20, 16)])
def test_a_seeded_start_is_verified_beside_it(edge, start, most):
    """An estimate that is right costs two trials; one that is off costs about what plain search would."""
    result = find_edge(lambda b: Trial(b, b <= edge, None), start=start)
    assert result.edge == edge and result.trial_count <= most


@settings(max_examples=300, deadline=None)
@given(edge=st.integers(1, 3000), factor=st.floats(0.25, 4.0))
def test_a_seeded_start_stays_within_the_bound(edge, factor):
    start = max(1, round(edge * factor))
    result = find_edge(lambda b: Trial(b, b <= edge, None), start=start)
    assert result.edge == edge and result.trial_count <= trial_bound(edge) + 2


@settings(max_examples=300, deadline=None)
@given(edge=st.integers(1, 3000), optimism=st.integers(0, 3), floor=st.floats(0, 0.9), cap=st.none() | st.integers(1, 4000))
def test_sketches_never_decide_the_answer(edge, optimism, floor, cap):
    """Sketch trials (one optimizer step of two) may pass a few sizes the full trial fails; the answer is still exact,
    measured in full. A faithful sketch costs at most two trials more (the edge again, or the check beside it; over
    160,000 random cases the mean is 0.06), one that passes ``optimism`` sizes too many at most ``2*optimism + 4``
    (before the check beside a doubted sketch: 13 at ``optimism`` 1, edge 31, where the sketch passed 32)."""
    device = dict(edge=edge, intercept=300 * 2**20, slope=70 * 2**20, wobble=0.01, floor_until=int(floor * edge))
    measure, limit, full_calls = linear_device(**device)
    optimistic, _, sketch_calls = linear_device(**dict(device, edge=edge + optimism))

    result = find_edge(measure, limit, max_batch=cap, sketch=optimistic)
    expected = edge if cap is None else min(edge, cap)
    assert result.edge == expected
    assert expected in full_calls, "the edge was measured in full"
    plain = find_edge(linear_device(**device)[0], limit, max_batch=cap)
    assert result.trial_count <= plain.trial_count + (2 * optimism + 4 if optimism else 2)


@pytest.mark.parametrize("edge, optimism, floor", [(7, 1, 0.5), (31, 1, 0.37), (31, 2, 0.37)])
def test_a_doubted_sketch_is_checked_beside_it(edge, optimism, floor):
    """The cases that broke the old bound: the sketch passed the next doubling above the edge, and bisection in
    full spent a failure on every halving of that bracket. After three full failures one trial beside the sketch
    exposes it."""
    device = dict(edge=edge, intercept=300 * 2**20, slope=70 * 2**20, wobble=0.01, floor_until=int(floor * edge))
    measure, limit, full_calls = linear_device(**device)
    optimistic, _, _ = linear_device(**dict(device, edge=edge + optimism))
    result = find_edge(measure, limit, sketch=optimistic)
    plain = find_edge(linear_device(**device)[0], limit)
    assert result.edge == edge
    assert result.trial_count <= plain.trial_count + 2 * optimism + 4


def test_sketches_are_the_doublings_before_the_first_failure():
    device = dict(edge=89, intercept=100 * 2**20, slope=3 * 2**20, floor_until=10)
    measure, limit, full_calls = linear_device(**device)
    sketch, _, sketch_calls = linear_device(**device)
    assert find_edge(measure, limit, sketch=sketch).edge == 89
    assert sketch_calls == [2**k for k in range(len(sketch_calls))] and sketch_calls, sketch_calls
    assert 89 in full_calls and 90 in full_calls
