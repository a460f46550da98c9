"""Peak memory by category: parameters, gradients, optimizer states, activations, other.

Counted at the dispatch level by torch's ``MemTracker`` (a TorchDispatchMode that
tags every tensor by what it is) over one steady-state step: optimizer states
present, micro-steps accumulating into live gradients, then the optimizer step.
The same count runs on fake tensors for ``gaplan estimate``; here it runs on a real
workload, next to the device's own peak.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gaplan.core.constants import BREAKDOWN_CATEGORIES
from gaplan.core.errors import GaplanError
from gaplan.training.step import accumulate_gradients
from gaplan.workload.build import Workload

CATEGORIES = BREAKDOWN_CATEGORIES

# MemTracker's reference types -> gaplan's categories (buffers count with parameters, temporaries with other).
_CATEGORY_OF = {"Parameter": "parameters", "Buffer": "parameters", "Gradient": "gradients",
                "Optstate": "optimizer_states", "Activation": "activations", "Temp": "other", "Other": "other"}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes by category at the step's peak (their sum is ``tracked_total``)."""

    micro_batch: int
    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    other: int
    tracked_total: int
    device_peak_bytes: int | None = None  # the device's own peak for the same step, when measured

    def to_dict(self) -> dict:
        return asdict(self)


def measure_breakdown(workload: Workload, micro_batch: int, micro_steps: int = 2) -> MemoryBreakdown:
    """Run one steady-state step at ``micro_batch`` under ``MemTracker`` and return its peak by category.

    The optimizer states must already exist (:func:`gaplan.worker.trial.materialize_optimizer_state`);
    they are tracked from the optimizer, so they are counted even though they were made earlier.
    """
    tracker = memory_tracker()
    tracker.track_external(workload.model, workload.optimizer)
    batches = [workload.make_batch(micro_batch) for _ in range(micro_steps)]

    def raw_loss(model, batch):
        # MemTracker refuses a second forward of a module it has seen; its peak survives this reset.
        tracker.reset_mod_stats()
        return workload.raw_loss(model, batch)

    with tracker:
        accumulate_gradients(workload.model, batches, raw_loss, workload.task,
                             workload.loss_is_scaled_for_ga, workload.autocast)
        workload.optimizer.step()
        workload.optimizer.zero_grad(set_to_none=True)
    del batches
    peak = _device_peak(tracker.get_tracker_snapshot("peak"), workload.device)
    by_category = dict.fromkeys(CATEGORIES, 0)
    for kind, category in _CATEGORY_OF.items():
        by_category[category] += int(peak.get(kind, 0))
    return MemoryBreakdown(micro_batch, **by_category, tracked_total=sum(by_category.values()))


def memory_tracker():
    """torch's ``MemTracker``, able to trace a model with frozen parameters (LoRA's base).

    ``MemTracker`` registers a gradient hook on every parameter of each module it enters, and torch refuses a hook
    on a tensor that does not require grad ("cannot register a hook on a tensor that doesn't require gradient").
    Here its hooks go on the trainable parameters only; a frozen one has no gradient to count.
    """
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    class FrozenAwareMemTracker(MemTracker):
        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            memory = super()._track_module_params_and_buffers(module, install_grad_hooks=False)

            def count(grad) -> None:  # a hook that returns None leaves the gradient as it is
                self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

            if install_grad_hooks:
                for param in module.parameters():
                    if param.requires_grad and self._param_to_grad_hook_handles.get(param) is None:
                        self._param_to_grad_hook_handles[param] = (
                            param.register_hook(count), param.register_post_accumulate_grad_hook(lambda p: count(p.grad)))
            return memory

    return FrozenAwareMemTracker()


def _device_peak(snapshot: dict, device) -> dict:
    """The snapshot's entry for ``device``; ``cpu`` and ``cpu:0`` (or ``cuda`` and ``cuda:0``) are the same device.

    Anything else is an error that names what MemTracker did report, not a silent guess.
    """
    import torch

    wanted = torch.device(device)
    for key, value in snapshot.items():
        found = torch.device(key)
        if found.type == wanted.type and (found.index or 0) == (wanted.index or 0):
            return value
    seen = ", ".join(str(key) for key in snapshot) or "nothing"
    raise GaplanError(f"the memory breakdown found no peak for device {wanted} (torch's MemTracker reported {seen})")
