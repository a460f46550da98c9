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

# Every name loads on first use, so `gaplan --help` and the pure parts stay fast (and torch-free).
_EXPORTS = {
    "DoesNotFit": "gaplan.core.errors",
    "GaplanError": "gaplan.core.errors",
    "Checkpointing": "gaplan.core.checkpointing",
    "parse_checkpointing": "gaplan.core.checkpointing",
    "Plan": "gaplan.plan.split",
    "make_even_plan": "gaplan.plan.split",
    "make_plan": "gaplan.plan.split",
    "split_evenly": "gaplan.plan.split",
    "SearchResult": "gaplan.plan.search",
    "find_edge": "gaplan.plan.search",
    "trial_bound": "gaplan.plan.search",
    "Trial": "gaplan.core.trial",
    "CustomWorkload": "gaplan.workload.build",
    "Workload": "gaplan.workload.build",
    "WorkloadSpec": "gaplan.workload.spec",
    "build_workload": "gaplan.workload.build",
    "ProbeResult": "gaplan.runs.probe_result",
    "load_probe": "gaplan.runs.probe_result",
    "save_probe": "gaplan.runs.probe_result",
    "probe": "gaplan.probing.edge",
    "probe_loop": "gaplan.probing.loop",
    "LoopProbeResult": "gaplan.probing.loop",
    "PlanBatchSampler": "gaplan.data.plan_sampler",
    "cpu_budget": "gaplan.devices.cpu",
    "check_in_fresh_process": "gaplan.probing.edge",
    "count_targets": "gaplan.workload.loss",
    "accumulate_gradients": "gaplan.training.step",
    "train": "gaplan.training.loop",
    "TrainConfig": "gaplan.training.config",
    "bench": "gaplan.benchmark.splits",
    "BenchResult": "gaplan.benchmark.measurement",
    "BenchSettings": "gaplan.benchmark.measurement",
    "SplitMeasurement": "gaplan.benchmark.splits",
    "tune": "gaplan.benchmark.tuner",
    "TunerDecision": "gaplan.benchmark.tuner",
    "measure_breakdown": "gaplan.training.breakdown",
    "MemoryBreakdown": "gaplan.training.breakdown",
    "run_probe": "gaplan.workflows.probe",
    "run_train": "gaplan.workflows.train",
    "run_bench": "gaplan.workflows.bench",
    "TrainOptions": "gaplan.workflows.train_options",
    "ProbeOptions": "gaplan.workflows.probe",
    "ProbeCommand": "gaplan.workflows.probe_options",
    "run_probe_command": "gaplan.workflows.probe_options",
    "BenchCommand": "gaplan.workflows.bench_options",
    "run_bench_command": "gaplan.workflows.bench_options",
    "EstimateCommand": "gaplan.workflows.estimate_options",
    "run_estimate_command": "gaplan.workflows.estimate_options",
    "PlanCommand": "gaplan.workflows.plan_options",
    "run_plan_command": "gaplan.workflows.plan_options",
    "TrainCommand": "gaplan.workflows.train_command",
    "prepare_train": "gaplan.workflows.train_command",
    "DataSource": "gaplan.data.source",
    "LoopOptions": "gaplan.training.config",
    "OptionError": "gaplan.core.options",
    "write_report": "gaplan.report.write",
    "load_run": "gaplan.report.write",
    "run_token_probe": "gaplan.workflows.probe_tokens",
    "run_token_bench": "gaplan.workflows.bench_tokens",
    "compare_layouts": "gaplan.workflows.plan",
    "measure_layouts": "gaplan.workflows.plan_measure",
    "compare_levers": "gaplan.workflows.plan_levers",
    "measure_levers": "gaplan.workflows.plan_levers",
    "LeverComparison": "gaplan.plan.lever_pick",
    "build_sharded_workload": "gaplan.parallel.build",
    "NoiseScaleMeter": "gaplan.training.noise_scale",
    "GoodputOptions": "gaplan.workflows.goodput",
    "choose_by_goodput": "gaplan.workflows.goodput",
    "rank_by_goodput": "gaplan.plan.goodput",
    "statistical_efficiency": "gaplan.plan.goodput",
}
__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)

__all__ = [*sorted(_EXPORTS), "__version__"]
