"""The commands' results as the lines a person reads: a probe, a bench, an estimate, a training run, the known GPUs.
The CLI prints them; a Python caller gets the same text (``"\\n".join(probe_lines(result))``). No torch."""

from __future__ import annotations

from typing import Any

from gaplan.core.lines import THROUGHPUT_HEADER, histogram_lines, throughput_line, token_bench_lines, trial_line
from gaplan.core.units import format_bytes
from gaplan.plan.split import Plan
from gaplan.workload.spec import lengths_text


def probe_lines(result: Any, trials_shown_live: bool) -> list[str]:
    """A probe: workload, budget, the trials (unless already shown live), the edge, the plan."""
    spec = result.workload
    ranks = getattr(result, "trial_ranks", 1)
    per_rank = " per rank" if ranks > 1 else ""
    lines = [f"model      {spec.model}  ({result.task}, {result.param_count / 1e6:.1f}M parameters, "
             f"{lengths_text(result.task, result.seq_len, spec.target_len)}, {spec.dtype}, {spec.optimizer})",
             _device_line(result, per_rank)]
    if ranks > 1:
        lines.append(f"layout     FSDP2 over {ranks} ranks: every trial runs all {ranks} ranks; a size fits only if it "
                     "fits on every rank, and the peak is the largest rank's")
    if result.margin:
        lines.append(f"margin     {result.margin:.0%} kept free: trials ran under {format_bytes(result.probe_limit_bytes)}")
    lines.append(f"static     {format_bytes(result.static_bytes)}{per_rank} for weights, gradients and optimizer states")
    if not trials_shown_live:
        lines += [""] + [trial_line(trial) for trial in result.trials]
    edge = f"{result.max_micro_batch}" + (" (the search cap; more may fit)" if result.capped else "")
    each = f"{ranks} fresh processes" if ranks > 1 else "a fresh process"
    return lines + ["", f"largest micro-batch that fits: {edge}   [{len(result.trials)} trials, each {each}, "
                        f"{result.wall_seconds:.1f} s]", f"plan: {result.plan.describe()}"]


def token_probe_lines(run: Any, profile_shown_live: bool) -> list[str]:
    """A probe by tokens: the data's lengths and both probes (unless shown live), the budget T*, the samples plan."""
    lines = []
    if not profile_shown_live:
        lines += [f"lengths    {run.profile.describe()}", *histogram_lines(run.profile.histogram)]
        for name, probed in (("longest", run.long_probe), ("shortest", run.short_probe)):
            if probed is not None:
                lines += ["", f"B* at the {name} length, {probed.workload.seq_len} tokens: {probed.max_micro_batch}"
                              f"{' (the search cap; more may fit)' if probed.capped else ''}   "
                              f"[{len(probed.trials)} trials]", *map(trial_line, probed.trials)]
        lines.append("")
    return lines + [_device_line(run.long_probe), run.budget.describe(),
                    f"samples plan at the longest length: {run.long_probe.plan.describe()}"]


def _device_line(probed: Any, per_rank: str = "") -> str:
    """A probe's device and budget (and that the budget is the CPU's default, when it is)."""
    note = " (default CPU budget; set --memory-limit to change it)" if probed.budget_is_default else ""
    return f"device     {probed.device}, budget {format_bytes(probed.memory_limit_bytes)}{per_rank}{note}"


def bench_lines(measured: Any) -> list[str]:
    """A bench's rows (rates and ratios with 95% intervals), its verdict, how its rounds ended, the machine."""
    lines = [THROUGHPUT_HEADER, *map(throughput_line, measured.rows)]
    if measured.verdict:
        lines.append(f"verdict: {measured.verdict}")
    lines += [f"rounds: {measured.rounds} in {measured.wall_seconds / 60:.1f} min (stopped: {measured.stopped_because})",
              f"machine: {measured.contention}"]
    fastest = measured.fastest_text()
    return lines + ([fastest] if fastest else [])


