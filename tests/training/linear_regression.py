"""A problem whose gradient noise scale is known in closed form, as a ``module:function`` workload.

Linear regression ``y = w* . x + e`` with ``x ~ N(0, I_d)``, ``e ~ N(0, s^2)`` and the squared loss ``(w . x - y)^2 / 2``
per sample, held at ``w = w* + D``. A sample's gradient is ``(D . x - e) x``, so ``G = D``, ``|G|^2 = |D|^2`` and
``tr(S) = E|g|^2 - |G|^2 = (d + 1) |D|^2 + d s^2`` (Gaussian moments: ``E[(D . x)^2 |x|^2] = (d + 2) |D|^2``).
"""

import torch
from torch import nn

from gaplan.workload.build import CustomWorkload

DIM, NOISE_STD = 8, 1.0
OFFSET = torch.zeros(DIM)
OFFSET[0] = 1.0  # D: |D|^2 = 1
TRUE_WEIGHTS = torch.linspace(-1, 1, DIM)


def noise_scale() -> float:
    """B_noise = tr(S) / |G|^2 at the workload's weights."""
    grad_sq = float(OFFSET.pow(2).sum())
    return ((DIM + 1) * grad_sq + DIM * NOISE_STD ** 2) / grad_sq


def make() -> CustomWorkload:
    model = nn.Linear(DIM, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_((TRUE_WEIGHTS + OFFSET).unsqueeze(0))

    def make_batch(size: int) -> dict:
        x = torch.randn(size, DIM)
        return {"x": x, "y": x @ TRUE_WEIGHTS + NOISE_STD * torch.randn(size)}

    def loss(module: nn.Module, batch: dict) -> torch.Tensor:
        return 0.5 * (module(batch["x"]).squeeze(-1) - batch["y"]).pow(2).mean()  # the micro-batch's mean

    return CustomWorkload(model, make_batch, loss, loss_is_scaled_for_ga=False)
