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

The ``1/B`` above hold for independent draws. Samples drawn without replacement (gaplan's own order: a permutation
of the ``N`` samples each epoch) covary, and the meter then solves the same two equations with the variances that
drawing gives (:mod:`gaplan.plan.draws`: the finite-population correction, a step across an epoch boundary, the
ranks' shares of one order). Each micro-step then says which draws its samples come from (``parts``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gaplan.plan.draws import LOCAL, SHARED_PARTS, Drawing, inverse_sizes

DEFAULT_SMOOTHING = 0.95  # the EMAs' decay: about the last 20 steps count


@dataclass(frozen=True)
class NoiseReading:
    """One step's measurement and the smoothed estimates after it (``None`` where not yet defined)."""

    grad_sq: float | None  # |G|^2, smoothed (per item)
    grad_var: float | None  # tr(S), smoothed (per item)
    noise_scale: float | None  # B_noise in samples
    noise_scale_items: float | None  # B_noise in items (targets)
    small_batch: float  # B_small of this step, in items (with draws without replacement: 1 / its variance per item)
    big_batch: float  # B_big of this step, in items (the batch whose variance the step's mean gradient has; inf when
    # the step holds every sample once, so its mean is the full gradient)
    step_grad_sq: float  # this step's own |G|^2 estimate (per item), before smoothing: unbiased, can be < 0
    step_grad_var: float  # this step's own tr(S) estimate (per item), before smoothing
    items_per_sample: float  # the step's items over its samples (B_noise in samples = in items / this)
    drawing: str = "unknown"  # how the samples were drawn (gaplan.plan.draws.KINDS): "unknown" assumes independent


class NoiseScaleMeter:
    """Hooks on ``model``'s trainable parameters that measure the gradient noise scale of each optimizer step.

    Per step: :meth:`start_micro_step` before a micro-step's backward, :meth:`end_micro_step` after it (with its
    items and how its loss was scaled), then :meth:`finish` once ``.grad`` holds the reduced, unscaled step gradient.
    :meth:`skip` drops a step that cannot be measured.
    """

    def __init__(self, model: nn.Module, smoothing: float = DEFAULT_SMOOTHING, reduce: Any = None,
                 drawing: Drawing | None = None) -> None:
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.smoothing = smoothing
        self.reduce = reduce  # sums a list of floats over the ranks (None: one process)
        self.drawing = drawing if drawing is not None else Drawing()  # how the samples are drawn
        self.last: NoiseReading | None = None  # the latest step's reading
        self._norms: list[torch.Tensor] = []  # this micro-step's gradient norms, a parameter each
        # (|contribution|^2, factor, items, its samples per draw) per micro-step
        self._steps: list[tuple[torch.Tensor, float, float, tuple[tuple[int, int], ...]]] = []
        self._ema_sq = self._ema_var = 0.0
        self._count = 0
        self._handles = [p.register_hook(self._add) for p in self.parameters]

    def _add(self, grad: torch.Tensor) -> None:
        # A vector norm reduces without a squared copy of the gradient: no extra peak memory. One op per parameter
        # here; the squares are summed once per micro-step.
        self._norms.append(torch.linalg.vector_norm(grad, dtype=torch.promote_types(grad.dtype, torch.float32)))

    def start_micro_step(self) -> None:
        self._norms = []

    def end_micro_step(self, items: float, divisor: float, multiplier: float = 1.0, loss_scale: float = 1.0,
                       parts: Sequence[tuple[int, int]] | None = None) -> None:
        """The micro-step just backpropagated its loss summed over its ``items``, divided by ``divisor``, times
        ``multiplier`` (the world size, where the loss undoes DDP's average) and ``loss_scale`` (fp16's scaler).

        The one rescaling rule of every caller: a loss summed over the step's ``N`` targets has ``divisor=N``; a
        per-batch mean divided by the ``K`` accumulation steps has ``divisor=items * K``; Lightning's summed loss
        divided by ``accumulate_grad_batches`` has that for ``divisor``.

        ``parts``: its samples per draw, ``((key, samples), ...)``, needed where the drawing is without replacement:
        the key is the epoch's offset from the step's first (gaplan's order, shared by the ranks) or
        :data:`gaplan.plan.draws.LOCAL` (a draw of this rank's own).
        """
        if self._norms and items > 0:
            if self.drawing.without_replacement and not parts:
                raise ValueError(f"a {self.drawing.kind} drawing needs each micro-step's samples per draw (parts)")
            # Its contribution to .grad times this factor is its own mean gradient.
            factor = divisor / (items * multiplier * loss_scale)
            self._steps.append((torch.stack(self._norms).square().sum(), factor, items, tuple(parts or ())))
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
        weighted = float(torch.stack([s.double() * (f * f) * n for s, f, n, _ in steps]).sum()) if steps else 0.0
        # Each micro-batch's weight in .grad is 1 / factor up to one constant (DDP's average, the loss scale), which
        # the variances normalize away (gaplan.plan.draws.inverse_sizes).
        local = [weighted, float(sum(n for _, _, n, _ in steps)), float(len(steps)), float(samples),
                 sum(1 / f for _, f, _, _ in steps), sum(1 / (f * f * n) for _, f, n, _ in steps),
                 *_draw_sums(steps)]
        (weighted, items, count, samples, weight, weight_sq, drawn, *shared, local_sq,
         beyond) = self.reduce(local) if self.reduce is not None else local
        grads = [p.grad for p in self.parameters if p.grad is not None]
        big_sq = float(torch.stack([torch.linalg.vector_norm(g, dtype=torch.promote_types(g.dtype, torch.float32))
                                    .double() for g in grads])
                       .square().sum()) if grads else 0.0
        if count < 2 or not (math.isfinite(weighted) and math.isfinite(big_sq)) or items <= 0 or weight_sq <= 0:
            return None
        if beyond and self.drawing.kind == "epochs":  # a step past two epochs: larger than the dataset
            return None
        v_small, v_big = inverse_sizes(self.drawing, count, items, samples, drawn, weight, weight_sq,
                                       sum(u * u for u in shared) + local_sq)
        if v_big >= v_small * (1 - 1e-9):  # one micro-batch outweighs the rest: the two batches do not differ
            return None
        small_sq = weighted / items
        grad_sq = (v_small * big_sq - v_big * small_sq) / (v_small - v_big)
        grad_var = (small_sq - big_sq) / (v_small - v_big)
        b_small, b_big = 1 / v_small, (1 / v_big if v_big > 0 else math.inf)
        self._count += 1
        decay = self.smoothing
        self._ema_sq = decay * self._ema_sq + (1 - decay) * grad_sq
        self._ema_var = decay * self._ema_var + (1 - decay) * grad_var
        debias = 1 - decay ** self._count
        smooth_sq, smooth_var = self._ema_sq / debias, self._ema_var / debias
        scale = smooth_var / smooth_sq if smooth_sq > 0 else None
        per_sample = items / samples if samples > 0 else 1.0
        self.last = NoiseReading(smooth_sq, smooth_var, scale / per_sample if scale is not None else None, scale,
                                 b_small, b_big, grad_sq, grad_var, per_sample, self.drawing.kind)
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


def _draw_sums(steps: Sequence[tuple[Any, float, float, tuple[tuple[int, int], ...]]]) -> list[float]:
    """This rank's sums of the micro-steps' draws, to add over the ranks: ``sum_m sum_P s_mP^2 / s_m``; the weight
    ``sum_m w_m s_mP / s_m`` of each shared part (epoch offsets 0 and 1); the squared weight of this rank's own
    part (one draw a step: the rank's micro-batches are slices of one ``make_batch`` call); and how many parts lie
    past the shared ones."""
    drawn, own, beyond = 0.0, 0.0, 0.0
    shared = [0.0] * SHARED_PARTS
    for _, factor, _, parts in steps:
        samples = sum(count for _, count in parts)
        for key, count in parts:
            drawn += count * count / samples
            share = count / samples / factor
            if key == LOCAL:
                own += share
            elif 0 <= key < SHARED_PARTS:
                shared[key] += share
            else:
                beyond += 1
    return [drawn, *shared, own * own, beyond]
