"""Token-budget packing: pure arithmetic, checked on every shape hypothesis can think of."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gaplan.plan.packing import PackingError, pack_step, padded_tokens, split_over_ranks

steps = st.integers(min_value=1, max_value=64).flatmap(
    lambda budget: st.tuples(st.lists(st.integers(min_value=1, max_value=budget), min_size=0, max_size=60),
                             st.just(budget), st.integers(min_value=1, max_value=5)))


@settings(max_examples=400, deadline=None)
@given(steps)
def test_every_sample_once_every_micro_batch_within_budget_equal_micro_steps(case):
    lengths, budget, world = case
    packed = pack_step(lengths, budget, world)
    seen = sorted(i for rank in packed.micro_batches for batch in rank for i in batch)
    assert seen == list(range(len(lengths)))
    assert len({len(rank) for rank in packed.micro_batches}) == 1 and packed.micro_steps >= 1
    for rank in packed.micro_batches:
        for batch in rank:
            assert padded_tokens(batch, lengths) <= budget


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=100), max_size=50), st.integers(min_value=1, max_value=6))
def test_ranks_get_counts_within_one_and_tokens_within_one_longest_sample(lengths, world):
    ranks = split_over_ranks(lengths, world)
    counts = [len(r) for r in ranks]
    assert max(counts) - min(counts) <= 1
    tokens = [sum(lengths[i] for i in r) for r in ranks]
    assert max(tokens) - min(tokens) <= max(lengths, default=0)


def test_a_long_tail_packs_short_samples_together_and_long_ones_alone():
    lengths = [128, 16, 16, 16, 16, 16, 16, 16, 16, 64]
    packed = pack_step(lengths, 128, 1)
    # Greedy would pad a 16 to 64 ([128], [64, 16], [16 x 7]: 368 tokens); the same 3 micro-steps cut better:
    assert [list(b) for b in packed.micro_batches[0]] == [[0], [9], [1, 2, 3, 4, 5, 6, 7, 8]]
    assert packed.padded_tokens(lengths) == 128 + 64 + 128


def greedy(lengths, budget):
    batches = []
    for position in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= budget:
            batches[-1].append(position)
        else:
            batches.append([position])
    return batches


@settings(max_examples=300, deadline=None)
@given(steps)
def test_as_few_micro_steps_as_greedy_filling_and_never_more_padding(case):
    lengths, budget, _ = case
    packed = pack_step(lengths, budget, 1)
    reference = greedy(lengths, budget)
    assert packed.micro_steps == max(1, len(reference))
    assert packed.padded_tokens(lengths) <= sum(padded_tokens(b, lengths) for b in reference)


def test_a_rank_with_too_few_samples_gets_an_empty_micro_step():
    # Rank 0: two samples that each fill the budget; rank 1: one short one. DDP needs two backwards on each.
    packed = pack_step([100, 100, 10], 100, 2)
    assert packed.micro_steps == 2
    assert sorted(len(b) for b in packed.micro_batches[1]) == [0, 1]


@pytest.mark.parametrize("lengths, budget, world, message", [
    ([10, 200], 100, 1, "a sample of 200 tokens is longer than the token budget 100"),
    ([10], 0, 1, "must be positive"),
    ([10], 10, 0, "world size must be positive"),
])
def test_bad_input(lengths, budget, world, message):
    with pytest.raises(PackingError, match=message):
        pack_step(lengths, budget, world)
