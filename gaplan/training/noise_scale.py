"""The gradient noise scale, measured during accumulation at no extra step (McCandlish et al. 2018, appendix A.1).

Accumulation gives the two batch sizes the estimator needs: every micro-batch's gradient is a small batch, the
step's accumulated gradient the big one. A hook on each trainable parameter sees the gradient a micro-step's
backward brings before it is added to ``.grad``; its squared norm is summed there, so no copy of the gradients is
kept. After the step's reduction, ``.grad`` is the big batch's mean gradient over all ranks. With ``B`` counted in
the items the loss averages over (targets for the language-model tasks, samples otherwise):

    |G|^2  ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(S)  ~ (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

Micro-batches of different sizes are pooled: ``|G_small|^2`` is their item-weighted mean and ``B_small`` their
mean size, which keeps ``E|G_small|^2 = |G|^2 + tr(S) / B_small`` exact. ``B_big`` is what makes
``E|G_big|^2 = |G|^2 + tr(S) / B_big`` exact for the mean ``.grad`` really is: with ``w_m`` the weight of micro-batch
``m``'s own mean gradient in ``.grad`` (``sum w_m = 1``), ``B_big = 1 / sum(w_m^2 / n_m)``. A loss summed over the step's
targets has ``w_m = n_m / sum n`` and ``B_big = sum n``; a per-batch mean divided by the ``K`` steps has ``w_m = 1 / K``
and ``B_big = K^2 / sum(1 / n_m)``, less than ``sum n`` when the micro-batches are uneven (counting ``sum n`` there
biased the estimate). Both estimates are smoothed by debiased exponential moving averages; ``B_noise = tr(S) /
|G|^2``, in items and, divided by the step's items per sample, in samples (the unit of the effective batch; exact in
samples only when every sample has the same items, as a language-model task's do not: the items figure is the
measured one). The training itself is not changed: each micro-step's gradient is rescaled from its share of the
step's loss to its own mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

DEFAULT_SMOOTHING = 0.95  # the EMAs' decay: about the last 20 steps count


@dataclass(frozen=True)
class NoiseReading:
    """One step's measurement and the smoothed estimates after it (``None`` where not yet defined)."""

    grad_sq: float | None  # |G|^2, smoothed (per item)
    grad_var: float | None  # tr(S), smoothed (per item)
    noise_scale: float | None  # B_noise in samples
    noise_scale_items: float | None  # B_noise in items (targets)
    small_batch: float  # B_small of this step, in items
    big_batch: float  # B_big of this step, in items (the batch whose variance the step's mean gradient has)
    step_grad_sq: float  # this step's own |G|^2 estimate (per item), before smoothing: unbiased, can be < 0
    step_grad_var: float  # this step's own tr(S) estimate (per item), before smoothing
    items_per_sample: float  # the step's items over its samples (B_noise in samples = in items / this)


