"""A non-LM model for gaplan: a small CNN on generated images, through the ``module:function`` hook.

    gaplan probe --model examples.custom_model:make_cnn --memory-limit 1GiB

``make_cnn`` returns a :class:`gaplan.CustomWorkload`: the model, a batch maker
(``make_batch(b)`` gives ``b`` samples) and a loss. The loss here is a per-batch
mean, so ``loss_is_scaled_for_ga=False`` tells gaplan to divide it by the
accumulation steps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gaplan import CustomWorkload

IMAGE_SIZE = 64
CLASSES = 10


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 128, 3, padding=1, stride=2), nn.BatchNorm2d(128), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(128, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).flatten(1))


def make_batch(size: int) -> dict[str, torch.Tensor]:
    """Generated images whose class is visible in their mean colour, so the task is learnable."""
    labels = torch.randint(0, CLASSES, (size,))
    images = torch.randn(size, 3, IMAGE_SIZE, IMAGE_SIZE) * 0.5 + labels.view(-1, 1, 1, 1) / CLASSES
    return {"images": images, "labels": labels}


def cnn_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch["images"]), batch["labels"])


def make_cnn() -> CustomWorkload:
    return CustomWorkload(model=SmallCNN(), make_batch=make_batch, loss=cnn_loss, loss_is_scaled_for_ga=False)
