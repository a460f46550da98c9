"""--compile in the trace (gaplan.estimate.compiled): on the cpu device model the fake model is compiled as inductor
partitions the step; (heavy) what it counts is what a real inductor step on the CPU keeps and peaks at."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gaplan.estimate.assumptions import compiled_model
from gaplan.estimate.trace import Tracer
from gaplan.workload.spec import WorkloadSpec

MiB = 2**20


def test_only_one_process_traces_the_compiled_step_and_the_assumption_says_which():
    spec = WorkloadSpec(model="tiny-llama", compile=True)
    assert Tracer(spec, "cpu").compiled and Tracer(spec, "cuda").compiled
    assert not Tracer(spec, "cpu", world_size=2).compiled and not Tracer(spec, "cuda", world_size=8).compiled
    assert not Tracer(WorkloadSpec(model="tiny-llama"), "cpu").compiled
    assert Tracer(WorkloadSpec(model="tiny-llama", compile=True, lora=True), "cpu").compiled
    assert "is counted" in compiled_model(True).text and "on CUDA not yet on a GPU" in compiled_model(True).text
    assert "does not model that over several ranks" in compiled_model(False).text


def test_every_tracker_forwards_to_one_pair_of_module_hooks_and_the_trackers_own_come_back():
    """dynamo guards on the global module hooks' keys: a tracker that registered its own at each trace would compile
    the model again at each trace."""
    from torch.distributed._tools.mod_tracker import ModTracker
    from torch.nn.modules import module

    from gaplan.estimate.compiled import one_pair_of_module_hooks

    enter, exit_ = ModTracker.__enter__, ModTracker.__exit__
    before = (len(module._global_forward_pre_hooks), len(module._global_forward_hooks))
    with one_pair_of_module_hooks():
        keys = (tuple(module._global_forward_pre_hooks), tuple(module._global_forward_hooks))
        for _ in range(2):
            tracker, layer = ModTracker(), torch.nn.Linear(2, 2)
            with tracker:
                assert (tuple(module._global_forward_pre_hooks), tuple(module._global_forward_hooks)) == keys
                layer(torch.ones(1, 2))
            assert tracker.get_known_fqn(layer) is not None  # its forward reached this tracker's own hook
            layer(torch.ones(1, 2))  # outside any tracker: the pair does nothing
    assert (ModTracker.__enter__, ModTracker.__exit__) == (enter, exit_)
    assert (len(module._global_forward_pre_hooks), len(module._global_forward_hooks)) == before


def test_a_graph_with_random_numbers_is_partitioned_as_inductor_does():
    """LoRA's dropout: inductor's joint-graph passes make the random numbers' seeds in the fake mode of the graph's
    inputs, which the trace's backend sets as inductor's own compile does (dynamo stopped there before)."""
    from gaplan.estimate.compiled import trace_backend

    class Adapter(torch.nn.Module):  # a module of torch.nn itself (Sequential) dynamo would leave uncompiled
        def __init__(self) -> None:
            super().__init__()
            self.linear, self.dropout = torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)

        def forward(self, x):
            return self.dropout(self.linear(x)).relu()

    compiled: list = []
    model = Adapter()
    model.compile(backend=trace_backend(compiled))
    model(torch.ones(2, 4)).sum().backward()
    assert len(compiled) == 1 and model.linear.weight.grad is not None
    assert "inductor_seeds" in str(compiled[0].graph)  # the seeds made by inductor's pass, in the graph


def test_the_cuda_attention_model_compiles_into_one_graph_and_records_each_calls_kernel():
    """The CUDA device model's SDPA mode, met by dynamo inside the compiled model: no graph break (a recorded call is
    a tuple dynamo can rebuild after the graph), the fused kernel traced as the CPU's flash kernel, a call no fused
    CUDA kernel takes (fp32 with grouped-query heads) through math."""
    import torch.nn.functional as F

    from gaplan.estimate.attention import AttentionCall, CudaAttention
    from gaplan.estimate.compiled import trace_backend

    class Attend(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(32, 32)

        def forward(self, x):
            q = self.proj(x).view(2, 4, 16, 8)
            fused = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            grouped = F.scaled_dot_product_attention(q, q[:, :2], q[:, :2], is_causal=True, enable_gqa=True)
            return (fused + grouped).sum()

    compiled: list = []
    calls: set = set()
    model = Attend()
    model.compile(backend=trace_backend(compiled))
    with CudaAttention(calls):
        model(torch.ones(2, 16, 32)).backward()
    assert len(compiled) == 1 and model.proj.weight.grad is not None
    assert calls == {AttentionCall(8, "torch.float32", False, False, "efficient"),
                     AttentionCall(8, "torch.float32", False, True, "math")}
    graph = str(compiled[0].graph)
    assert "_scaled_dot_product_flash_attention_for_cpu" in graph and "aten.amax" in graph  # math's softmax, decomposed


def test_a_model_dynamo_cannot_compile_under_the_trace_is_one_line():
    from torch._dynamo.exc import TorchDynamoException

    from gaplan.core.errors import GaplanError
    from gaplan.estimate.trace import compile_errors

    with pytest.raises(GaplanError, match=r"^--compile could not be traced \(stopped in peft\): estimate without"):
        with compile_errors(True):
            raise TorchDynamoException("stopped in peft\nthe rest of dynamo's message")
    with pytest.raises(TorchDynamoException), compile_errors(False):  # an eager trace has nothing of dynamo's to say
        raise TorchDynamoException("x")


def test_any_error_raised_inside_the_compiler_is_one_line_and_the_models_own_are_not():
    """dynamo asserts on GPT-2's checkpointed blocks, and save_on_cpu's hooks fail in AOTAutograd: plain errors, raised
    in the compiler's frames, are one line too; the same error raised by the model's code stays what it is."""
    from gaplan.core.errors import GaplanError
    from gaplan.estimate.trace import compile_errors

    compiler: dict = {}
    exec(compile("def fail():\n    raise AssertionError('lift_tracked_freevar_to_input')\n",
                 "/site-packages/torch/_dynamo/output_graph.py", "exec"), compiler)
    with pytest.raises(GaplanError, match=r"^--compile could not be traced \(AssertionError: lift_tracked_freevar"):
        with compile_errors(True):
            compiler["fail"]()

    def models_own():
        raise AssertionError("the model's own check")

    with pytest.raises(AssertionError, match="the model's own check"), compile_errors(True):
        models_own()


def test_activation_offloading_traces_the_eager_model_and_says_so():
    spec = WorkloadSpec(model="tiny-llama", compile=True, offload_activations=True)
    assert not Tracer(spec, "cpu").compiled and not Tracer(spec, "cuda").compiled
    assert "with activation offloading" in compiled_model(False).text


def _real_compiled_step(spec: WorkloadSpec, micro_batches: tuple[int, ...],
                        eager_graphs: bool = False) -> dict[int, tuple[float, float]]:
    """A real inductor step on the CPU, as the trace runs one (gradients held): per micro-batch, the bytes saved for
    backward and the CPU allocator's peak over the step's start (torch's profiler), in MiB. ``eager_graphs``: the
    trace's backend instead of inductor, on real tensors (the same partition, its graphs run op by op)."""
    from torch.profiler import ProfilerActivity, profile

    from gaplan.training.step import accumulate_gradients
    from gaplan.workload.build import build_workload

    if eager_graphs:
        from gaplan.estimate.compiled import trace_backend

        workload = build_workload(dataclasses.replace(spec, compile=False), "cpu", seed=0)
        workload.model.compile(backend=trace_backend([]), dynamic=True)
    else:
        workload = build_workload(spec, "cpu", seed=0)
    parameters = {p.untyped_storage().data_ptr() for p in workload.model.parameters()}

    def step(micro_batch: int, pack=lambda tensor: tensor) -> None:
        def raw_loss(model, batch):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                return workload.raw_loss(model, batch)

        accumulate_gradients(workload.model, [workload.make_batch(micro_batch)], raw_loss, workload.task,
                             workload.loss_is_scaled_for_ga, workload.forward_context)

    for p in workload.model.parameters():
        p.grad = torch.zeros_like(p)
    step(micro_batches[0])  # compiles
    measured = {}
    for micro_batch in micro_batches:
        saved: dict[int, int] = {}

        def pack(tensor, saved=saved):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in parameters:
                saved[storage.data_ptr()] = storage.nbytes()
            return tensor

        for p in workload.model.parameters():
            p.grad = torch.zeros_like(p)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
            step(micro_batch, pack)
        events = sorted((e.start_ns(), e.nbytes()) for e in profiler.profiler.kineto_results.events()
                        if e.name() == "[memory]")
        current = peak = 0
        for _, nbytes in events:
            current += nbytes
            peak = max(peak, current)
        measured[micro_batch] = (sum(saved.values()) / MiB, peak / MiB)
    return measured


@pytest.mark.heavy  # about a minute each on 2 cores: a fake compile and a real inductor one
@pytest.mark.slow
@pytest.mark.parametrize(("settings", "sizes", "graphs"), [
    ({}, (4, 8), 1), ({"lora": True}, (4, 8), 1), ({"lora": True, "quantize": "4bit"}, (4, 8), 1),
    ({"dtype": "bf16"}, (4, 8), 1), ({"loss": "chunked"}, (4, 8), 1), ({}, (1, 2), 2)],
    ids=["full", "lora", "qlora", "bf16-autocast", "chunked-loss", "micro-batch-1"])
def test_the_compiled_trace_keeps_and_peaks_as_a_real_inductor_step(settings, sizes, graphs):
    """And one compile for both micro-batches (dynamic shapes; every tracker on one pair of module hooks), but for
    micro-batch 1, which dynamo specializes. With LoRA the adapters' dropout runs in the graph (inductor's partitioner
    makes its random seeds in the graph's fake mode), with QLoRA the base is bitsandbytes' nf4 (its CPU backend)."""
    from gaplan.core.options import OptionError
    from gaplan.workload.compile import check_compiler

    try:
        check_compiler("cpu")
    except OptionError as exc:
        pytest.skip(str(exc))
    if settings.get("quantize"):
        pytest.importorskip("bitsandbytes")
    # A fresh compile cache, as a run's own process has: after the other cases' compiles of the same model code,
    # dynamo would reach its recompile limit and run a real step eagerly.
    torch._dynamo.reset()
    spec = WorkloadSpec(model="tiny-llama", optimizer="sgd", compile=True, **settings)
    traced = {}
    with Tracer(spec, "cpu") as tracer:
        for micro_batch in sizes:
            row = tracer.micro_steps(micro_batch)
            static = row.parameters + row.gradients + row.optimizer_states  # live from the step's start
            traced[micro_batch] = (row.activations / MiB, (row.tracked_total - static) / MiB)
        note = next(a for a in tracer.assumptions() if a.topic == "compile")
        assert note.text == compiled_model(True).text and len(tracer.compiled_graphs) == graphs
    with Tracer(WorkloadSpec(model="tiny-llama", optimizer="sgd", **settings), "cpu") as tracer:
        eager_like = tracer.micro_steps(sizes[0]).activations / MiB
    real = _real_compiled_step(spec, sizes)
    for micro_batch in sizes:
        (saved, peak), (real_saved, real_peak) = traced[micro_batch], real[micro_batch]
        assert saved == pytest.approx(real_saved, abs=0.1), (micro_batch, traced, real)
        assert peak == pytest.approx(real_peak, abs=0.1), (micro_batch, traced, real)
    assert traced[sizes[0]][0] < 0.9 * eager_like  # compile keeps less than eager (inductor's partitioner)


@pytest.mark.heavy  # about a minute on 2 cores: a fake compile, a real one and the trace's backend on real tensors
@pytest.mark.slow
def test_where_the_peak_lies_inside_a_compiled_graph_the_trace_reads_the_graph_run_op_by_op_and_high():
    """tiny-bert-cls peaks inside the backward graph (no vocabulary-sized logits): the trace's peak is that of the same
    partitioned graphs run op by op on real tensors, and above inductor's, whose kernels fuse intermediates away;
    what the step saves for backward is the same tensors either way. (docs/levers.md, "torch.compile")"""
    from gaplan.core.options import OptionError
    from gaplan.workload.compile import check_compiler

    try:
        check_compiler("cpu")
    except OptionError as exc:
        pytest.skip(str(exc))
    torch._dynamo.reset()
    spec = WorkloadSpec(model="tiny-bert-cls", optimizer="sgd", compile=True)
    traced = {}
    with Tracer(spec, "cpu") as tracer:
        for micro_batch in (4, 8):
            row = tracer.micro_steps(micro_batch)
            static = row.parameters + row.gradients + row.optimizer_states
            traced[micro_batch] = (row.activations / MiB, (row.tracked_total - static) / MiB)
    torch._dynamo.reset()
    op_by_op = _real_compiled_step(spec, (4, 8), eager_graphs=True)
    torch._dynamo.reset()
    inductor = _real_compiled_step(spec, (4, 8))
    for micro_batch in (4, 8):
        (at_peak, peak), (saved, eager_peak), (real_saved, real_peak) = (
            traced[micro_batch], op_by_op[micro_batch], inductor[micro_batch])
        assert saved == pytest.approx(real_saved, abs=0.01), (micro_batch, op_by_op, inductor)
        assert peak == pytest.approx(eager_peak, abs=0.1), (micro_batch, traced, op_by_op)
        assert real_peak < 0.95 * peak, (micro_batch, traced, inductor)  # the fused kernels hold less
        assert at_peak < saved  # in backward, some saved tensors are freed before the peak


@pytest.mark.heavy  # about a minute and a half on 2 cores: three traces, two of them compiled
@pytest.mark.slow
def test_the_cuda_device_models_compiled_trace_keeps_what_the_cpu_ones_does_with_flash_attention():
    """bf16 tiny-llama, no mask: every SDPA call takes flash on CUDA, which keeps what the CPU's flash kernel keeps,
    so the two device models' compiled steps save the same bytes for backward (up to the CUDA allocator's 512-byte
    blocks), one graph each (no break at the CUDA modes), and less than the eager CUDA step. (Not a GPU measurement.)"""
    torch._dynamo.reset()
    saved = {}
    for device_kind, compile in (("cpu", True), ("cuda", True), ("cuda", False)):
        spec = WorkloadSpec(model="tiny-llama", dtype="bf16", optimizer="sgd", compile=compile)
        with Tracer(spec, device_kind) as tracer:
            saved[device_kind, compile] = tracer.micro_steps(4).activations
            assert len(tracer.compiled_graphs) == compile
    assert saved["cuda", True] == pytest.approx(saved["cpu", True], abs=64 * 512)
    assert saved["cuda", True] < 0.9 * saved["cuda", False]
