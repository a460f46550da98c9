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


DP_WORK_LIMIT = 2_000_000  # partition steps the exact packing may take per rank and step (else greedy)


def fill(positions: Sequence[int], lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Longest first, in as few micro-batches as fit ``token_budget``, with the least padding among those.

    Greedy filling (each micro-batch filled while its padded size fits) gives the fewest micro-batches
    of consecutive lengths; on a long tail it pads the first ones heavily (the longest sample sets the
    width of its whole batch). Re-cutting the same order into that many batches with the least padded
    tokens (dynamic programming) keeps the micro-step count and drops padding; for a very large step
    share the greedy cut is kept (its cost grows as steps x samples squared).
    """
    order = sorted(positions, key=lambda i: (-lengths[i], i))
    for position in order:
        if lengths[position] > token_budget:
            raise PackingError(f"a sample of {lengths[position]} tokens is longer than the token budget "
                               f"{token_budget}: raise the budget or split long samples")
    greedy: list[list[int]] = []
    for position in order:
        # Sorted longest first: the batch's first sample is its longest, so its padded size is len x that.
        if greedy and (len(greedy[-1]) + 1) * lengths[greedy[-1][0]] <= token_budget:
            greedy[-1].append(position)
        else:
            greedy.append([position])
    if len(greedy) * len(order) ** 2 > DP_WORK_LIMIT:
        return greedy
    return _least_padding(order, lengths, token_budget, len(greedy))


def _least_padding(order: Sequence[int], lengths: Sequence[int], token_budget: int, groups: int) -> list[list[int]]:
    """``order`` (longest first) cut into ``groups`` consecutive micro-batches within budget, least padded tokens."""
    n, infinity = len(order), float("inf")
    width = [lengths[p] for p in order]
    cost = [[infinity] * (n + 1) for _ in range(groups + 1)]
    cut = [[0] * (n + 1) for _ in range(groups + 1)]
    cost[0][0] = 0
    for g in range(1, groups + 1):
        for end in range(1, n + 1):
            best, best_start = infinity, 0
            for start in range(end - 1, -1, -1):  # batch order[start:end], padded to width[start]
                padded = (end - start) * width[start]
                if padded > token_budget:
                    break  # a longer batch starting earlier is wider still
                if cost[g - 1][start] + padded < best:
                    best, best_start = cost[g - 1][start] + padded, start
            cost[g][end], cut[g][end] = best, best_start
    batches, end = [], n
    for g in range(groups, 0, -1):
        start = cut[g][end]
        batches.append(list(order[start:end]))
        end = start
    return batches[::-1]


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
