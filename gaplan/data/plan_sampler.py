"""A plan's micro-batches, step by step, for any loop that takes a torch ``DataLoader``.

:class:`PlanBatchSampler` is a ``batch_sampler``: it yields lists of dataset indices whose lengths are the plan's
micro-batch sizes (``12 x14, 11 x8`` yields fourteen lists of 12, then eight of 11, then the next step's), so an
uneven plan reaches accelerate's ``prepare``, a Lightning ``DataModule`` or ``GaplanTrainer``'s loader at B* itself::

    loader = DataLoader(dataset, batch_sampler=PlanBatchSampler(result.plan, len(dataset)), collate_fn=collate)

Each optimizer step takes ``plan.effective_batch`` samples of one seeded permutation; the last samples that do
not fill a step are left out (a shorter step would be another effective batch). With the token-exact loss (the
sum of the step's token losses over its targets) uneven micro-batches give the one-large-batch gradient.

Over several processes (``plan.world_size`` above 1), by default it yields every rank's micro-batches in turn
(rank 0's first micro-batch, rank 1's, ..., then each rank's second): accelerate's ``prepare`` shards a batch
sampler that way (process ``r`` takes batches ``r``, ``r + W``, ...). ``rank=r`` yields rank ``r``'s alone, for a
loader that each process builds itself (``use_distributed_sampler=False`` in Lightning).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

from gaplan.core.errors import GaplanError
from gaplan.plan.draws import Drawing
from gaplan.plan.split import Plan


class PlanBatchSampler(Sampler[list[int]]):
    """The plan's micro-batches of ``range(num_samples)``, optimizer step by optimizer step.

    Args:
        plan: the split (:class:`~gaplan.plan.split.Plan`, even or not).
        num_samples: the dataset's length.
        shuffle: a new seeded permutation each epoch (``seed + epoch``); else the dataset's order.
        seed: the permutations' seed (the same on every rank).
        rank: yield this rank's micro-batches only; default: every rank's in turn (accelerate's sharding).
    """

    def __init__(self, plan: Plan, num_samples: int, *, shuffle: bool = True, seed: int = 0,
                 rank: int | None = None) -> None:
        if not isinstance(plan, Plan) or not isinstance(num_samples, int):  # PlanBatchSampler(10, 20), ("20")
            raise GaplanError(f"PlanBatchSampler takes a gaplan Plan and a number of samples (got {plan!r}, "
                              f"{num_samples!r})")
        if num_samples < plan.effective_batch:
            raise GaplanError(f"{num_samples} samples do not fill one optimizer step of {plan.effective_batch}")
        if rank is not None and not 0 <= rank < plan.world_size:
            raise GaplanError(f"rank {rank} is not one of the plan's {plan.world_size} ranks")
        self.plan = plan
        self.num_samples = num_samples
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.epoch = 0

    @property
    def steps(self) -> int:
        """Optimizer steps per epoch."""
        return self.num_samples // self.plan.effective_batch

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose permutation the next iteration takes (Lightning and accelerate call it)."""
        self.epoch = epoch

    def __len__(self) -> int:
        ranks = 1 if self.rank is not None else self.plan.world_size
        return self.steps * self.plan.grad_accum_steps * ranks

    def __iter__(self) -> Iterator[list[int]]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=generator).tolist()
        else:
            order = list(range(self.num_samples))
        ranks = range(self.plan.world_size) if self.rank is None else (self.rank,)
        sizes = self.plan.rank_micro_batch_sizes
        # Where each rank's share of a step starts (rank 0's samples first, then rank 1's, ...).
        share_starts = [sum(sum(s) for s in sizes[:r]) for r in range(self.plan.world_size)]
        for step in range(self.steps):
            base = step * self.plan.effective_batch
            offsets = [base + start for start in share_starts]
            for micro in range(self.plan.grad_accum_steps):
                for rank in ranks:
                    size = sizes[rank][micro]
                    yield order[offsets[rank]:offsets[rank] + size]
                    offsets[rank] += size

    @property
    def drawing(self) -> Drawing:
        """How a step's samples are drawn, for the noise scale: with ``shuffle``, each step's samples are consecutive
        in one epoch's permutation (a step never crosses an epoch: the tail is left out), so a simple random sample
        without replacement from the dataset; the dataset's own order is no random draw at all (unknown)."""
        return Drawing("epochs", self.num_samples) if self.shuffle and self.num_samples > 1 else Drawing()
