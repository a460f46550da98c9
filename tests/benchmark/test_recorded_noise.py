"""The bench's statistics on timings recorded on a shared 2-core machine: verdicts hold from run to run.

Recorded 2026-12-01 with ``gaplan bench --effective-batch 64`` (tiny-gpt2, seq 128, 1 GiB budget, B* = 35; the
plan 32 x 2, its neighbours 16 x 4 and 8 x 8, the true large batch 64 x 1), samples/s per round as ``bench.json``'s
``round_rates`` holds them: three runs back to back on a quiet machine, then one with a neighbour that came and
went (two busy processes, 6 s on, 6 s off).
"""

import itertools

from gaplan.benchmark.stats import contention, paired_ratio, verdict

QUIET = [
    {"32 x 2": [47.635, 47.666, 46.288, 47.283], "16 x 4": [47.056, 47.416, 45.893, 45.495],
     "8 x 8": [45.005, 46.492, 45.205, 44.703], "64 x 1": [37.387, 38.004, 38.479, 37.046]},
    {"32 x 2": [49.0, 48.61, 48.247, 48.71], "16 x 4": [45.278, 45.078, 44.429, 44.691],
     "8 x 8": [45.326, 43.405, 43.684, 43.633], "64 x 1": [38.767, 37.346, 38.581, 38.877]},
    {"32 x 2": [47.67, 47.027, 45.957, 46.279], "16 x 4": [44.889, 46.068, 47.095, 47.049],
     "8 x 8": [44.82, 43.393, 44.901, 44.829], "64 x 1": [37.615, 38.713, 37.346, 37.627]},
]
NOISY = {
    "32 x 2": [45.962, 45.013, 29.383, 22.847, 48.548, 46.521, 25.86, 24.457, 44.896, 45.745],
    "16 x 4": [23.313, 23.208, 45.519, 46.147, 19.959, 20.974, 46.18, 43.846, 28.507, 23.195],
    "8 x 8": [35.42, 43.53, 30.832, 19.518, 41.221, 44.48, 30.128, 19.295, 35.296, 44.287],
    "64 x 1": [37.364, 18.668, 27.947, 39.379, 38.482, 19.436, 26.032, 37.792, 38.121, 19.274],
}
SPLITS = ("32 x 2", "16 x 4", "8 x 8")


def judged(text: str) -> str:
    return text.rsplit(": ", 1)[1].rstrip(")")


def test_three_back_to_back_runs_give_overlapping_intervals_and_one_verdict():
    for split in SPLITS:
        ratios = [paired_ratio(run[split], run["64 x 1"]) for run in QUIET]
        assert max(r.low for r in ratios) < min(r.high for r in ratios), (split, ratios)
        assert len({judged(verdict(r)) for r in ratios}) == 1, (split, [verdict(r) for r in ratios])
    plans = [paired_ratio(run["32 x 2"], run["64 x 1"]) for run in QUIET]
    assert [round(r.value, 2) for r in plans] == [1.25, 1.27, 1.24]  # as the three runs printed them
    assert all(r.relative_half_width <= 0.05 for r in plans), "each stopped once known to ±5%"


def test_a_contended_run_widens_its_interval_instead_of_contradicting_the_quiet_ones():
    for split in SPLITS:
        noisy = paired_ratio(NOISY[split], NOISY["64 x 1"])
        for run in QUIET:
            quiet = paired_ratio(run[split], run["64 x 1"])
            assert noisy.low < quiet.high and quiet.low < noisy.high, (split, noisy, quiet)
            said, against = judged(verdict(noisy)), judged(verdict(quiet))
            assert {said, against} != {"faster", "slower"}, (split, said, against)
        assert judged(verdict(noisy)) == "no measurable difference"
    seen = contention(None, 1.0, NOISY)
    assert seen.contended and seen.worst_split == "16 x 4"
    assert not any(contention(None, 1.0, run).contended for run in QUIET)


def test_single_rounds_of_the_contended_run_would_have_said_both():
    """What one look per split (the old bench) could conclude: the plan faster in one round, slower in another."""
    ratios = [plan / large for plan, large in zip(NOISY["32 x 2"], NOISY["64 x 1"], strict=True)]
    assert min(ratios) < 0.7 and max(ratios) > 2.0
    pairs = itertools.combinations(ratios, 2)
    assert any(a < 1 < b or b < 1 < a for a, b in pairs)
