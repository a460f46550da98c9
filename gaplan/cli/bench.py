"""``gaplan bench``: the plan against every other split and a true large batch, or by tokens the token plan against
the samples plan; its options and what is printed (the checks and the work are
:mod:`gaplan.workflows.bench_options`'s)."""

from __future__ import annotations

import json
from typing import Any

import click

from gaplan.cli.config_file import GaplanCommand, run_config_text
from gaplan.cli.field_options import field_options, sectioned
from gaplan.cli.options import (
    batch_by_options,
    command_object,
    overwrite_option,
    stderr_printer,
    workload_options,
)
from gaplan.cli.output import BenchProgress, echo_lines, same_terminal
from gaplan.core.constants import BY_TOKENS
from gaplan.core.lines import histogram_lines, trial_line
from gaplan.core.options import OUTPUT
from gaplan.report.result_text import bench_lines, token_bench_result_lines
from gaplan.workflows.bench_options import BENCH_BY_SAMPLES, BY_SAMPLES_TIMING, BenchCommand


@click.command(name="bench", cls=GaplanCommand, options_class=BenchCommand)
@workload_options
# the effective batch, the plan, the ranks, the large batch, the data (by tokens), the run folder
@field_options(BenchCommand, data={"applies": BY_TOKENS}, **{name: {"applies": BENCH_BY_SAMPLES}
                                                             for name in BY_SAMPLES_TIMING})
@batch_by_options
@overwrite_option()
@sectioned(OUTPUT, "--json", "as_json", is_flag=True, help="Print the rows as one JSON object on stdout.")
@sectioned(OUTPUT, "--quiet", is_flag=True, help="No progress lines on stderr.")
def bench_command(**options: Any) -> None:
    """Throughput of the plan against its neighbouring splits and a true large batch, with 95% intervals.

    Times whole optimizer steps of the effective batch E for the plan, its two neighbouring
    splits (every split from B* down by powers of two with --all-splits) and micro-batch E
    without accumulation, in interleaved rounds: each round runs every split once, in a fresh
    process, warm-up steps untimed. Rounds go on (at least --rounds) until the plan's ratio
    to the large batch is known to --ci-target, or --time-budget is spent. Splits are timed
    as training runs them: no budget bound, allocators as they are. The verdict names its
    interval, and a ratio whose interval includes 1 is never called faster or slower. On CPU
    a large batch over the budget is timed for reference, and labelled so. Probes first (or
    uses the cached probe, or --plan). Writes throughput.csv, bench.json, plan.json and the
    report.

    \b
    Examples:
      gaplan bench --effective-batch 256
      gaplan bench --model tiny-bert-cls --seq-len 64 --effective-batch 64 --ci-target 0.03
      gaplan bench --all-splits --time-budget 900      # every split, up to 15 min
      gaplan bench --plan reports/<run>/plan.json --json
      gaplan bench --parallel fsdp --world-size 2 --effective-batch 64   # each run: 2 ranks, FSDP2
      gaplan bench --data corpus.txt --tokenizer bytes --batch-by tokens    # token plan vs samples plan

    With --batch-by tokens: probes T* for --data (as gaplan probe --batch-by tokens), then trains the
    token plan (micro-batches packed within T* tokens) and the samples plan (B* at the longest length)
    on the same steps of the data, each run a fresh process under the enforced budget (CPU): --rounds
    runs per plan, interleaved, each of --warmup untimed and --repeats timed optimizer steps. Prints
    samples/s, real tokens/s, padding, micro-steps per step, peak, and the ratio of real tokens/s.
    """
    from gaplan.workflows.run_commands import run_bench_command

    command = command_object(options)
    if command.by_tokens:
        _bench_by_tokens(command, options)
        return
    out = command.out
    say = stderr_printer(options["quiet"])
    live = not options["quiet"] and same_terminal()
    progress = BenchProgress(say, live)
    try:
        measured, files = run_bench_command(command, say=say, on_trial=lambda t: say(trial_line(t)),
                                            on_bench_trial=progress.trial, on_start=progress.start,
                                            config_toml=run_config_text(click.get_current_context()))
    finally:
        progress.close()
    if options["as_json"]:
        click.echo(json.dumps({"run_dir": out, **measured.to_dict(), "report": files}))
        return
    echo_lines(bench_lines(measured))
    click.echo(f"throughput.csv, bench.json and the report written to {out}")


def _bench_by_tokens(command: Any, options: dict[str, Any]) -> None:
    """``gaplan bench --batch-by tokens``: T*, then the token plan against the samples plan on the same data."""
    from gaplan.core.constants import TOKEN_PLAN_KIND
    from gaplan.workflows.run_commands import run_bench_command

    out = command.out
    say = stderr_printer(options["quiet"])
    live = not options["quiet"] and same_terminal()

    def on_run(kind: str, round_number: int, run: dict[str, Any]) -> None:
        name = "token plan  " if kind == TOKEN_PLAN_KIND else "samples plan"
        if "error" in run:
            say(f"  round {round_number}  {name}  failed: {run['error']}")
        else:
            say(f"  round {round_number}  {name}  {run['samples_per_s']:8.1f} samples/s  {run['tokens_per_s']:9,.0f} "
                f"real tokens/s  {sum(run['micro_steps']) / len(run['micro_steps']):5.1f} micro-steps per step")

    result = run_bench_command(command, say=say, on_trial=lambda t: say(trial_line(t)),
                               on_profile=lambda profile: say("\n".join(histogram_lines(profile.histogram))) if live
                               else None, on_run=on_run, config_toml=run_config_text(click.get_current_context()))
    if options["as_json"]:
        click.echo(json.dumps(result.to_dict()))
        return
    echo_lines(token_bench_result_lines(result, profile_shown_live=live))
    click.echo(f"throughput.csv, tokens.json and the report written to {out}")
