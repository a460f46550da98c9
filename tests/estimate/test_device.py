"""gaplan.estimate.device: CUDA's allocator blocks and autocast list, a CPU process's overhead."""

from __future__ import annotations

from gaplan.estimate.device import (
    CPU_HEAP_BYTES,
    CPU_HEAP_BYTES_PER_NODE,
    DeviceModel,
    GraphCount,
    mkl_panel_bytes,
)


def test_cuda_autocast_float32_ops_run_in_float32():
    import torch
    import torch.nn.functional as F

    from gaplan.estimate.device import CudaAutocastFp32

    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = torch.nn.functional.linear(x, torch.randn(8, 8))
        assert low.dtype == torch.bfloat16
        assert F.layer_norm(low, (8,)).dtype == torch.bfloat16  # CPU autocast keeps it low
        with CudaAutocastFp32():
            assert F.layer_norm(low, (8,)).dtype == torch.float32  # as CUDA autocast does
            assert F.softmax(low, -1).dtype == torch.float32
            assert torch.pow(low, 3.0).dtype == torch.float32
            assert (low ** 2).dtype == torch.float32
            assert F.gelu(low).dtype == torch.bfloat16  # not on the list
    with CudaAutocastFp32():
        assert F.softmax(x.bfloat16(), -1).dtype == torch.bfloat16  # outside autocast nothing changes


def test_a_cpu_process_holds_heap_and_a_gemm_buffer_while_a_product_runs_cuda_nothing():
    import torch

    panel = mkl_panel_bytes(1024, 100_000)
    assert panel == 4 * 256 * 4096 and mkl_panel_bytes(64, 1024) == 4 * 64 * 1024
    cpu = DeviceModel("cpu", threads=2)
    assert cpu.overhead(0) == CPU_HEAP_BYTES and cpu.overhead(1000) == CPU_HEAP_BYTES + 1000 * CPU_HEAP_BYTES_PER_NODE
    assert cpu.extra(panel, 10) == {"threads": 2, "cpu_heap_bytes": CPU_HEAP_BYTES + 10 * CPU_HEAP_BYTES_PER_NODE,
                                    "graph_nodes": 10, "mkl_panel_bytes": panel}
    workspace = cpu.workspace()
    aten = torch.ops.aten
    a, b = torch.empty(8, 64), torch.empty(64, 1024)
    assert workspace(aten.mm.default, (a, b)) == mkl_panel_bytes(64, 1024)
    assert workspace(aten.addmm.default, (torch.empty(1024), a, b)) == mkl_panel_bytes(64, 1024)
    assert workspace(aten.bmm.default, (a[None], b[None])) == mkl_panel_bytes(64, 1024)
    assert workspace(aten.mm.default, (a.bfloat16(), b.bfloat16())) == 0  # oneDNN, no such buffer
    assert workspace(aten.add.Tensor, (a, a)) == 0
    cuda = DeviceModel("cuda", threads=2)
    assert cuda.overhead(1000) == 0 and cuda.workspace() is None and cuda.extra(panel, 1000) == {}


def test_the_graph_count_keeps_the_largest_autograd_graph_it_was_shown():
    import torch

    count = GraphCount()
    weight = torch.ones(3, requires_grad=True)
    assert count.counted(torch.ones(3).sum()) is not None and count.nodes == 0  # no gradient, no graph
    loss = (weight * 2).exp().sum()  # AccumulateGrad, Mul, Exp, Sum
    assert count.counted(loss) is loss and count.nodes == 4
    count.counted(weight.sum())  # a smaller graph leaves the largest
    assert count.nodes == 4
    shared, once = weight * 2, GraphCount()
    once.counted((shared + shared).sum())  # a node reached twice counts once: AccumulateGrad, Mul, Add, Sum
    assert once.nodes == 4
