"""The largest micro-batch for a GPU you don't have, traced on fake tensors: nothing is allocated.

Run ``gaplan estimate --target h100-80gb --model DIR --seq-len 2048 --dtype bf16``, or from Python
``estimate(WorkloadSpec(model=DIR, seq_len=2048, dtype="bf16"), target="h100-80gb")``.

How it works, one module per idea:

1. :mod:`~gaplan.estimate.fake`: the workload is built on the meta device, then its parameters and
   buffers become fake CPU tensors (shape, dtype and strides, no storage).
2. :mod:`~gaplan.estimate.trace`: one steady-state step is counted by torch's ``MemTracker``, the
   micro-steps apart from the optimizer step (which does not grow with the micro-batch).
3. :mod:`~gaplan.estimate.edge`: the micro-steps are traced at two sizes; the line through them
   predicts the largest micro-batch ``B*`` that fits; the whole step is then traced at ``B*`` and
   ``B* + 1`` (and the prediction corrected until the edge is exact).
4. :mod:`~gaplan.estimate.device`: what the device adds that the CPU trace does not show (CUDA's
   allocator blocks, foreach optimizer, autocast, context and workspaces; a CPU process's heap and
   MKL buffers).
5. :mod:`~gaplan.estimate.budget` and :mod:`~gaplan.estimate.targets`: what the peak is compared
   with (a GPU's usable memory, a memory limit, the CPU budget).
6. :mod:`~gaplan.estimate.assumptions`: every assumption above, as records the result carries.
7. :mod:`~gaplan.estimate.sharded`: one rank of a W-way FSDP2 step (``--parallel fsdp --world-size W``),
   traced with torch's ``FSDPMemTracker`` on a fake process group.

:mod:`~gaplan.estimate.torch_private` guards the torch internals the trace reads or patches.
"""

from gaplan.core.lazy import lazy_exports

_EXPORTS = {
    "Assumption": ".assumptions",
    "EstimateResult": ".result",
    "Target": ".targets",
    "TracedRow": ".result",
    "estimate": ".estimator",
    "list_targets": ".targets",
    "lookup_target": ".targets",
    "predicted_peak": ".estimator",
    "trace_steps": ".estimator",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
