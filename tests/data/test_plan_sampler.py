"""PlanBatchSampler: a plan's micro-batch sizes, step by step, as a DataLoader's batch_sampler."""

import pytest
from torch.utils.data import DataLoader

from gaplan.core.errors import GaplanError
from gaplan.data.plan_sampler import PlanBatchSampler
from gaplan.plan.split import make_plan


def test_an_uneven_plan_is_yielded_size_by_size_each_step_taking_distinct_samples():
    plan = make_plan(256, 12)
    assert plan.micro_batch_sizes == (12,) * 14 + (11,) * 8  # 12 x14, 11 x8
    sampler = PlanBatchSampler(plan, 600)
    batches = list(sampler)
    assert sampler.steps == 2 and len(batches) == len(sampler) == 44
    assert [len(b) for b in batches] == list(plan.micro_batch_sizes) * 2
    taken = [i for b in batches for i in b]
    assert len(set(taken)) == len(taken) == 512 and set(taken) <= set(range(600))  # the last 88 left out


def test_a_dataloader_takes_it_and_each_epoch_has_its_own_seeded_order():
    plan = make_plan(10, 4)  # 4, 3, 3
    sampler = PlanBatchSampler(plan, 20, seed=3)
    loader = DataLoader(list(range(20)), batch_sampler=sampler)
    first = [b.tolist() for b in loader]
    assert [len(b) for b in first] == [4, 3, 3, 4, 3, 3]
    assert first == [b.tolist() for b in DataLoader(list(range(20)), batch_sampler=PlanBatchSampler(plan, 20, seed=3))]
    sampler.set_epoch(1)
    assert [b.tolist() for b in loader] != first
    assert list(PlanBatchSampler(plan, 10, shuffle=False)) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_over_ranks_it_interleaves_for_accelerates_sharding_or_yields_one_ranks_own():
    plan = make_plan(14, 3, world_size=2)  # 7 a rank: 3, 2, 2
    together = list(PlanBatchSampler(plan, 14, shuffle=False))
    assert [len(b) for b in together] == [3, 3, 2, 2, 2, 2]
    # accelerate's shard: process r takes batches r, r + 2, ...: each rank its own share of the step, in its sizes
    assert together[0::2] == [[0, 1, 2], [3, 4], [5, 6]] and together[1::2] == [[7, 8, 9], [10, 11], [12, 13]]
    assert list(PlanBatchSampler(plan, 14, shuffle=False, rank=1)) == together[1::2]


def test_too_few_samples_for_a_step_or_a_rank_outside_the_plan_is_refused():
    with pytest.raises(GaplanError, match="do not fill one optimizer step"):
        PlanBatchSampler(make_plan(64, 8), 63)
    with pytest.raises(GaplanError, match="rank 2"):
        PlanBatchSampler(make_plan(64, 8, world_size=2), 64, rank=2)
