"""Which samples each micro-step of an optimizer step gets: by the plan's sizes, or packed by tokens.

Every step takes the same samples (``step_indices``: seeded, epoch by epoch) whatever the split, which is what
makes accumulation, an OOM fallback and a resume give the weights of one large batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import torch

from gaplan.core.errors import GaplanError
from gaplan.core.options import OptionError
from gaplan.core.tasks import IGNORE_INDEX
from gaplan.data import Sample, collate, permuted_indices, step_indices
from gaplan.parallel.process_group import Distributed
from gaplan.plan.draws import LOCAL, step_parts
from gaplan.plan.packing import PackingError, pack_step
from gaplan.plan.split import Plan
from gaplan.workload.build import Workload

PLACEHOLDER = "gaplan_placeholder"  # marks an empty micro-step's stand-in batch (all labels ignored)


def sample_micro_batches(workload: Workload, plan: Plan, corpus: Sequence[Sample] | None, step: int, rank: int,
                   seed: int, first: int | None = None) -> list[dict[str, torch.Tensor]]:
    """This rank's micro-batches of step ``step``, split by the plan's sizes (``first``: as for
    :func:`gaplan.data.step_indices`)."""
    sizes = plan.rank_micro_batch_sizes[rank]
    if corpus is None:  # a custom workload makes its own batches: seed them by step so resume sees the same
        generator_state = torch.get_rng_state()
        torch.manual_seed(seed * 1_000_003 + step * 97 + rank)
        whole = workload.make_batch(sum(sizes))
        torch.set_rng_state(generator_state)
        return [{k: v[start:end] for k, v in whole.items()} for start, end in _bounds(sizes)]
    indices = step_indices(step, plan.effective_batch, len(corpus), seed, first)
    share = plan.effective_batch // plan.world_size
    mine = indices[rank * share:(rank + 1) * share]
    batches = []
    for start, end in _bounds(sizes):
        batch = collate([corpus[i] for i in mine[start:end]], workload.task, seed,
                        mask_id=getattr(corpus, "mask_id", 3), pad_id=getattr(corpus, "pad_id", 0))
        batches.append({k: v.to(workload.device) for k, v in batch.items()})
    return batches


class TokenSteps:
    """Optimizer steps of a number of real tokens instead of samples (``--effective-tokens N``).

    The samples come in the order today's steps take them (the seeded permutation of each epoch, epoch after
    epoch); each step takes the fewest consecutive samples whose tokens reach ``tokens``: every step holds at
    least ``tokens`` real tokens, and its last sample may cross the mark (by less than one sample's length).
    Step ``s`` starts where step ``s - 1`` ended, so its samples depend only on the data, the seed and
    ``tokens``: a resumed run and an OOM retry see the same ones. The boundaries are found once, walking
    the order in blocks. ``min_samples`` (the world size) gives every rank at least one sample.
    """

    _BLOCK = 4096

    def __init__(self, corpus: Sequence[Sample], tokens: int, seed: int, min_samples: int = 1) -> None:
        if tokens < 1:
            raise OptionError(f"effective_tokens must be a positive number of tokens (got {tokens})",
                              "effective_tokens")
        self.corpus, self.tokens, self.seed, self.min_samples = corpus, tokens, seed, min_samples
        self._starts = [0]  # position (in the endless order) where each step starts
        self._lengths: list[int] = []  # lengths of the positions walked so far
        self._indices: list[int] = []  # and their sample indices

    def _walk(self) -> None:
        """Take one more block of positions in order."""
        size = len(self.corpus)
        start = len(self._indices)
        positions = np.arange(start, start + self._BLOCK, dtype=np.int64)
        epochs, offsets = np.divmod(positions, size)
        indices = np.empty_like(positions)
        for epoch in np.unique(epochs).tolist():
            where = epochs == epoch
            indices[where] = permuted_indices(offsets[where], size, self.seed, epoch)
        self._indices.extend(indices.tolist())
        self._lengths.extend(len(self.corpus[i].ids) for i in indices.tolist())

    def first(self, step: int) -> int:
        """Where optimizer step ``step`` (0-based) starts in the order (epoch after epoch)."""
        self.indices(step)
        return self._starts[step]

    def indices(self, step: int) -> list[int]:
        """The sample indices of optimizer step ``step`` (0-based)."""
        while len(self._starts) <= step + 1:
            end = self._starts[-1]
            total = 0
            while total < self.tokens or end - self._starts[-1] < self.min_samples:
                if end >= len(self._lengths):
                    self._walk()
                total += self._lengths[end]
                end += 1
            self._starts.append(end)
        return self._indices[self._starts[step]:self._starts[step + 1]]


def token_micro_batches(workload: Workload, plan: Plan, corpus: Sequence[Sample] | None, step: int,
                         dist: Distributed, seed: int, token_budget: int,
                         indices: Sequence[int] | None = None) -> list[dict[str, torch.Tensor]]:
    """This rank's micro-batches of step ``step`` packed by tokens (:func:`gaplan.plan.packing.pack_step`).

    ``indices``: the step's samples when the step is a number of tokens (:class:`TokenSteps`); by default
    ``plan.effective_batch`` samples (:func:`gaplan.data.step_indices`).

    An empty micro-step (this rank has fewer samples to split than another rank has micro-steps) feeds one of
    its samples with every label ignored: no target, no gradient, but the forward and backward that DDP's
    and FSDP's collectives wait for.
    """
    if corpus is None:
        raise GaplanError("--batch-by tokens needs data whose samples have lengths (text data or a preset's "
                          "synthetic corpus); a module:function workload makes its own batches")
    if indices is None:
        indices = step_indices(step, plan.effective_batch, len(corpus), seed)
    samples = [corpus[i] for i in indices]
    try:
        packed = pack_step([len(sample.ids) for sample in samples], token_budget, dist.world_size)
    except PackingError as exc:
        raise GaplanError(f"step {step + 1}: {exc}") from None
    mine = packed.micro_batches[dist.rank]
    stand_in = next(batch for batch in mine if batch)[:1]
    batches = []
    for positions in mine:
        batch = collate([samples[p] for p in positions or stand_in], workload.task, seed,
                        mask_id=getattr(corpus, "mask_id", 3), pad_id=getattr(corpus, "pad_id", 0))
        if not positions:
            batch["labels"] = torch.full_like(batch["labels"], IGNORE_INDEX)
            batch[PLACEHOLDER] = True
        batches.append({k: (v.to(workload.device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()})
    return batches


def micro_batch_parts(plan: Plan, corpus: Sequence[Sample] | None, step: int, rank: int, seed: int,
                      first: int | None = None, token_budget: int | None = None,
                      indices: Sequence[int] | None = None) -> list[tuple[tuple[int, int], ...]]:
    """Which draws this rank's micro-batches of step ``step`` take their samples from, as the noise scale's meter
    needs them (:mod:`gaplan.plan.draws`): per micro-batch, its samples per epoch of gaplan's order (offsets from
    the step's first epoch; every rank's share is a slice of the same order), or, for a ``module:function``
    workload, of this rank's one ``make_batch`` call of the step. The same micro-batches, in the same order, as
    :func:`sample_micro_batches` and :func:`token_micro_batches` make (``first``: the step's first position in the
    order; a token step's with ``indices``)."""
    if corpus is None:
        return [((LOCAL, size),) for size in plan.rank_micro_batch_sizes[rank]]
    start = step * plan.effective_batch if first is None else first
    if token_budget:
        if indices is None:
            indices = step_indices(step, plan.effective_batch, len(corpus), seed, first)
        lengths = [len(corpus[i].ids) for i in indices]
        packed = pack_step(lengths, token_budget, plan.world_size).micro_batches[rank]
        return step_parts(start, len(corpus), [[start + p for p in positions] for positions in packed])
    share = plan.effective_batch // plan.world_size
    mine = start + rank * share
    bounds = _bounds(plan.rank_micro_batch_sizes[rank])
    return step_parts(start, len(corpus), [range(mine + a, mine + b) for a, b in bounds])


def longest_sample(micro_batches: Sequence[dict[str, torch.Tensor]]) -> int:
    """The longest sample's tokens in a step's micro-batches (padded width)."""
    return max(int(batch["input_ids"].shape[1]) for batch in micro_batches)


def _bounds(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of each micro-batch within the step's samples."""
    ends = list(itertools.accumulate(sizes))
    return list(zip([0, *ends[:-1]], ends, strict=True))