def token_bench_result_lines(result: Any, profile_shown_live: bool) -> list[str]:
    """A bench by tokens: the data's lengths (unless shown live), T*, the two plans' rows and their ratio."""
    probe = result.probe
    lines = [] if profile_shown_live else [f"lengths    {probe.profile.describe()}",
                                           *histogram_lines(probe.profile.histogram)]
    lines += [probe.budget.describe(), f"samples plan: B* = {probe.long_probe.max_micro_batch} at the longest length "
                                       f"({probe.profile.longest} tokens)\n", *token_bench_lines(result.rows)]
    if result.ratio is not None:
        lines.append(f"\nreal tokens/s, token plan / samples plan: {result.ratio:.2f}x")
    return lines


def train_lines(summary: dict[str, Any], run_dir: str, bounded: bool) -> list[str]:
    """A training run: steps, loss, rates, peak (``bounded``: under a budget), and what it measured besides."""
    if not summary["steps"] and summary.get("steps_done"):  # a resumed run that had done its steps
        done = summary["steps_done"]
        return [f"nothing to train: the run in {run_dir} has done its {done} step{'s' if done != 1 else ''} (--steps "
                f"above {done} extends it)",
                *export_lines(summary)]
    if not summary["steps"] and summary.get("interrupted"):
        return [f"interrupted before its first step ended: nothing trained in {run_dir}"]
    padded, peak = summary.get("padded_tokens_per_s"), summary.get("peak_bytes")
    peak_text = "" if peak is None else f", peak (step) {format_bytes(peak)}" + ("" if bounded else " with no budget bound")
    steps = f"{summary['steps']} step{'s' if summary['steps'] != 1 else ''}"
    lines = [f"trained {steps} in {summary['seconds']:.1f} s: loss {summary['loss_first']:.4f} -> "
             f"{summary['loss_last']:.4f}, {summary['samples_per_s']:.1f} samples/s"
             # a workload without an attention mask (images, a module:function model) counts no tokens
             + (f", {summary['tokens_per_s']:.0f} real tokens/s" if summary['tokens_per_s'] or padded else "")
             + (f" ({padded:.0f} padded tokens/s)" if padded else "") + peak_text
             + f"; log and checkpoint in {run_dir}"]
    if summary.get("loss_check"):
        from gaplan.training.loss_check import LossCheck

        lines.append(LossCheck.from_dict(summary["loss_check"]).describe())
    if len(summary.get("effective_batches") or []) > 1:
        lines.append("effective batch: " + ", ".join(f"{run['effective_batch']} from step {run['from_step']}"
                                                     for run in summary["effective_batches"]))
    if summary.get("noise_scale"):
        lines.append(f"noise scale: {summary['noise_scale']['summary']}")
    lines += export_lines(summary)
    if summary.get("interrupted"):  # the run is not done: say so, and how it goes on
        at = f" at step {summary['last_step']} of {summary['steps_total']}" if summary.get("last_step") else ""
        lines.append(f"interrupted{at}: checkpointed; gaplan train --resume {run_dir} goes on")
    return lines


def export_lines(summary: dict[str, Any]) -> list[str]:
    """What a run wrote besides its folder: the weights, the model, the bench's verdict."""
    return ([f"weights written to {summary['weights']}"] if summary.get("weights") else []) + \
        ([f"model written to {summary['model_dir']}"
          + (" (no tokenizer in it)" if summary.get("tokenizer_saved") is False else "")] if summary.get("model_dir") else []) + \
        ([f"throughput: {summary['verdict']}"] if summary.get("verdict") else [])


def target_lines(targets: list[Any]) -> list[str]:
    """The known GPUs: memory, the reserve the estimate keeps, what is usable."""
    return [f"{'target':<12} {'memory':>10} {'reserve':>10} {'usable':>10}  description",
            *(f"{t.name:<12} {format_bytes(t.total_bytes):>10} {format_bytes(t.reserve_bytes):>10} "
              f"{format_bytes(t.usable_bytes):>10}  {t.description}" for t in targets)]


