"""The optimizers a workload trains with, built by the libraries made for them, and the bytes of their states.

``adamw`` and ``sgd`` are torch's (``adamw-fused`` and ``adamw-forloop``: its AdamW with ``fused=True`` and with
``foreach=False``, the same update and states with other kernels and temporaries); ``adamw-8bit`` and
``paged-adamw-8bit`` bitsandbytes' ``AdamW8bit`` and ``PagedAdamW8bit`` (block-wise 8-bit moments; the paged one
keeps large states in CUDA unified memory); ``adafactor`` transformers' ``Adafactor`` with a fixed learning rate, as
the HF Trainer builds it (factored second moments, no first moment); ``lion`` is :class:`Lion` below. What each
keeps is counted in :mod:`gaplan.workload.optimizer_states`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from gaplan.core.options import OptionError
from gaplan.workload.optimizer_states import EIGHT_BIT, state_bytes
from gaplan.workload.spec import PAGED_ON_CPU

_KERNEL_8BIT = "bitsandbytes::optimizer_update_8bit_blockwise"


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2): the sign of an
    interpolation of the momentum and the gradient, one momentum per parameter.

    ``c = b1 m + (1 - b1) g``; ``w <- w - lr (sign(c) + wd w)``; ``m <- b2 m + (1 - b2) g``.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0) -> None:
        if not lr > 0:
            raise ValueError(f"Lion: lr must be positive (got {lr})")
        if not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"Lion: betas must be in [0, 1) (got {betas})")
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), decay = group["lr"], group["betas"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                momentum, grad = state["exp_avg"], param.grad
                if decay:
                    param.mul_(1 - lr * decay)
                param.add_(momentum.lerp(grad, 1 - beta1).sign_(), alpha=-lr)
                momentum.lerp_(grad, 1 - beta2)
        return loss


def make_optimizer(model: nn.Module, name: str, lr: float) -> torch.optim.Optimizer:
    """``name``'s optimizer over the parameters of ``model`` that require grad (a frozen base has no states)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if name == "adamw-fused":  # one kernel per step (CUDA, and the CPU since torch 2.4)
        return torch.optim.AdamW(params, lr=lr, fused=True)
    if name == "adamw-forloop":  # one parameter at a time: the temporaries of the largest one only
        return torch.optim.AdamW(params, lr=lr, foreach=False, fused=False)
    if name == "lion":
        return Lion(params, lr=lr)
    if name == "adafactor":
        try:
            from transformers.optimization import Adafactor
        except ImportError:
            raise OptionError("optimizer adafactor needs transformers: pip install transformers", "optimizer") from None
        # The HF Trainer's "adafactor": the given learning rate, not Adafactor's relative step or parameter scaling.
        return Adafactor(params, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False)
    if name in EIGHT_BIT:
        bitsandbytes = _bitsandbytes(name)
        optimizer = (bitsandbytes.optim.PagedAdamW8bit if name.startswith("paged") else
                     bitsandbytes.optim.AdamW8bit)(params, lr=lr)
        # A real CPU run of the paged one is refused (check_optimizer_device); the estimate traces it on fake CPU
        # tensors, where bitsandbytes would warn that it does not page there.
        optimizer._cpu_paged_warned = True
        return optimizer
    return torch.optim.SGD(params, lr=lr)


def check_optimizer_device(name: str, device: torch.device) -> None:
    """A one-line error when ``name`` cannot run on ``device`` (the meta device, for the estimate, takes any)."""
    if name not in EIGHT_BIT:
        return
    bitsandbytes = _bitsandbytes(name)
    if device.type != "cpu":
        return
    if name == "paged-adamw-8bit":
        raise OptionError(PAGED_ON_CPU, "optimizer", "device")
    if not _has_cpu_kernel(_KERNEL_8BIT):
        raise OptionError(f"optimizer {name} on the CPU needs bitsandbytes with CPU optimizer kernels (installed: "
                          f"{getattr(bitsandbytes, '__version__', '?')}): pip install -U bitsandbytes, or use a CUDA "
                          "device (gaplan estimate plans it without one)", "optimizer", "device")


def optimizer_state_bytes(model: nn.Module, optimizer: str, this_rank: bool = False) -> int:
    """Bytes of the optimizer's states once they exist, over the trained parameters
    (:mod:`gaplan.workload.optimizer_states` says what each optimizer keeps).
    ``this_rank``: of a sharded model's local shards only (a DTensor's ``to_local()``)."""
    params = [p.to_local() if this_rank and hasattr(p, "to_local") else p for p in model.parameters() if p.requires_grad]
    return state_bytes([(tuple(p.shape), p.element_size()) for p in params], optimizer)


def _bitsandbytes(name: str) -> Any:
    from gaplan.workload.quantize import quiet_bitsandbytes

    try:
        with quiet_bitsandbytes():
            import bitsandbytes
    except ImportError:
        raise OptionError(f"optimizer {name} needs bitsandbytes: pip install bitsandbytes", "optimizer") from None
    return bitsandbytes


def _has_cpu_kernel(op: str) -> bool:
    """Whether the custom operator ``op`` has a CPU kernel registered (bitsandbytes registers one per backend)."""
    check = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)
    if check is None:
        return True  # a torch without the query: let bitsandbytes itself say what it cannot run
    try:
        return bool(check(op, "CPU"))
    except RuntimeError:  # the operator is not registered at all
        return False
