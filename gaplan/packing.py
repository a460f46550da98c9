"""Token-budget micro-batches: pack one optimizer step's samples into micro-batches of at most T tokens.

Pure arithmetic, no torch. A micro-batch costs its *padded* tokens, ``len(batch) * longest``,
since every sample in it is padded to its longest one. A step's samples are split over the ranks
with balanced tokens and counts (±1), each rank's share is sorted longest first and filled
greedily, and every rank gets the same number of micro-steps (DDP synchronizes one backward per
micro-step): a rank with fewer is split further, and where it has too few samples to split, it
gets empty micro-batches (a zero backward that only joins the all-reduce).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass


class PackingError(ValueError):
    """A step that cannot be packed within the budget (a sample longer than it)."""


@dataclass(frozen=True)
class PackedStep:
    """``micro_batches[r][g]``: the positions (into the step's samples) that rank ``r`` feeds at micro-step ``g``."""

    micro_batches: tuple[tuple[tuple[int, ...], ...], ...]
    token_budget: int

    @property
    def micro_steps(self) -> int:
        return len(self.micro_batches[0])

    def padded_tokens(self, lengths: Sequence[int]) -> int:
        return sum(padded_tokens(batch, lengths) for rank in self.micro_batches for batch in rank)


def padded_tokens(batch: Sequence[int], lengths: Sequence[int]) -> int:
    """What a micro-batch costs: its size times its longest sample."""
    return len(batch) * max((lengths[i] for i in batch), default=0)


def split_over_ranks(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Each rank's positions: counts differ by at most one, tokens balanced (longest first to the lightest rank)."""
    count = len(lengths)
    capacity = [count // world_size + (1 if rank < count % world_size else 0) for rank in range(world_size)]
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    heap = [(0, rank) for rank in range(world_size)]  # (tokens so far, rank)
    for position in sorted(range(count), key=lambda i: (-lengths[i], i)):
        full = []
        while True:
            tokens, rank = heapq.heappop(heap)
            if len(ranks[rank]) < capacity[rank]:
                break
            full.append((tokens, rank))
        ranks[rank].append(position)
        heapq.heappush(heap, (tokens + lengths[position], rank))
        for item in full:
            heapq.heappush(heap, item)
    return ranks


def fill(positions: Sequence[int], lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Longest first, each micro-batch filled while its padded size stays within ``token_budget``."""
    batches: list[list[int]] = []
    for position in sorted(positions, key=lambda i: (-lengths[i], i)):
        if lengths[position] > token_budget:
            raise PackingError(f"a sample of {lengths[position]} tokens is longer than the token budget "
                               f"{token_budget}: raise the budget or split long samples")
        # Sorted longest first: the batch's first sample is its longest, so its padded size is len x that.
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= token_budget:
            batches[-1].append(position)
        else:
            batches.append([position])
    return batches


def _split_until(batches: list[list[int]], target: int) -> list[list[int]]:
    """Halve the micro-batch with the most samples until there are ``target`` (halves stay within budget)."""
    batches = [list(b) for b in batches]
    while len(batches) < target:
        largest = max(range(len(batches)), key=lambda i: (len(batches[i]), -i), default=None)
        if largest is None or len(batches[largest]) < 2:
            batches.append([])  # nothing left to split: an empty micro-step that only joins the all-reduce
            continue
        batch = batches.pop(largest)
        half = len(batch) // 2
        batches[largest:largest] = [batch[:half], batch[half:]]
    return batches


def pack_step(lengths: Sequence[int], token_budget: int, world_size: int = 1) -> PackedStep:
    """One optimizer step's samples (their token lengths, in step order) packed for ``world_size`` ranks."""
    if token_budget < 1:
        raise PackingError(f"the token budget must be positive (got {token_budget})")
    if world_size < 1:
        raise PackingError(f"the world size must be positive (got {world_size})")
    per_rank = [fill(positions, lengths, token_budget) for positions in split_over_ranks(lengths, world_size)]
    target = max(1, *(len(batches) for batches in per_rank))
    equal = [_split_until(batches, target) for batches in per_rank]
    return PackedStep(tuple(tuple(tuple(b) for b in batches) for batches in equal), token_budget)
