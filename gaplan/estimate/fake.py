"""The fake workload: the model built on the meta device, its tensors turned into fake CPU tensors.

``build_workload(spec, "meta")`` gives shapes only; every parameter, buffer and tensor attribute
then becomes a fake CPU tensor (``FakeTensorMode``: shape, dtype and strides, no storage). A
Llama-2-7B shape costs a few hundred MiB of host memory, not 27 GB. Batches are fake too, shaped
like the workload's own.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gaplan.core.errors import GaplanError
from gaplan.estimate.torch_private import private

if TYPE_CHECKING:
    from gaplan.estimate.device import DeviceModel
    from gaplan.workload.build import Workload, WorkloadSpec

_FAKE_TENSOR = "torch._subclasses.fake_tensor"


def fake_tensor_mode():
    """A ``FakeTensorMode`` that accepts real inputs (the batch maker's meta tensors are copied in)."""
    return private(_FAKE_TENSOR, "FakeTensorMode")(allow_non_fake_inputs=True)


@contextlib.contextmanager
def fake_tensor_errors(spec: WorkloadSpec) -> Iterator[None]:
    """Turn what fake tensors cannot trace into one line for the user."""
    untraceable = tuple(private(_FAKE_TENSOR, name) for name in (
        "DynamicOutputShapeException", "DataDependentOutputException", "UnsupportedOperatorException"))
    try:
        yield
    except untraceable as exc:
        op = exc.args[0] if exc.args else type(exc).__name__
        raise GaplanError(f"{spec.model}: cannot be traced without allocating: it runs {op}, whose result depends on "
                          "tensor values; use gaplan probe on a real device") from None


def fake_workload(spec: WorkloadSpec, device: DeviceModel, mode) -> Workload:
    """The workload of ``spec`` with fake CPU parameters, the device's optimizer and fake batches."""
    import torch
    from torch import nn

    from gaplan.workload.build import build_workload, model_source_kind

    # A module:function model builds itself; the default device keeps its tensors on meta too.
    scope = torch.device("meta") if model_source_kind(spec.model) == "function" else contextlib.nullcontext()
    with scope:
        meta = build_workload(spec, "meta")
    model = meta.model
    fakes: dict[int, torch.Tensor] = {}

    def fake_of(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in fakes:
            with mode:
                fakes[id(tensor)] = torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype,
                                                        device="cpu")
        return fakes[id(tensor)]

    parameters: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in parameters:  # tied weights stay tied
                parameters[id(param)] = nn.Parameter(fake_of(param), requires_grad=param.requires_grad)
            module._parameters[name] = parameters[id(param)]
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = fake_of(buffer)
        for name, value in list(vars(module).items()):  # plain tensor attributes (cached tables and the like)
            if isinstance(value, torch.Tensor) and value.device.type == "meta":
                setattr(module, name, fake_of(value))
    return dataclasses.replace(meta, optimizer=device.make_optimizer(model, spec), make_batch=fake_batch_maker(meta, mode),
                               device=torch.device("cpu"))


@contextlib.contextmanager
def readable_values() -> Iterator[None]:
    """Let transformers read the fake batch's values, as it reads a real batch's.

    transformers takes a fake tensor for a trace it cannot read (``is_tracing``), and then keeps what a real run would
    drop after reading the values: the 4-D attention mask (a padding mask of ones is dropped, and a packed-sequence
    check of the positions finds none), and with it SDPA's grouped-query heads repeated (``repeat_kv``) and kept for
    backward, 0.5 MiB a sample on a 4 x 128 Llama with 2 key-value heads. The trace answers every value read as a full,
    unpacked batch does (:class:`gaplan.estimate.trace.TraceHelper`: ``True`` for a boolean), so it may read them.
    Without transformers' ``is_fake_tensor`` (another version) nothing is changed.
    """
    try:
        from transformers.utils import import_utils
    except ImportError:
        yield
        return
    original = getattr(import_utils, "is_fake_tensor", None)
    if original is None:
        yield
        return
    import_utils.is_fake_tensor = lambda tensor: False
    try:
        yield
    finally:
        import_utils.is_fake_tensor = original


def fake_batch_maker(meta: Workload, mode):
    """Fake batches shaped like the workload's own (read from real batches of one and two samples)."""
    import torch

    disable_current_modes = private("torch.utils._python_dispatch", "_disable_current_modes")
    with disable_current_modes():  # a real, tiny batch (on meta): the batch maker may index by value
        one, two = meta.make_batch(1), meta.make_batch(2)

    def make_batch(size: int) -> dict[str, Any]:
        batch: dict[str, Any] = {}
        with mode:
            for key, value in one.items():
                if not isinstance(value, torch.Tensor):
                    batch[key] = value
                    continue
                shape = list(value.shape)
                scaled = isinstance(two.get(key), torch.Tensor) and value.dim() > 0 and two[key].shape[0] == 2 * shape[0]
                if scaled:
                    shape[0] = shape[0] * size
                batch[key] = torch.zeros(shape, dtype=value.dtype, device="cpu")
        return batch

    return make_batch


def no_step_optimizer(optimizer):
    """The optimizer's states with a step that does nothing: the micro-steps' peak alone."""
    import torch

    class _NoStep(torch.optim.Optimizer):
        def __init__(self, inner: torch.optim.Optimizer) -> None:  # no super().__init__: shares the inner state
            self.inner = inner
            self.state = inner.state
            self.param_groups = inner.param_groups
            self.defaults = inner.defaults

        def step(self, closure=None):
            return None

        def zero_grad(self, set_to_none: bool = True) -> None:
            self.inner.zero_grad(set_to_none=set_to_none)

    return _NoStep(optimizer)
