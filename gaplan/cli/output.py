"""What the ``gaplan`` commands print: result tables, progress on stderr, the training bar. No torch."""

from __future__ import annotations

import sys

import click

from gaplan.core.lines import trial_line
from gaplan.core.units import format_bytes
from gaplan.plan.split import Plan
from gaplan.workload.spec import lengths_text


def print_probe(result, trials_shown_live: bool) -> None:
    """The human-readable probe report: workload, budget, the trials (unless already on this terminal), edge, plan."""
    spec = result.workload
    note = " (default CPU budget; set --memory-limit to change it)" if result.budget_is_default else ""
    click.echo(f"model      {spec.model}  ({result.task}, {result.param_count / 1e6:.1f}M parameters, "
               f"{lengths_text(result.task, result.seq_len, spec.target_len)}, {spec.dtype}, {spec.optimizer})")
    ranks = getattr(result, "trial_ranks", 1)
    per_rank = " per rank" if ranks > 1 else ""
    click.echo(f"device     {result.device}, budget {format_bytes(result.memory_limit_bytes)}{per_rank}{note}")
    if ranks > 1:
        click.echo(f"layout     FSDP2 over {ranks} ranks: every trial runs all {ranks} ranks; a size fits only if it fits "
                   "on every rank, and the peak is the largest rank's")
    if result.margin:
        click.echo(f"margin     {result.margin:.0%} kept free: trials ran under {format_bytes(result.probe_limit_bytes)}")
    click.echo(f"static     {format_bytes(result.static_bytes)}{per_rank} for weights, gradients and optimizer states")
    if not trials_shown_live:
        click.echo("")
        for trial in result.trials:
            click.echo(trial_line(trial))
    click.echo("")
    edge = f"{result.max_micro_batch}" + (" (the search cap; more may fit)" if result.capped else "")
    click.echo(f"largest micro-batch that fits: {edge}   "
               f"[{len(result.trials)} trials, each {f'{ranks} fresh processes' if ranks > 1 else 'a fresh process'}, "
               f"{result.wall_seconds:.1f} s]")
    click.echo(f"plan: {result.plan.describe()}")


def same_terminal() -> bool:
    """True when stdout and stderr are one terminal: lines shown live on stderr are not repeated on stdout."""
    return sys.stdout.isatty() and sys.stderr.isatty()


class ProgressBar:
    """A tqdm bar over optimizer steps on stderr, created at the first step (on rank 0 only, where steps report)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.bar = total, enabled, None

    def step(self, log) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, initial=log.step - 1, desc="train", unit="step", file=sys.stderr,
                            dynamic_ncols=True)
        self.bar.set_postfix(loss=f"{log.loss:.4f}", samples_s=f"{log.samples_per_s:.1f}",
                             tokens_s=f"{log.tokens_per_s:.0f}")
        self.bar.update(1)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        elif self.enabled:
            click.echo(text, err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def print_bench(measured) -> None:
    """A bench's rows (rates and ratios with 95% intervals), its verdict, how its rounds ended, the machine."""
    from gaplan.core.lines import THROUGHPUT_HEADER, throughput_line

    click.echo(THROUGHPUT_HEADER)
    for row in measured.rows:
        click.echo(throughput_line(row))
    if measured.verdict:
        click.echo(f"verdict: {measured.verdict}")
    click.echo(f"rounds: {measured.rounds} in {measured.wall_seconds / 60:.1f} min (stopped: {measured.stopped_because})")
    click.echo(f"machine: {measured.contention}")
    best = measured.best_fitting()
    if best is not None:
        click.echo(f"fastest split that fits: {best.split} at {best.samples_per_s:.1f} samples/s")


class BenchProgress:
    """What a benchmark is about to do and its expected duration, then a bar per split (a line per timed run
    where stderr is no terminal)."""

    def __init__(self, say, live: bool) -> None:
        self.say, self.live, self.bars = say, live, {}
        self.outlook, self.started, self.rounds_seen = None, 0.0, 0

    def start(self, outlook) -> None:
        import time

        self.outlook, self.started, self.rounds_seen = outlook, time.perf_counter(), 0
        self.say(outlook.describe() + " ...")
        if not self.live:
            return
        from tqdm import tqdm

        width = max(len(label) for label in outlook.labels)
        self.bars = {label: tqdm(total=outlook.settings.max_rounds, desc=f"  {label:>{width}}", unit="round",
                                 position=index, file=sys.stderr, dynamic_ncols=True, leave=True)
                     for index, label in enumerate(outlook.labels)}

    def trial(self, round_number: int, label: str, rate: float | None) -> None:
        if round_number == 2 and self.rounds_seen == 1 and self.outlook is not None:
            self._after_the_first_round()
        self.rounds_seen = round_number
        speed = "did not run" if rate is None else f"{rate:.1f} samples/s"
        bar = self.bars.get(label)
        if bar is None:
            self.say(f"  round {round_number}  {label:>18}  {speed}")
            return
        bar.set_postfix_str(speed)
        bar.update(1)

    def _after_the_first_round(self) -> None:
        """The forecast again, from the first round's own time (the first came from the probe's trials)."""
        import time

        took = time.perf_counter() - self.started
        settings = self.outlook.settings
        least = min(took * settings.min_rounds, settings.time_budget_s + took)
        line = f"round 1 took {took:.0f} s: about {least:.0f} s for the {settings.min_rounds} rounds at least"
        if self.bars:
            next(iter(self.bars.values())).write(line, file=sys.stderr)
        else:
            self.say(line)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars = {}


