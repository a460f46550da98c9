"""``--compile`` in the trace: the fake model compiled as inductor partitions a training step, its graphs run op by
op under the trace, so what a compiled step keeps for backward is what is counted.

Inductor's partitioner (AOTAutograd's min-cut, after inductor's own joint-graph passes, on inductor's decompositions)
decides what the forward saves; inductor then fuses the graphs' ops into kernels, which changes only what lives
inside one graph's run. Running the partitioned graphs eagerly (``boxed_nop``: each graph's inputs are freed as it
runs, as inductor's are) counts the saved tensors exactly and the intermediates inside a graph as eager ops hold
them: on the CPU against a real inductor step the saved bytes and the step's peak agreed within 0.03 MiB where the
peak lies outside a compiled graph, and a peak inside one reads high (docs/levers.md, "torch.compile").

Two things make it run under the trace: dynamo skips a frame while a dispatch mode is on the stack unless the mode
says it may be left out while compiling (``ignore_compile_internals``; the trace's modes do, with ``compiled``),
and every ``MemTracker`` registers new global module hooks, on whose keys dynamo guards (each trace would compile
again): :func:`one_pair_of_module_hooks` registers one pair for all of them. The ``cuda`` device model's modes (each
SDPA call's CUDA kernel, CUDA autocast's float32 ops, the fused dropout) are traced into the graphs as dynamo meets
them. In one process (LoRA and QLoRA included); over several ranks or with activation offloading the estimate traces
the eager model and says so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from gaplan.estimate.torch_private import private, private_attr

# The estimate's ``compile`` assumption (gaplan.estimate.assumptions.compiled_model): traced, or the eager model.
TRACED_TEXT = ("Compile: the model is compiled for the trace as inductor partitions a training step and its graphs run "
               "op by op, so what the compiled step keeps for backward is counted; inside one graph its intermediates "
               "live as eager ops hold them, where inductor fuses some away: a peak inside a compiled graph can read "
               "high. The compiler's own memory (dynamo's and inductor's, in the process: a CPU trial's resident peak "
               "holds it) is not counted. Checked against real inductor steps on the CPU; on CUDA not yet on a GPU. gaplan probe "
               "--compile measures the compiled step.")
EAGER_TEXT = ("Compile: the trace runs the eager model; torch.compile's fused kernels can save fewer (or other) tensors "
              "for backward, and this estimate does not model that over several ranks or with activation offloading "
              "(save_on_cpu's hooks do not trace under dynamo here; one process without it is modelled): gaplan probe "
              "--compile measures the compiled step.")


def trace_backend(compiled: list[Any]) -> Any:
    """A ``torch.compile`` backend that partitions as inductor does and runs the graphs eagerly; each forward graph
    it compiles is appended to ``compiled`` (none after a trace: dynamo did not compile, and the trace was eager)."""
    aot_autograd = private("torch._dynamo.backends.common", "aot_autograd")
    boxed_nop = private("torch._dynamo.backends.debugging", "boxed_nop")
    partition_fn = private("torch._inductor.compile_fx", "partition_fn")
    decompositions = private("torch._inductor.decomposition", "select_decomp_table")()

    detect_fake_mode = private("torch._guards", "detect_fake_mode")
    virtualized = private("torch._inductor.virtualized", "V")

    def forward(graph, example_inputs):
        compiled.append(graph)
        return boxed_nop(graph, example_inputs)

    def partition(graph, joint_inputs, **kwargs):
        # Under the fake mode of the graph's inputs, as inductor's own compile partitions: its joint-graph passes make
        # tensors there (the seeds of a dropout's random numbers, as in LoRA's adapters).
        with virtualized.set_fake_mode(detect_fake_mode(joint_inputs)):
            return partition_fn(graph, joint_inputs, **kwargs)

    return aot_autograd(fw_compiler=forward, bw_compiler=boxed_nop, partition_fn=partition,
                        decompositions=decompositions, keep_inference_input_mutations=True)


def compile_for_trace(model: Any, compiled: list[Any]) -> None:
    """Compile ``model`` in place for the trace, as ``gaplan.workload.compile`` compiles it for a run
    (``dynamic=True``: one graph for the micro-batches traced, micro-batch 1 apart); ``compiled``: as
    :func:`trace_backend`'s."""
    model.compile(backend=trace_backend(compiled), dynamic=True)


def dynamo_error() -> type[BaseException]:
    """What dynamo raises when it cannot compile a model (caught by the trace: one line, not a traceback)."""
    return private("torch._dynamo.exc", "TorchDynamoException")


def raised_in_compiler(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside torch's compiler (dynamo, AOTAutograd, inductor), not by the model."""
    import traceback

    return any(part in frame.filename for frame in traceback.extract_tb(exc.__traceback__)
               for part in ("/torch/_dynamo/", "/torch/_functorch/", "/torch/_inductor/"))


@contextlib.contextmanager
def one_pair_of_module_hooks() -> Iterator[None]:
    """Every ``ModTracker`` (each ``MemTracker`` has one) forwards to one pair of global module hooks registered here,
    not its own: dynamo guards on the global hooks' keys, so new ones at each trace would compile the model again.
    The hooks do nothing while dynamo compiles (a module inlined into a graph reports no forward) or for a graph's own
    module. Trackers nest (the last one entered gets the calls), as the trace's do."""
    import torch
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    tracker_class = private("torch.distributed._tools.mod_tracker", "ModTracker")
    enter, exit_ = private_attr(tracker_class, "__enter__"), private_attr(tracker_class, "__exit__")
    for name in ("_fw_pre_hook", "_fw_post_hook"):
        private_attr(tracker_class, name)
    active: list[Any] = []

    def forwarded(name: str):
        def hook(module, *args):
            if torch.compiler.is_compiling() or not active or isinstance(module, torch.fx.GraphModule):
                return None
            return getattr(active[-1], name)(module, *args)

        return hook

    def entered(self):
        active.append(self)
        return self

    def exited(self, *exc):
        active.remove(self)

    pre = register_module_forward_pre_hook(forwarded("_fw_pre_hook"))
    post = register_module_forward_hook(forwarded("_fw_post_hook"), always_call=True)
    tracker_class.__enter__, tracker_class.__exit__ = entered, exited
    try:
        yield
    finally:
        tracker_class.__enter__, tracker_class.__exit__ = enter, exit_
        pre.remove()
        post.remove()
