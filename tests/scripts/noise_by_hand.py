"""The two-batch noise estimates of one step, by hand: plain backward passes, no meter (for the integrations' tests).

``gradient(batches, denominator)`` returns the flat gradient of ``sum of the batches' summed token losses /
denominator`` at fixed weights; the micro-batches' own mean gradients and the step's are taken from it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gaplan.workload.loss import count_targets


def estimates_by_hand(gradient: Callable[[list, int], torch.Tensor], micro_batches: list, task: str
                      ) -> tuple[float, float]:
    """|G|^2 and tr(S) per target: the targets-weighted small batch against the whole step."""
    counts = [count_targets(b, task) for b in micro_batches]
    small = [gradient([b], n).double().square().sum().item() for b, n in zip(micro_batches, counts, strict=True)]
    big = gradient(micro_batches, sum(counts)).double().square().sum().item()
    small_sq = sum(n * s for n, s in zip(counts, small, strict=True)) / sum(counts)
    b_small, b_big = sum(counts) / len(counts), sum(counts)
    return (b_big * big - b_small * small_sq) / (b_big - b_small), (small_sq - big) / (1 / b_small - 1 / b_big)
