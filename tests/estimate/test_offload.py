"""Activation offloading (``--offload-activations``): the traces' model of torch's ``save_on_cpu`` keeps nothing saved
on the device (checked against a hand count), the estimate's B* grows with it, its host copies are counted, and a CPU
device refuses it in one line. The GPU's own peak with ``save_on_cpu`` is ``tests/gpu/test_gpu_levers.py``'s."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from gaplan.core.errors import GaplanError
from gaplan.estimate import estimate
from gaplan.estimate.offload import HostCopies, offloaded_to_host
from gaplan.training.breakdown import memory_tracker
from gaplan.workload.build import WorkloadSpec, build_workload

B, H, LAYERS = 8, 32, 3


def _after_forward(offload: bool) -> tuple[int, int, HostCopies]:
    """(bytes the tracker holds after a chain's forward, after its backward's peak, the copies counted)."""
    torch.manual_seed(0)
    chain = nn.Sequential(*[nn.Linear(H, H, bias=False) for _ in range(LAYERS)])
    x = torch.randn(B, H)
    copies = HostCopies()
    tracker = memory_tracker()
    tracker.track_external(chain)
    with tracker:
        with offloaded_to_host(copies) if offload else torch.autograd.graph.saved_tensors_hooks(
                lambda t: t, lambda t: t):
            y = chain(x).square().sum()
        held = tracker.get_tracker_snapshot("current")[torch.device("cpu")]["Total"]
        y.backward()
    return held, tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"], copies


def test_offloading_keeps_nothing_saved_on_the_device():
    weights = LAYERS * H * H * 4
    held, _, copies = _after_forward(offload=True)
    # The weights and the loss (the input was made before the tracker): each layer's saved input and weight, and
    # square's input, went to the host.
    assert held == weights + 4
    # The first layer saves its input alone (no gradient flows to it, so its weight is not needed), the others their
    # input and weight, square its input.
    assert copies.bytes == B * H * 4 + (LAYERS - 1) * (B * H * 4 + H * H * 4) + B * H * 4
    kept, _, _ = _after_forward(offload=False)
    # Without it, the device keeps what was saved and is not a weight: the outputs of the first layers, and the last
    # one's (square's input).
    assert kept - held == LAYERS * B * H * 4


def test_backward_brings_back_one_node_at_a_time():
    _, peak_off, _ = _after_forward(offload=True)
    _, peak_kept, _ = _after_forward(offload=False)
    weights = LAYERS * H * H * 4
    # Weights, their gradients, and one node's unpacked tensors with the gradients it makes (no context needed). A
    # weight comes back as a copy of its own (save_on_cpu moves parameters too): with activations this small, that
    # copy outweighs what was offloaded, and the peak is above the kept one's.
    assert weights < peak_off <= 2 * weights + H * H * 4 + 4 * B * H * 4 + 4
    assert peak_off - peak_kept <= H * H * 4


def test_the_estimate_offloads_and_counts_the_copies():
    spec = WorkloadSpec(model="tiny-llama", seq_len=128, dtype="bf16")
    kept = estimate(spec, target="h100-80gb", effective_batch=64, sizes=[1, 2])
    off = estimate(dataclasses.replace(spec, offload_activations=True), target="h100-80gb",
                   effective_batch=64, sizes=[1, 2])
    assert off.line[1] < kept.line[1]  # less held a sample
    assert off.extra["host_bytes_per_sample"] > 0.5 * kept.line[1]  # what left the device went somewhere
    assert "host_bytes_per_sample" not in kept.extra


def test_a_cpu_refuses_it_in_one_line():
    spec = WorkloadSpec(model="tiny-gpt2", offload_activations=True)
    with pytest.raises(GaplanError, match="host memory already") as caught:
        estimate(spec, device_kind="cpu", effective_batch=4)
    assert "\n" not in str(caught.value)
    with pytest.raises(GaplanError, match="host memory already"):
        spec.check_device("cpu")
    spec.check_device("auto")  # an estimate's default: a GPU; a run resolves auto where it builds the model
    with pytest.raises(GaplanError, match="host memory already"):  # there, for a Python caller too
        build_workload(spec, "cpu")


def test_forward_context_on_a_cpu_is_autocast_alone():
    workload = build_workload(WorkloadSpec(model="tiny-gpt2", seq_len=16), "cpu")
    calls = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: calls.append(1) or t, lambda t: t):
        with workload.forward_context():  # no save_on_cpu of its own, which would take the hooks' place
            workload.raw_loss(workload.model, workload.make_batch(2))
    assert calls


@pytest.mark.slow
@pytest.mark.heavy  # re-traces docs/levers.md's figures, as tests/test_docs_levers.py does
def test_the_documented_figures():
    """docs/levers.md#activation-offloading: tiny-llama, seq 512, bf16, an H100 80 GB target."""
    from gaplan.core.checkpointing import ON

    spec = WorkloadSpec(model="tiny-llama", seq_len=512, dtype="bf16")
    mib = 2**20

    def traced(the_spec):
        return estimate(the_spec, target="h100-80gb", effective_batch=256)

    kept, off = traced(spec), traced(dataclasses.replace(spec, offload_activations=True))
    ckpt = traced(dataclasses.replace(spec, offload_activations=True, grad_checkpointing=ON))
    assert (round(off.line[1] / mib, 1), round(kept.line[1] / mib, 1)) == (48.0, 77.2)
    assert round(off.extra["host_bytes_per_sample"] / mib, 1) == 66.6
    assert round(ckpt.extra["host_bytes_per_sample"] / mib, 1) == 35.8


def test_a_linear_layers_weight_reaches_the_saved_tensor_hooks_as_a_view_not_a_parameter():
    """docs/levers.md: an offloader that skips ``nn.Parameter`` (torchtune's) still offloads linear layers' weights,
    which autograd saves as ``weight.t()``."""
    linear = torch.nn.Linear(8, 8)
    packed = []

    def pack(tensor):
        packed.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        linear(torch.randn(2, 3, 8, requires_grad=True)).sum().backward()
    weights = [t for t in packed if t.data_ptr() == linear.weight.data_ptr()]
    assert len(weights) == 1 and not isinstance(weights[0], torch.nn.Parameter)
    assert weights[0].shape == linear.weight.t().shape
