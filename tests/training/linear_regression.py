"""Problems whose gradient noise scale is known in closed form, as ``module:function`` workloads.

Linear regression ``y = w* . x + e`` with ``x ~ N(0, I_d)``, ``e ~ N(0, s^2)`` and the squared loss ``(w . x - y)^2 / 2``
per sample, held at ``w = w* + D``. A sample's gradient is ``(D . x - e) x``, so ``G = D``, ``|G|^2 = |D|^2`` and
``tr(S) = E|g|^2 - |G|^2 = (d + 1) |D|^2 + d s^2`` (Gaussian moments: ``E[(D . x)^2 |x|^2] = (d + 2) |D|^2``), so
``B_noise = d + 1 + d s^2 / |D|^2``. :func:`make` has ``B_noise = 17``; :func:`make_b3` and :func:`make_b23` the two
other scales the adaptive schedule is tested at (``--model tests.training.linear_regression:make_b23``).
"""

import torch
from torch import nn

from gaplan.workload.build import CustomWorkload

DIM, NOISE_STD = 8, 1.0  # make(): B_noise = 9 + 8 = 17


def noise_scale(dim: int = DIM, noise_std: float = NOISE_STD) -> float:
    """B_noise = tr(S) / |G|^2 at the workload's weights (|D|^2 = 1)."""
    return (dim + 1) + dim * noise_std ** 2


def workload(dim: int = DIM, noise_std: float = NOISE_STD) -> CustomWorkload:
    """The regression in ``dim`` dimensions with noise ``noise_std``, held at ``w* + D`` with ``D = e_1``."""
    true_weights = torch.linspace(-1, 1, dim)
    offset = torch.zeros(dim)
    offset[0] = 1.0  # D: |D|^2 = 1
    model = nn.Linear(dim, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_((true_weights + offset).unsqueeze(0))

    def make_batch(size: int) -> dict:
        x = torch.randn(size, dim)
        return {"x": x, "y": x @ true_weights + noise_std * torch.randn(size)}

    def loss(module: nn.Module, batch: dict) -> torch.Tensor:
        return 0.5 * (module(batch["x"]).squeeze(-1) - batch["y"]).pow(2).mean()  # the micro-batch's mean

    # Fresh samples every call: independent draws, as the noise scale's estimator assumes.
    return CustomWorkload(model, make_batch, loss, loss_is_scaled_for_ga=False, draws="independent")


# Three known noise scales: (dim, noise_std) and the B_noise they give.
SCALES = {3: (2, 0.0), 17: (8, 1.0), 23: (8, 1.75 ** 0.5)}


def make() -> CustomWorkload:
    return workload(*SCALES[17])


def make_b3() -> CustomWorkload:
    return workload(*SCALES[3])


def make_b23() -> CustomWorkload:
    return workload(*SCALES[23])
