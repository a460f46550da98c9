"""Tests of the CUDA *glue*, run on CPU with stand-ins for the ``torch.cuda`` functions it calls.

They check what gaplan asks of CUDA (which memory fraction, which device, which backend, when the
cache is freed, what counts as out of memory), not a GPU: the GPU itself is checked by the
``gpu``-marked tests and ``tests/gpu/gpu_check.sh`` on a CUDA machine.
"""

import torch

from gaplan.devices.backend import is_out_of_memory, release_after_oom
from gaplan.devices.cuda import CudaBackend
from gaplan.parallel.process_group import local_device, process_group_backend

GiB = 2**30


class CudaStandIn:
    """Records the torch.cuda calls made, for a card of ``total`` bytes."""

    def __init__(self, monkeypatch, total: int = 80 * GiB) -> None:
        self.calls: list[tuple] = []
        self.total = total
        properties = type("Properties", (), {"total_memory": total})
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: properties)
        monkeypatch.setattr(torch.cuda, "set_device", lambda device: self.calls.append(("set_device", str(device))))
        monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                            lambda fraction, device: self.calls.append(("fraction", fraction, str(device))))
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: self.calls.append(("empty_cache",)))


def test_the_budget_is_a_memory_fraction_of_the_card(monkeypatch):
    cuda = CudaStandIn(monkeypatch)
    backend = CudaBackend("cuda:3")
    backend.activate(20 * GiB)
    assert backend.limit_bytes == 20 * GiB
    assert cuda.calls == [("set_device", "cuda:3"), ("fraction", 0.25, "cuda:3")]


def test_no_budget_or_a_larger_one_is_the_whole_card_and_sets_no_fraction(monkeypatch):
    for limit in (None, 200 * GiB):
        cuda = CudaStandIn(monkeypatch)
        backend = CudaBackend("cuda:0")
        backend.activate(limit)
        assert backend.limit_bytes == 80 * GiB
        assert [c for c in cuda.calls if c[0] == "fraction"] == []


def test_the_cache_is_freed_after_an_oom_on_cuda_only(monkeypatch):
    cuda = CudaStandIn(monkeypatch)
    release_after_oom("cpu")
    assert cuda.calls == []
    release_after_oom("cuda:1")
    assert cuda.calls == [("empty_cache",)]


def test_only_allocator_ooms_are_retried_sticky_cuda_errors_are_fatal():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; ...)"))
    # A kernel launch or cuBLAS init failing leaves the context broken: never retried with a smaller batch.
    assert not is_out_of_memory(RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously "
                                             "reported at some other API call"))
    assert not is_out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))


def test_the_process_group_carries_cpu_tensors_on_gloo_and_cuda_ones_on_nccl():
    assert process_group_backend("cuda:0") == "cpu:gloo,cuda:nccl"
    assert process_group_backend("cpu") == "gloo"


def test_each_process_trains_on_its_local_gpu_not_its_global_rank(monkeypatch):
    # Rank 11 of 16 is the fourth process of the second node of 8 GPUs: cuda:3, not cuda:11.
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("RANK", "11")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert local_device("cuda:0") == "cuda:3"
    assert local_device("cpu") == "cpu"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert local_device("cuda:1") == "cuda:1"  # one process: the device asked for


def test_a_checkpoint_is_loaded_onto_this_ranks_device(tmp_path):
    from gaplan.runs.folder import CHECKPOINT
    from gaplan.training.checkpoint import load_checkpoint, save_checkpoint
    from tests.training.test_checkpoint_record import SHAPE as shape  # what a checkpoint holds

    save_checkpoint(str(tmp_path / CHECKPOINT), {**shape, "model": {"weight": torch.ones(3)}, "step": 2})
    loaded = load_checkpoint(str(tmp_path), map_location="meta")  # wherever it was saved from
    assert loaded["model"]["weight"].device.type == "meta" and loaded["step"] == 2
