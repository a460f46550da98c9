"""gaplan: find the largest micro-batch that fits, plan gradient accumulation, train with the exact loss."""

import sys
import types

from gaplan.errors import DoesNotFit, GaplanError
from gaplan.plan import Plan, make_plan, split_evenly
from gaplan.search import SearchResult, find_edge, trial_bound

# Torch-dependent parts load on first use, so `gaplan --help` and the pure parts stay fast.
_LAZY = {
    "CustomWorkload": "gaplan.workload",
    "Workload": "gaplan.workload",
    "WorkloadSpec": "gaplan.workload",
    "build_workload": "gaplan.workload",
    "ProbeResult": "gaplan.probe",
    "Trial": "gaplan.probe",
    "probe": "gaplan.probe",
    "load_probe": "gaplan.probe",
    "save_probe": "gaplan.probe",
    "check_in_fresh_process": "gaplan.probe",
    "count_targets": "gaplan.loss",
    "accumulate_gradients": "gaplan.step",
    "train": "gaplan.train",
    "TrainConfig": "gaplan.train",
    "bench": "gaplan.bench",
    "BenchResult": "gaplan.bench",
    "SplitMeasurement": "gaplan.bench",
    "tune": "gaplan.tuner",
    "TunerDecision": "gaplan.tuner",
    "measure_breakdown": "gaplan.breakdown",
    "MemoryBreakdown": "gaplan.breakdown",
    "write_report": "gaplan.report",
    "load_run": "gaplan.report",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gaplan' has no attribute {name!r}")


class _Package(types.ModuleType):
    """Keeps ``gaplan.probe``, ``gaplan.train`` and ``gaplan.bench`` the functions.

    Importing a submodule sets it as an attribute of its package, so once ``gaplan.probe``
    (the module) was imported, ``gaplan.probe(...)`` and ``from gaplan import probe`` would
    give the module instead. The modules stay reachable by their full names:
    ``from gaplan.probe import ProbeResult`` or ``importlib.import_module("gaplan.probe")``.
    """

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, types.ModuleType) and _LAZY.get(name) == f"{__name__}.{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__version__ = "0.1.0"

__all__ = [
    *_LAZY,
    "DoesNotFit",
    "GaplanError",
    "Plan",
    "SearchResult",
    "__version__",
    "find_edge",
    "make_plan",
    "split_evenly",
    "trial_bound",
]