class NoiseScaleMeter:
    """Hooks on ``model``'s trainable parameters that measure the gradient noise scale of each optimizer step.

    Per step: :meth:`start_micro_step` before a micro-step's backward, :meth:`end_micro_step` after it (with its
    items and how its loss was scaled), then :meth:`finish` once ``.grad`` holds the reduced, unscaled step gradient.
    :meth:`skip` drops a step that cannot be measured.
    """

    def __init__(self, model: nn.Module, smoothing: float = DEFAULT_SMOOTHING, reduce: Any = None) -> None:
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.smoothing = smoothing
        self.reduce = reduce  # sums a list of floats over the ranks (None: one process)
        self.last: NoiseReading | None = None  # the latest step's reading
        self._norms: list[torch.Tensor] = []  # this micro-step's gradient norms, a parameter each
        self._steps: list[tuple[torch.Tensor, float, float]] = []  # (|contribution|^2, factor, items) per micro-step
        self._ema_sq = self._ema_var = 0.0
        self._count = 0
        self._handles = [p.register_hook(self._add) for p in self.parameters]

    def _add(self, grad: torch.Tensor) -> None:
        # A vector norm reduces without a squared copy of the gradient: no extra peak memory. One op per parameter
        # here; the squares are summed once per micro-step.
        self._norms.append(torch.linalg.vector_norm(grad, dtype=torch.promote_types(grad.dtype, torch.float32)))

    def start_micro_step(self) -> None:
        self._norms = []

    def end_micro_step(self, items: float, divisor: float, multiplier: float = 1.0, loss_scale: float = 1.0) -> None:
        """The micro-step just backpropagated its loss summed over its ``items``, divided by ``divisor``, times
        ``multiplier`` (the world size, where the loss undoes DDP's average) and ``loss_scale`` (fp16's scaler).

        The one rescaling rule of every caller: a loss summed over the step's ``N`` targets has ``divisor=N``; a
        per-batch mean divided by the ``K`` accumulation steps has ``divisor=items * K``; Lightning's summed loss
        divided by ``accumulate_grad_batches`` has that for ``divisor``.
        """
        if self._norms and items > 0:
            # Its contribution to .grad times this factor is its own mean gradient.
            factor = divisor / (items * multiplier * loss_scale)
            self._steps.append((torch.stack(self._norms).square().sum(), factor, items))
        self._norms = []

    def skip(self) -> None:
        self._steps, self._norms = [], []

    def finish(self, samples: int) -> NoiseReading | None:
        """The step's reading, from ``.grad`` (the big batch) and the micro-steps seen; ``samples``: this rank's
        samples of the step (summed over the ranks with the norms, in the same collective). None when the step
        cannot be measured (one micro-batch in all, non-finite norms)."""
        steps, self._steps = self._steps, []
        self.last = None
        # One device sync for the micro-steps' norms: sum over them of n_m |G_m|^2.
        weighted = float(torch.stack([s.double() * (f * f) * n for s, f, n in steps]).sum()) if steps else 0.0
        # Each micro-batch's weight in .grad is 1 / factor up to one constant (DDP's average, the loss scale), which
        # normalizing by their sum removes: B_big = (sum 1/f)^2 / sum(1 / (f^2 n)).
        local = [weighted, float(sum(n for _, _, n in steps)), float(len(steps)), float(samples),
                 sum(1 / f for _, f, _ in steps), sum(1 / (f * f * n) for _, f, n in steps)]
        weighted, items, count, samples, weight, weight_sq = self.reduce(local) if self.reduce is not None else local
        grads = [p.grad for p in self.parameters if p.grad is not None]
        big_sq = float(torch.stack([torch.linalg.vector_norm(g, dtype=torch.promote_types(g.dtype, torch.float32))
                                    .double() for g in grads])
                       .square().sum()) if grads else 0.0
        if count < 2 or not (math.isfinite(weighted) and math.isfinite(big_sq)) or items <= 0 or weight_sq <= 0:
            return None
        small_sq, b_small, b_big = weighted / items, items / count, weight * weight / weight_sq
        if b_big <= b_small * (1 + 1e-9):  # one micro-batch outweighs the rest: the two batches do not differ
            return None
        grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
        grad_var = (small_sq - big_sq) / (1 / b_small - 1 / b_big)
        self._count += 1
        decay = self.smoothing
        self._ema_sq = decay * self._ema_sq + (1 - decay) * grad_sq
        self._ema_var = decay * self._ema_var + (1 - decay) * grad_var
        debias = 1 - decay ** self._count
        smooth_sq, smooth_var = self._ema_sq / debias, self._ema_var / debias
        scale = smooth_var / smooth_sq if smooth_sq > 0 else None
        per_sample = items / samples if samples > 0 else 1.0
        self.last = NoiseReading(smooth_sq, smooth_var, scale / per_sample if scale is not None else None, scale,
                                 b_small, b_big, grad_sq, grad_var, per_sample)
        return self.last

    def state_dict(self) -> dict[str, float]:
        """The smoothed estimates, for a checkpoint: a resumed run goes on with them (a batch schedule decides on
        them, and must decide as the uninterrupted run did)."""
        return {"ema_sq": self._ema_sq, "ema_var": self._ema_var, "count": self._count}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self._ema_sq, self._ema_var, self._count = float(state["ema_sq"]), float(state["ema_var"]), int(state["count"])

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
