"""Checkpointed blocks recomputed under the torch-function modes their forward ran under.

The CUDA device model changes the trace through torch-function modes (:class:`gaplan.estimate.device.CudaAutocastFp32`:
CUDA autocast's float32 op list; :class:`gaplan.estimate.attention.CudaAttention`: CUDA's SDPA backend). A
torch-function mode is popped while it handles a call, and ``loss.backward()`` is such a call: the whole backward,
and with it every recomputation of activation checkpointing, runs without the modes. An eager attention's
probabilities were then fp32 in the forward (softmax is on CUDA autocast's fp32 list) and fp16 when recomputed, and
torch stopped the trace (``CheckpointError``: the recomputed tensors' metadata differ from the saved ones). torch
itself re-enters one such mode in the recomputation (``torch.device`` as a context, its ``DeviceContext``) for the
same reason. Here every non-reentrant checkpoint started inside :func:`recompute_under_forward_modes` recomputes under
the torch-function modes that were active at its forward, as a real GPU run recomputes under the autocast it ran
the forward with. Reentrant checkpoints (``use_reentrant=True``, which gaplan never asks for) are left as they are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from gaplan.estimate.torch_private import private, private_attr, private_module


@contextlib.contextmanager
def recompute_under_forward_modes() -> Iterator[None]:
    """Inside, a non-reentrant checkpoint recomputes under the torch-function modes active at its forward."""
    checkpoint_module = private_module("torch.utils.checkpoint")
    original = private_attr(checkpoint_module, "_checkpoint_without_reentrant_generator")
    noop = private_attr(checkpoint_module, "noop_context_fn")
    mode_stack = private("torch.overrides", "_get_current_function_mode_stack")
    device_context = private("torch.utils._device", "DeviceContext")  # torch re-enters it itself

    def generator(fn, preserve_rng_state=True, context_fn=noop, *args, **kwargs):
        forward_modes = [m for m in mode_stack() if not isinstance(m, device_context)]
        if not forward_modes:
            return original(fn, preserve_rng_state, context_fn, *args, **kwargs)

        def contexts():
            forward, recompute = context_fn()
            return forward, _reentered(forward_modes, recompute, mode_stack)

        return original(fn, preserve_rng_state, contexts, *args, **kwargs)

    checkpoint_module._checkpoint_without_reentrant_generator = generator
    try:
        yield
    finally:
        checkpoint_module._checkpoint_without_reentrant_generator = original


@contextlib.contextmanager
def _reentered(modes: list, inner: contextlib.AbstractContextManager, mode_stack) -> Iterator[None]:
    """``modes`` (outermost first) entered again where they are not active now, then ``inner``."""
    active = {id(m) for m in mode_stack()}
    with contextlib.ExitStack() as stack:
        for mode in modes:
            if id(mode) not in active:
                stack.enter_context(mode)
        stack.enter_context(inner)
        yield
