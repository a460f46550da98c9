"""gaplan: find the largest micro-batch that fits, plan gradient accumulation, train with the exact loss.

``gaplan.probe``, ``gaplan.train`` and ``gaplan.bench`` are the functions; their modules are
``gaplan.probing``, ``gaplan.training`` and ``gaplan.benchmark``.
"""

import os as _os
import sys as _sys

from gaplan.devices.cpu import MKL_ALLOCATOR_ENV as _MKL_ALLOCATOR_ENV

if "torch" not in _sys.modules:
    # Before torch loads MKL: its pooled GEMM workspace makes a CPU edge differ from process to process (see
    # gaplan.devices.cpu). The probe's worker and `gaplan` commands run this way; a process that imported torch
    # first keeps the pool, bounded by gaplan.gemm_workspace's release each micro-step.
    for _name, _value in _MKL_ALLOCATOR_ENV.items():
        _os.environ.setdefault(_name, _value)

from gaplan.errors import DoesNotFit, GaplanError  # noqa: E402
from gaplan.plan import Plan, make_plan, split_evenly
from gaplan.search import SearchResult, find_edge, trial_bound
from gaplan.trial import Trial

# Torch-dependent parts load on first use, so `gaplan --help` and the pure parts stay fast.
_LAZY = {
    "CustomWorkload": "gaplan.workload",
    "Workload": "gaplan.workload",
    "WorkloadSpec": "gaplan.workload_spec",
    "build_workload": "gaplan.workload",
    "ProbeResult": "gaplan.probe_result",
    "load_probe": "gaplan.probe_result",
    "save_probe": "gaplan.probe_result",
    "probe": "gaplan.probing",
    "check_in_fresh_process": "gaplan.probing",
    "count_targets": "gaplan.loss",
    "accumulate_gradients": "gaplan.step",
    "train": "gaplan.training",
    "TrainConfig": "gaplan.training",
    "bench": "gaplan.benchmark",
    "BenchResult": "gaplan.benchmark",
    "SplitMeasurement": "gaplan.benchmark",
    "tune": "gaplan.tuner",
    "TunerDecision": "gaplan.tuner",
    "measure_breakdown": "gaplan.breakdown",
    "MemoryBreakdown": "gaplan.breakdown",
    "run_probe": "gaplan.workflows",
    "run_train": "gaplan.train_workflow",
    "run_bench": "gaplan.workflows",
    "TrainOptions": "gaplan.train_workflow",
    "write_report": "gaplan.report",
    "load_run": "gaplan.report",
    "run_token_probe": "gaplan.token_workflow",
    "run_token_bench": "gaplan.token_bench",
    "compare_layouts": "gaplan.layout_search",
    "measure_layouts": "gaplan.layout_measure",
    "build_sharded_workload": "gaplan.sharded_build",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gaplan' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    *_LAZY,
    "DoesNotFit",
    "GaplanError",
    "Plan",
    "SearchResult",
    "Trial",
    "__version__",
    "find_edge",
    "make_plan",
    "split_evenly",
    "trial_bound",
]
