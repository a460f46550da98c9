"""Peak memory by category: parameters, gradients, optimizer states, activations, other.

Counted at the dispatch level by torch's ``MemTracker`` (a TorchDispatchMode that
tags every tensor by what it is) over one steady-state step: optimizer states
present, micro-steps accumulating into live gradients, then the optimizer step.
The same count runs on fake tensors for ``gaplan estimate``; here it runs on a real
workload, next to the device's own peak.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gaplan.core.constants import BREAKDOWN_CATEGORIES
from gaplan.core.errors import GaplanError
from gaplan.training.step import accumulate_gradients
from gaplan.workload.build import Workload

CATEGORIES = BREAKDOWN_CATEGORIES

# An operator's transient bytes: ``workspace(func, args)`` -> bytes it holds only while it runs (0 for most).
Workspace = Callable[[Any, tuple], int]

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


def measure_breakdown(workload: Workload, micro_batch: int, micro_steps: int = 2,
                      workspace: Workspace | None = None, compiled: bool = False) -> MemoryBreakdown:
    """Run one steady-state step at ``micro_batch`` under ``MemTracker`` and return its peak by category.

    The optimizer states must already exist (:func:`gaplan.worker.trial.materialize_optimizer_state`);
    they are tracked from the optimizer, so they are counted even though they were made earlier.
    ``workspace(func, args)``, when given, is the bytes an operator holds only while it runs (a BLAS call's
    packing buffers): counted in ``other`` at that moment, on top of what is live then. ``compiled``: the model is
    compiled, and its graphs run under the tracker (:func:`memory_tracker`).
    """
    tracker = memory_tracker(workspace, compiled)
    tracker.track_external(workload.model, workload.optimizer)
    batches = [workload.make_batch(micro_batch) for _ in range(micro_steps)]

    def raw_loss(model, batch):
        # MemTracker refuses a second forward of a module it has seen; its peak survives this reset.
        tracker.reset_mod_stats()
        return workload.raw_loss(model, batch)

    with tracker:
        accumulate_gradients(workload.model, batches, raw_loss, workload.task,
                             workload.loss_is_scaled_for_ga, workload.forward_context)
        workload.optimizer.step()
        workload.optimizer.zero_grad(set_to_none=True)
    del batches
    peak = _device_peak(tracker.get_tracker_snapshot("peak"), workload.device)
    by_category = dict.fromkeys(CATEGORIES, 0)
    for kind, category in _CATEGORY_OF.items():
        by_category[category] += int(peak.get(kind, 0))
    return MemoryBreakdown(micro_batch, **by_category, tracked_total=sum(by_category.values()))


def memory_tracker(workspace: Workspace | None = None, compiled: bool = False):
    """torch's ``MemTracker``, able to trace a model with frozen parameters (LoRA's base).

    ``MemTracker`` registers a gradient hook on every parameter of each module it enters, and torch refuses a hook
    on a tensor that does not require grad ("cannot register a hook on a tensor that doesn't require gradient").
    Here its hooks go on the trainable parameters only; a frozen one has no gradient to count.

    With ``workspace``, an operator's transient bytes count at the moment it runs, over what is live then (its
    output included): a buffer that lives only inside one call adds to the peak only if that call is at the peak.

    ``compiled``: dynamo skips a compiled model's frames while a dispatch mode is on the stack, unless the mode says
    it may be left out while compiling (``ignore_compile_internals``); this one then sees the compiled graphs' ops.
    """
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _MemRefType

    class FrozenAwareMemTracker(MemTracker):
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return compiled

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = super().__torch_dispatch__(func, types, args, kwargs)
            extra = workspace(func, args) if workspace is not None and result is not NotImplemented else 0
            if extra:
                for device, current in self._curr_mem_snap.items():
                    if current[_TOTAL_KEY] + extra > self._peak_mem.get(device, 0):
                        peak = dict(current)
                        peak[_MemRefType.TEMP] = peak.get(_MemRefType.TEMP, 0) + extra
                        peak[_TOTAL_KEY] = current[_TOTAL_KEY] + extra
                        self._peak_mem[device], self._peak_mem_snap[device] = peak[_TOTAL_KEY], peak
            return result

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