def print_estimate(result) -> None:
    """The human-readable estimate: traced peaks by category, the line, the edge, the plan, the assumptions, the launch."""
    spec = result.workload
    where = result.target or ("a CPU process" if result.device_kind == "cpu" else "the given limit")
    sharded = spec.get("parallel") == "fsdp"
    click.echo(f"model      {spec['model']}  ({result.task}, {result.param_count / 1e6:.1f}M parameters, "
               f"{lengths_text(result.task, result.seq_len, spec.get('target_len'))}, {spec['dtype']}, "
               f"{spec['optimizer']})")
    per_rank = " per rank" if result.world_size > 1 else ""
    click.echo(f"device     {where}: {format_bytes(result.memory_limit_bytes)}, usable "
               f"{format_bytes(result.usable_bytes)}{per_rank}")
    if result.world_size > 1:
        click.echo(f"ranks      {ranks_line(result)}")
    static = "sharded weights, gradients and optimizer states" if sharded else "weights, gradients and optimizer states"
    offload = " (in host memory: --cpu-offload)" if sharded and spec.get("cpu_offload") and result.device_kind == "cuda" else ""
    click.echo(f"static     {format_bytes(result.static_bytes)} for {static}{per_rank}{offload}")
    click.echo("")
    if sharded:
        _print_sharded_rows(result.rows)
    else:
        click.echo(f"  {'micro-batch':>11} {'phase':>15} {'params':>10} {'grads':>10} {'optimizer':>10} "
                   f"{'activations':>11} {'other':>10} {'peak':>10}")
        for row in result.rows:
            click.echo(f"  {row.micro_batch:>11} {row.phase:>15} {format_bytes(row.parameters):>10} "
                       f"{format_bytes(row.gradients):>10} {format_bytes(row.optimizer_states):>10} "
                       f"{format_bytes(row.activations):>11} {format_bytes(row.other):>10} {format_bytes(row.peak_bytes):>10}")
    intercept, slope = result.line
    click.echo("")
    click.echo(f"memory line: {format_bytes(int(intercept))} + {format_bytes(int(slope))} per sample{per_rank}")
    edge = f"{result.max_micro_batch}" + (" (the cap; more may fit)" if result.capped else "")
    click.echo(f"largest micro-batch predicted to fit: {edge}   [{result.trace_count} traces, "
               f"{result.trace_seconds:.1f} s, peak {format_bytes(result.peak_bytes)}{per_rank}]")
    click.echo(f"plan: {Plan.from_dict(result.plan).describe()}")
    if result.plan_peak_bytes and result.plan_peak_bytes != result.peak_bytes:
        click.echo(f"plan's peak: {format_bytes(result.plan_peak_bytes)}{per_rank}{plan_peak_note(result)}")
    if result.launch_command:
        click.echo(f"launch: {result.launch_command}")
    if result.trust is not None:
        click.echo(f"trust: {result.trust.describe()}")
    click.echo("assumptions:")
    for assumption in result.assumptions:
        click.echo(f"  - {assumption.text}")


def plan_peak_note(result) -> str:
    """Why the plan's peak is not B*'s: a plan of one micro-step holds nothing from an earlier one."""
    if any(not getattr(r, "accumulated", True) for r in result.rows) and result.plan.get("grad_accum_steps") == 1:
        return " (one micro-step, no accumulation: no unsharded gradients held from an earlier one)"
    return ""


def phase_label(row) -> str:
    """The row's phase; a step of one micro-step (no accumulation, traced alone) is told apart."""
    if getattr(row, "accumulated", True):
        return row.phase
    return "micro-step" if row.phase == "micro-steps" else "step, no accum"


def ranks_line(result) -> str:
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


_SHARDED_COLUMNS = (("sh.params", "sharded_parameters"), ("gathered", "unsharded_parameters"),
                    ("sh.grads", "sharded_gradients"), ("full grads", "unsharded_gradients"),
                    ("optimizer", "optimizer_states"), ("activations", "activations"), ("temps", "temporaries"),
                    ("all-gather", "all_gather"), ("red-scat", "reduce_scatter"))


def _print_sharded_rows(rows) -> None:
    """FSDP's categories: sharded and gathered parameters, sharded and full gradients, the collectives' buffers."""
    click.echo(f"  {'micro-batch':>11} {'phase':>14} " + " ".join(f"{title:>10}" for title, _ in _SHARDED_COLUMNS)
               + f" {'peak':>10}")
    for row in rows:
        detail = row.detail or {}
        values = [detail.get(key, 0) + (detail.get("inputs", 0) if key == "activations" else 0)
                  for _, key in _SHARDED_COLUMNS]
        click.echo(f"  {row.micro_batch:>11} {phase_label(row):>14} " + " ".join(f"{format_bytes(v):>10}" for v in values)
                   + f" {format_bytes(row.peak_bytes):>10}")
