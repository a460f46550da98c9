"""On one CUDA device, the memory levers that need it (issue 47): bitsandbytes' 8-bit AdamW and its paged form, their
states counted exactly and their estimate against the probe; the chunked loss's, activation offloading's and
--compile's estimates against the probe.

Rows of ``bash tests/gpu/gpu_check.sh`` (it runs every gpu-marked check in tests/gpu); skipped without a CUDA device.
"""

from __future__ import annotations

import pytest

from gaplan.devices.card import cuda_cards

from .estimate_errors import estimate_errors

CARDS = cuda_cards()  # asked in a forked child, as test_gpu.py does: this process never starts the driver
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CARDS.count, reason="needs a CUDA device")]


@pytest.mark.parametrize("optimizer", ["adamw-8bit", "paged-adamw-8bit"])
def test_8bit_adamw_states_and_estimate_on_cuda(optimizer, record_property):
    """The counted state is the real one after a step (the paged one's large states in unified memory, as tensors),
    and the estimate's peak is within 5% of the probe's reserved peak at two micro-batches (tiny-llama, seq 512)."""
    from gaplan.workload.build import WorkloadSpec

    spec = WorkloadSpec(model="tiny-llama", seq_len=512, optimizer=optimizer)
    counted, real = _state_in_child(spec)
    errors = estimate_errors(spec, [4, 16])
    record_property("measured", f"{optimizer}: states counted {counted} B, real {real} B; estimate vs reserved peak "
                                f"(tiny-llama seq 512 fp32) b=4: {errors[0]:+.1%}, b=16: {errors[1]:+.1%}")
    assert counted == real
    assert all(abs(e) <= 0.05 for e in errors), errors


def test_the_chunked_loss_estimate_on_cuda(record_property):
    """The chunked loss's estimate within 5% of the probe's reserved peak (tiny-llama, seq 512, bf16)."""
    from gaplan.workload.build import WorkloadSpec

    spec = WorkloadSpec(model="tiny-llama", seq_len=512, dtype="bf16", loss="chunked:256")
    errors = estimate_errors(spec, [4, 16])
    record_property("measured", f"loss chunked:256 estimate vs reserved peak (tiny-llama seq 512 bf16) b=4: "
                                f"{errors[0]:+.1%}, b=16: {errors[1]:+.1%}")
    assert all(abs(e) <= 0.05 for e in errors), errors


@pytest.mark.parametrize("checkpointing", ["off", "on"])
def test_the_activation_offloading_estimate_on_cuda(checkpointing, record_property):
    """--offload-activations (torch's save_on_cpu) estimated within 8% of the probe's reserved peak (tiny-llama, seq
    512, bf16; without and with checkpointing, as torchtune runs it)."""
    from gaplan.core.checkpointing import parse_checkpointing
    from gaplan.workload.build import WorkloadSpec

    spec = WorkloadSpec(model="tiny-llama", seq_len=512, dtype="bf16", offload_activations=True,
                        grad_checkpointing=parse_checkpointing(checkpointing))
    errors = estimate_errors(spec, [4, 16])
    record_property("measured", f"--offload-activations, checkpointing {checkpointing}: estimate vs reserved peak "
                                f"(tiny-llama seq 512 bf16) b=4: {errors[0]:+.1%}, b=16: {errors[1]:+.1%}")
    assert all(abs(e) <= 0.08 for e in errors), errors


def _state_in_child(spec) -> tuple[int, int]:
    """(counted, real) state bytes after one step on cuda:0, in a spawned child (this process keeps off the driver)."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_state_bytes_on_cuda, (spec,))


def _state_bytes_on_cuda(spec) -> tuple[int, int]:
    from gaplan.workload.build import build_workload
    from gaplan.workload.optimizers import optimizer_state_bytes
    from gaplan.workload.state_size import tensor_bytes

    workload = build_workload(spec, "cuda:0")
    workload.raw_loss(workload.model, workload.make_batch(2)).backward()
    workload.optimizer.step()
    states = [{k: v for k, v in state.items() if k != "step"} for state in workload.optimizer.state.values()]
    return optimizer_state_bytes(workload.model, spec.optimizer), tensor_bytes(states)


def test_the_compiled_estimate_on_cuda(record_property):
    """--compile estimated within 5% of the probe's reserved peak (tiny-llama, seq 512, bf16): the trace compiles the
    fake model as inductor partitions the step, the CUDA device model's modes inside the graphs; each probe trial
    compiles with inductor on the card. Last of the levers: its two trials compile (a minute or two)."""
    from gaplan.workload.build import WorkloadSpec

    spec = WorkloadSpec(model="tiny-llama", seq_len=512, dtype="bf16", compile=True)
    errors = estimate_errors(spec, [4, 16])
    record_property("measured", f"--compile estimate vs reserved peak (tiny-llama seq 512 bf16) b=4: {errors[0]:+.1%}, "
                                f"b=16: {errors[1]:+.1%}")
    assert all(abs(e) <= 0.05 for e in errors), errors
