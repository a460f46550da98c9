"""The two-batch noise estimates of one step, by hand: plain backward passes, no meter (for the meter's tests).

The expectation is derived here, not copied from the meter's closed form. Each micro-batch ``m`` has its own mean
gradient ``g_m`` over its ``n_m`` targets, with ``E g_m = G`` and variance ``tr(S) / n_m``; the step's gradient is
``sum w_m g_m`` with the weights its loss gives it. The two measured squares then have the expectations

    pooled small:  sum n_m |g_m|^2 / sum n_m  ->  |G|^2 + tr(S) * K / sum n_m
    big:           |sum w_m g_m|^2            ->  |G|^2 + tr(S) * sum w_m^2 / n_m

and the unbiased |G|^2 and tr(S) are the solution of that 2 x 2 linear system, solved in float64.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from gaplan.workload.loss import count_targets


def solve_two_batch(means: Sequence[torch.Tensor], counts: Sequence[int], weights: Sequence[float]
                    ) -> tuple[float, float]:
    """|G|^2 and tr(S) per target from the micro-batches' own mean gradients, their targets and their weights."""
    means = [m.double() for m in means]
    total = sum(counts)
    small = sum(n * m.square().sum() for n, m in zip(counts, means, strict=True)) / total
    big = sum(w * m for w, m in zip(weights, means, strict=True)).square().sum()
    coefficients = torch.tensor([[1.0, len(counts) / total],
                                 [1.0, sum(w * w / n for w, n in zip(weights, counts, strict=True))]],
                                dtype=torch.float64)
    grad_sq, grad_var = torch.linalg.solve(coefficients, torch.stack([small, big]))
    return float(grad_sq), float(grad_var)


def estimates_by_hand(gradient: Callable[[list, int], torch.Tensor], micro_batches: list, task: str,
                      mean_loss: bool = False) -> tuple[float, float]:
    """``gradient(batches, denominator)``: the flat gradient of ``sum of the batches' summed token losses /
    denominator`` at fixed weights. The step's weights: ``n_m / sum n`` for the token-exact loss, ``1 / K`` for a
    per-batch mean divided by the steps (``mean_loss``)."""
    counts = [count_targets(b, task) for b in micro_batches]
    means = [gradient([b], n) for b, n in zip(micro_batches, counts, strict=True)]
    weights = [1 / len(counts)] * len(counts) if mean_loss else [n / sum(counts) for n in counts]
    return solve_two_batch(means, counts, weights)