def estimate_lines(result: Any) -> list[str]:
    """An estimate: traced peaks by category, the memory line, the edge, the plan, the assumptions, the launch."""
    spec = result.workload
    where = result.target or ("a CPU process" if result.device_kind == "cpu" else "the given limit")
    sharded = spec.get("parallel") == "fsdp"
    per_rank = " per rank" if result.world_size > 1 else ""
    lines = [f"model      {spec['model']}  ({result.task}, {result.param_count / 1e6:.1f}M parameters, "
             f"{lengths_text(result.task, result.seq_len, spec.get('target_len'))}, {spec['dtype']}, "
             f"{spec['optimizer']})",
             f"device     {where}: {format_bytes(result.memory_limit_bytes)}, usable "
             f"{format_bytes(result.usable_bytes)}{per_rank}"]
    if result.world_size > 1:
        lines.append(f"ranks      {ranks_line(result)}")
    static = "sharded weights, gradients and optimizer states" if sharded else "weights, gradients and optimizer states"
    offload = " (in host memory: --cpu-offload)" if sharded and spec.get("cpu_offload") and result.device_kind == "cuda" else ""
    lines += [f"static     {format_bytes(result.static_bytes)} for {static}{per_rank}{offload}", ""]
    lines += _sharded_rows(result.rows) if sharded else _rows(result.rows)
    intercept, slope = result.line
    edge = f"{result.max_micro_batch}" + (" (the cap; more may fit)" if result.capped else "")
    lines += ["", f"memory line: {format_bytes(int(intercept))} + {format_bytes(int(slope))} per sample{per_rank}",
              f"largest micro-batch predicted to fit: {edge}   [{result.trace_count} traces, "
              f"{result.trace_seconds:.1f} s, peak {format_bytes(result.peak_bytes)}{per_rank}]",
              f"plan: {Plan.from_dict(result.plan).describe()}"]
    if result.plan_peak_bytes and result.plan_peak_bytes != result.peak_bytes:
        lines.append(f"plan's peak: {format_bytes(result.plan_peak_bytes)}{per_rank}{plan_peak_note(result)}")
    if result.launch_command:
        lines.append(f"launch: {result.launch_command}")
    if result.trust is not None:
        lines.append(f"trust: {result.trust.describe()}")
    return lines + ["assumptions:", *(f"  - {assumption.text}" for assumption in result.assumptions)]


def plan_peak_note(result: Any) -> str:
    """Why the plan's peak is not B*'s: a plan of one micro-step holds nothing from an earlier one."""
    if any(not getattr(r, "accumulated", True) for r in result.rows) and result.plan.get("grad_accum_steps") == 1:
        return " (one micro-step, no accumulation: no unsharded gradients held from an earlier one)"
    return ""


def phase_label(row: Any) -> str:
    """The row's phase; a step of one micro-step (no accumulation, traced alone) is told apart."""
    if getattr(row, "accumulated", True):
        return row.phase
    return "micro-step" if row.phase == "micro-steps" else "step, no accum"


def ranks_line(result: Any) -> str:
    """``8 (1 node x 8), FSDP2 ...``: how the ranks are laid out and what each holds."""
    spec = result.workload
    nodes = getattr(result, "nodes", 1) or 1
    layout = f"{result.world_size} ({nodes} node{'s' if nodes > 1 else ''} x {result.world_size // nodes})"
    if spec.get("parallel") != "fsdp":
        return f"{layout}, DistributedDataParallel: every rank holds the whole model; figures are per rank"
    sync = "every micro-step" if spec.get("grad_sync") == "every" else "the last micro-step"
    extra = result.extra or {}
    depth = ""
    if len(extra.get("traced_depths") or []) > 1:
        depth = f"; {extra['blocks']} blocks traced at depths {'+'.join(map(str, extra['traced_depths']))}, extrapolated"
    offload = ", CPU offload" if spec.get("cpu_offload") else ""
    return (f"{layout}, FSDP2 (fully_shard per block and root{offload}), gradients reduce-scattered on {sync}; "
            f"one rank traced, figures are per rank{depth}")


def _rows(rows: Any) -> list[str]:
    """Each traced row by category: parameters, gradients, optimizer states, activations, the rest, the peak."""
    header = (f"  {'micro-batch':>11} {'phase':>15} {'params':>10} {'grads':>10} {'optimizer':>10} {'activations':>11} "
              f"{'other':>10} {'peak':>10}")
    return [header, *(f"  {row.micro_batch:>11} {row.phase:>15} {format_bytes(row.parameters):>10} "
                      f"{format_bytes(row.gradients):>10} {format_bytes(row.optimizer_states):>10} "
                      f"{format_bytes(row.activations):>11} {format_bytes(row.other):>10} "
                      f"{format_bytes(row.peak_bytes):>10}" for row in rows)]


