"""gaplan: find the largest micro-batch that fits, plan gradient accumulation, train with the exact loss.

``gaplan.probe``, ``gaplan.train`` and ``gaplan.bench`` are the functions; their modules are
``gaplan.probing.edge``, ``gaplan.training.loop`` and ``gaplan.benchmark.splits``. The stages, from the bottom
of the stack up: ``core``, ``plan``, ``data``, ``workload``, ``runs``, ``devices``, ``parallel``, ``training``,
``worker``, ``estimate``, ``probing``, ``benchmark``, ``report``, ``integrations``, ``workflows``, ``cli``.
"""

import sys as _sys

from gaplan.core.lazy import lazy_exports as _lazy_exports
from gaplan.core.version import __version__
from gaplan.devices.cpu import default_allocator_environment as _default_allocator_environment

if "torch" not in _sys.modules:
    # Before torch loads MKL: its pooled GEMM workspace makes a CPU edge differ from process to process (see
    # gaplan.devices.cpu). The probe's worker and `gaplan` commands run this way (plain training and timing runs
    # take it back: gaplan.devices.cpu.use_native_allocator); a process that imported torch first keeps the pool,
    # bounded by gaplan.devices.mkl's release each micro-step.
    _default_allocator_environment()

# Every name loads on first use, so `gaplan --help` and the pure parts stay fast (and torch-free). These are the
# names a user needs, each in the README's API table (tests/test_package.py keeps the two the same); everything else
# is reachable from its subpackage (gaplan.plan.search.find_edge, gaplan.workflows.plan.compare_layouts, ...).
_EXPORTS = {
    # errors a caller catches
    "GaplanError": "gaplan.core.errors",
    "DoesNotFit": "gaplan.core.errors",
    "OptionError": "gaplan.core.options",
    # what is trained
    "WorkloadSpec": "gaplan.workload.spec",
    "CustomWorkload": "gaplan.workload.function_model",
    "Checkpointing": "gaplan.core.checkpointing",
    "parse_checkpointing": "gaplan.core.checkpointing",
    # the plan
    "Plan": "gaplan.plan.split",
    "make_plan": "gaplan.plan.split",
    # the probe: gaplan's workload, or your own loop
    "probe": "gaplan.probing.edge",
    "ProbeResult": "gaplan.runs.probe_result",
    "probe_loop": "gaplan.probing.loop",
    "LoopProbeResult": "gaplan.probing.loop",
    "cpu_budget": "gaplan.devices.cpu",
    # training at the plan, token-exact
    "train": "gaplan.training.loop",
    "TrainConfig": "gaplan.training.config",
    "accumulate_gradients": "gaplan.training.step",
    "count_targets": "gaplan.workload.loss",
    "PlanBatchSampler": "gaplan.data.plan_sampler",
    "NoiseScaleMeter": "gaplan.training.noise_scale",
    # the plan against a true large batch, and the report
    "bench": "gaplan.benchmark.splits",
    "BenchResult": "gaplan.benchmark.measurement",
    "write_report": "gaplan.report.write",
    # each command as an object, checked once, and what runs it (the CLI is a thin layer over these)
    "ProbeCommand": "gaplan.workflows.probe_options",
    "run_probe_command": "gaplan.workflows.run_commands",
    "TrainCommand": "gaplan.workflows.train_command",
    "prepare_train": "gaplan.workflows.train_command",
    "run_train": "gaplan.workflows.train",
    "BenchCommand": "gaplan.workflows.bench_options",
    "run_bench_command": "gaplan.workflows.run_commands",
    "EstimateCommand": "gaplan.workflows.estimate_options",
    "run_estimate_command": "gaplan.workflows.run_commands",
    "PlanCommand": "gaplan.workflows.plan_options",
    "run_plan_command": "gaplan.workflows.run_commands",
}
__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)

__all__ = [*sorted(_EXPORTS), "__version__"]
