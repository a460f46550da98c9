"""How a DataLoader draws, as the noise scale reads it: each epoch's permutation (without replacement from N) where
the sampler draws one, unknown otherwise."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, WeightedRandomSampler

from gaplan.data.loader_drawing import loader_drawing
from gaplan.data.plan_sampler import PlanBatchSampler
from gaplan.plan.split import make_plan

DATA = list(range(40))


@pytest.mark.parametrize("loader, expected", [
    (DataLoader(DATA, batch_size=4, shuffle=True), ("epochs", 40)),
    (DataLoader(DATA, batch_size=4), ("unknown", None)),  # the dataset's order: no random draw
    (DataLoader(DATA, batch_size=4, sampler=RandomSampler(DATA, replacement=True)), ("unknown", None)),
    (DataLoader(DATA, batch_size=4, sampler=RandomSampler(DATA, num_samples=10)), ("unknown", None)),
    (DataLoader(DATA, batch_size=4, sampler=WeightedRandomSampler([1.0] * 40, 40)), ("unknown", None)),
    (DataLoader(DATA, batch_size=4, sampler=DistributedSampler(DATA, num_replicas=2, rank=1)), ("epochs", 40)),
    (DataLoader(DATA, batch_size=4, sampler=DistributedSampler(DATA, num_replicas=2, rank=0, shuffle=False)),
     ("unknown", None)),
    (DataLoader(DATA, batch_sampler=PlanBatchSampler(make_plan(11, 4), 40)), ("epochs", 40)),
    (DataLoader(DATA, batch_sampler=PlanBatchSampler(make_plan(11, 4), 40, shuffle=False)), ("unknown", None)),
], ids=["shuffle", "in-order", "with-replacement", "fewer-than-n", "weighted", "distributed", "distributed-in-order",
        "plan-sampler", "plan-sampler-in-order"])
def test_a_loaders_drawing(loader, expected):
    drawing = loader_drawing(loader)
    assert (drawing.kind, drawing.population) == expected


def test_accelerates_prepared_loader_keeps_its_samplers_drawing():
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True)
    try:
        shuffled = accelerator.prepare(DataLoader(DATA, batch_size=4, shuffle=True))
        planned = accelerator.prepare(DataLoader(DATA, batch_sampler=PlanBatchSampler(make_plan(11, 4), 40)))
        assert (loader_drawing(shuffled).kind, loader_drawing(shuffled).population) == ("epochs", 40)
        assert (loader_drawing(planned).kind, loader_drawing(planned).population) == ("epochs", 40)
        assert sorted(int(i) for batch in shuffled for i in torch.as_tensor(batch)) == DATA  # one permutation
    finally:
        accelerate.state.AcceleratorState._reset_state(True)
        accelerate.state.GradientState._reset_state()