_SHARDED_COLUMNS = (("sh.params", "sharded_parameters"), ("gathered", "unsharded_parameters"),
                    ("sh.grads", "sharded_gradients"), ("full grads", "unsharded_gradients"),
                    ("optimizer", "optimizer_states"), ("activations", "activations"), ("temps", "temporaries"),
                    ("all-gather", "all_gather"), ("red-scat", "reduce_scatter"))


def _sharded_rows(rows: Any) -> list[str]:
    """FSDP's categories: sharded and gathered parameters, sharded and full gradients, the collectives' buffers."""
    lines = [f"  {'micro-batch':>11} {'phase':>14} " + " ".join(f"{title:>10}" for title, _ in _SHARDED_COLUMNS)
             + f" {'segments':>10} {'peak':>10}"]
    for row in rows:  # segments: what the allocator's segments hold beyond the live blocks (on cuda)
        detail = row.detail or {}
        values = [detail.get(key, 0) + (detail.get("inputs", 0) if key == "activations" else 0)
                  for _, key in _SHARDED_COLUMNS] + [row.unfilled_segment_bytes]
        lines.append(f"  {row.micro_batch:>11} {phase_label(row):>14} " + " ".join(f"{format_bytes(v):>10}" for v in values)
                     + f" {format_bytes(row.peak_bytes):>10}")
    return lines


def plan_lines(comparison: Any, levers: Any, launch_command: str | None, out: str) -> list[str]:
    """``gaplan plan``: the layouts' table, the pick and its trade-offs, the lever table (one device), the launch."""
    from gaplan.report import layout_report as layouts  # pandas and matplotlib: a plan's alone

    lines = [layouts.header_line(comparison), "", layouts.table_text(layouts.layouts_frame(comparison)),
             *layouts.not_estimated_lines(comparison)]
    if any(r.extra.get("capped") for r in comparison.results):
        lines.append("(cap): B* reached one rank's share of the effective batch; a larger micro-batch may fit but is "
                     "never used")
    lines += ["", layouts.pick_line(comparison), *layouts.caveat_lines(comparison), *layouts.tradeoff_lines(comparison)]
    if levers is not None:
        from gaplan.report import lever_report

        lines += ["", lever_report.header_line(levers), "", lever_report.table_text(levers),
                  *lever_report.not_compared_lines(levers), lever_report.cost_line(levers), "",
                  *lever_report.pick_lines(levers)]
    if launch_command:
        lines.append(f"launch: {launch_command}")
    return lines + [f"report: {out}/report.md (and report.html, layouts.png, layouts.csv, layouts.json"
                    + (", levers.md, levers.csv, levers.json)" if levers is not None else ")")]


def layout_line(result: Any) -> str:
    """One layout estimated: its B* and peak per rank, or that it does not fit."""
    what = _layout_label(result)
    if result.fits is None:
        return f"{what}: not estimated"
    if not result.fits:
        return f"{what}: does not fit"
    return f"{what}: B* {result.max_micro_batch}, peak {format_bytes(result.peak_bytes or 0)} per rank at micro-batch " \
           f"{result.micro_batch}"


def measured_layout_line(result: Any, split: str) -> str:
    """One layout probed and timed: its measured B* against the estimate's, and its rate at ``split``."""
    what = _layout_label(result)
    if not result.samples_per_s:
        return f"{what}: {result.note}"
    return (f"{what}: B* {result.max_micro_batch} (estimated {result.extra.get('estimated_max_micro_batch')}), {split}: "
            f"{result.samples_per_s:.1f} samples/s")


def _layout_label(result: Any) -> str:
    return f"  {result.layout.label}, {result.precision_label}"


def lever_line(result: Any) -> str:
    """One lever row, estimated or measured."""
    if not result.fits:
        return f"  {result.label}: {result.note or 'does not fit'}"
    rate = f", {result.samples_per_s:.1f} samples/s" if result.samples_per_s else ""
    return f"  {result.label}: B* {result.max_micro_batch}, {result.grad_accum_steps} step(s){rate}"
