"""T* from the edges at the shortest and longest lengths: pure, checked exhaustively."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gaplan.core.errors import GaplanError
from gaplan.plan.tokens import LengthProfile, budget_from_edges, short_search_cap


def fits(tokens: int, length: int, edge: int) -> bool:
    """The fullest micro-batch of ``length``-token samples within ``tokens`` fits iff it holds at most B*(length)."""
    return tokens // length <= edge


@settings(max_examples=500, deadline=None)
@given(st.integers(1, 64), st.integers(0, 64), st.integers(1, 512), st.integers(1, 200), st.integers(1, 128))
def test_t_star_fits_both_shapes_and_one_granule_more_overflows_one(shortest, extra, long_edge, short_edge, granule):
    longest = shortest + extra
    limit = min((long_edge + 1) * longest - 1, (short_edge + 1) * shortest - 1)
    if limit // granule * granule < longest:
        with pytest.raises(GaplanError, match="holds one sample of the longest"):
            budget_from_edges(shortest, short_edge, longest, long_edge, granule)
        return
    t = budget_from_edges(shortest, short_edge, longest, long_edge, granule)
    assert t.token_budget % granule == 0
    assert fits(t.token_budget, longest, long_edge) and fits(t.token_budget, shortest, short_edge)
    over = t.token_budget + granule
    assert not (fits(over, longest, long_edge) and fits(over, shortest, short_edge))
    binding_length, binding_edge = (longest, long_edge) if t.binding == "longest" else (shortest, short_edge)
    assert not fits(over, binding_length, binding_edge)  # the shape it names is one that overflows


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 64), st.integers(0, 64), st.integers(1, 512))
def test_the_short_probe_needs_no_more_than_its_cap(shortest, extra, long_edge):
    """At the cap the short shape already allows more tokens than the long one: searching further changes nothing."""
    longest = shortest + extra
    cap = short_search_cap(longest, long_edge, shortest)
    assert (cap + 1) * shortest - 1 >= (long_edge + 1) * longest - 1


def test_a_long_tailed_profile():
    lengths = [8] * 50 + [16] * 30 + [64] * 15 + [256] * 5
    profile = LengthProfile.of(lengths)
    # the median lies between the 50th (8) and the 51st (16)
    assert (profile.count, profile.shortest, profile.longest, profile.median) == (100, 8, 256, 12)
    assert profile.p90 == 64 and profile.p99 == 256
    assert sum(row[2] for row in profile.histogram) == 100 and profile.histogram[0][:2] == (8, 32)


def test_bad_granule():
    with pytest.raises(GaplanError, match="^granule must be a positive"):
        budget_from_edges(8, 10, 32, 4, 0)
