"""What the integration tests read off a trained step: the micro-batches a Trainer fed, and how far an update is from
a reference's."""

from __future__ import annotations

from typing import Any


def record_micro_batch_sizes(trainer: Any) -> list[int]:
    """The list each micro-batch's size is appended to, as the trainer's ``compute_loss`` sees it (wrapped here)."""
    sizes: list[int] = []
    original = trainer.compute_loss

    def compute_loss(model, inputs, *rest, **kwargs):
        sizes.append(len(inputs["input_ids"]))
        return original(model, inputs, *rest, **kwargs)

    trainer.compute_loss = compute_loss
    return sizes


def worst_update_difference(model: Any, expected: dict, start: dict) -> float:
    """The largest difference of ``model``'s update (its weights less ``start``) from ``expected``'s (weights by
    name), relative to the largest of ``expected``'s update."""
    worst = 0.0
    for name, param in model.named_parameters():
        want = expected[name] - start[name]
        worst = max(worst, ((param.detach() - start[name]) - want).abs().max().item() / want.abs().max().item())
    return worst
