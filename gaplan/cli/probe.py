"""``gaplan probe``: its options (generated from :class:`gaplan.workflows.probe_settings.ProbeOptions`' fields, and
the workload's) and what is printed; the checks are :class:`gaplan.workflows.probe_options.ProbeCommand`'s."""

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
from gaplan.core.lines import histogram_lines, throughput_line, trial_line
from gaplan.core.options import MEMORY, OUTPUT
from gaplan.report.result_text import probe_lines, token_probe_lines
from gaplan.runs.folder import REPORT_HTML, REPORT_MD, path_in
from gaplan.workflows.probe_options import ProbeCommand
from gaplan.workflows.probe_settings import TIMED, TIMING_OPTIONS, ProbeOptions


@click.command(name="probe", cls=GaplanCommand, options_class=ProbeCommand)
@workload_options
# the plan's batch, the search, the tuner, the report and how it times, goodput's run
@field_options(ProbeOptions, data={"applies": "`--batch-by tokens`, `--objective goodput` (its measuring run)"},
               **{name: {"applies": TIMED} for name in TIMING_OPTIONS})
@sectioned(MEMORY, "--target", default=None, metavar="GPU", applies="a CUDA device (a smaller GPU emulated on a larger one)",
           help="Emulate a smaller card from gaplan estimate --list-targets on this GPU (its usable memory as budget).")
@field_options(ProbeCommand, only=("emit",))
@batch_by_options
@sectioned(OUTPUT, "--out", default=None, metavar="DIR", help="Run folder for plan.json (default reports/probe-<model>-<time>).")
@overwrite_option()
@sectioned(OUTPUT, "--json", "as_json", is_flag=True, help="Print one JSON object on stdout instead of the table.")
@sectioned(OUTPUT, "--quiet", is_flag=True, help="No progress lines on stderr.")
def probe(**options: Any) -> None:
    """Find the largest micro-batch that fits, by real steady-state training steps, and plan accumulation.

    Each trial runs two accumulated micro-steps and an optimizer step with the
    optimizer's states already allocated, in a worker process under the budget.
    The search jumps to the edge that measured peak memory predicts and checks both
    sides, so the answer is exact: B* fits and B*+1 does not.

    \b
    Examples:
      gaplan probe
      gaplan probe --model tiny-llama --seq-len 512 --memory-limit 2GiB --effective-batch 256
      gaplan probe --model ./my-hf-model-dir --task causal-lm --dtype bf16 --device cuda
      gaplan probe --model mypkg.models:make_resnet --memory-limit 1GiB --json
      gaplan probe --report --objective throughput      # time every split; plan with the fastest
      gaplan probe --objective goodput --effective-batch 64 --batch-range 4:256  # the batch worth its steps
      gaplan probe --grad-checkpointing auto --emit hf  # print TrainingArguments to paste
      gaplan probe --data corpus.jsonl --batch-by tokens  # T*: the largest tokens per micro-batch for this data

    With --batch-by tokens: reads --data, prints its length profile, and finds T*, the largest token
    budget a micro-batch packed from this data may hold: the exact edge B* at the data's longest and
    shortest lengths, T* the most tokens both allow, in granules. Writes plan.json (the probe at the
    longest length), tokens.json (the profile and T*: gaplan train --token-plan) and lengths.png.
    """
    from gaplan.workflows.run_commands import run_probe_command

    command = command_object(options)
    if command.by_tokens:
        _probe_by_tokens(command, options)
        return
    say = stderr_printer(options["quiet"])
    progress = BenchProgress(say, not options["quiet"] and same_terminal())
    try:
        run = run_probe_command(command, on_trial=lambda t: say(trial_line(t)), on_row=lambda row: say(throughput_line(row)),
                                say=say, on_bench_trial=progress.trial, on_bench_start=progress.start,
                                config_toml=run_config_text(click.get_current_context()))
    finally:
        progress.close()
    result = run.result
    snippet = None
    if command.emit:  # hf, the one choice
        from gaplan.integrations.transformers import hf_snippet

        snippet = hf_snippet(result.plan)
    if options["as_json"]:
        click.echo(json.dumps(dict(result.to_dict(), plan_file=run.plan_path, report=run.report_files,
                                   hf_snippet=snippet, estimate_seed=run.estimate_seed, contention=run.contention,
                                   train_command=run.train_command)))
        return
    echo_lines(probe_lines(result, trials_shown_live=not options["quiet"] and same_terminal()))
    if run.tuner_reason:
        click.echo(f"tuner ({options['objective']}): {run.tuner_reason}")
    click.echo(f"plan written to {run.plan_path}  ({run.train_command})")
    if run.verdict:
        click.echo(f"throughput: {run.verdict}")
    if run.contention:  # as gaplan bench says it: a contended machine widens every interval
        click.echo(f"machine: {run.contention}")
    if run.report_files:
        click.echo(f"report written to {path_in(command.out, REPORT_MD)} and {REPORT_HTML}")
    if snippet:
        click.echo("\n# Hugging Face Trainer settings for this plan:\n" + snippet, nl=False)


def _probe_by_tokens(command: Any, options: dict[str, Any]) -> None:
    """``gaplan probe --batch-by tokens``: the data's length profile, T*, plan.json, tokens.json, lengths.png."""
    from gaplan.workflows.run_commands import run_probe_command

    out = command.out
    say = stderr_printer(options["quiet"])
    live = not options["quiet"] and same_terminal()
    shown = []

    def show_profile(profile: Any) -> None:
        if not options["as_json"] and live:
            say("\n".join(histogram_lines(profile.histogram)))
        shown.append(profile)

    run = run_probe_command(command, say=say, on_trial=lambda t: say(trial_line(t)), on_profile=show_profile,
                            config_toml=run_config_text(click.get_current_context()))
    if options["as_json"]:
        click.echo(json.dumps(run.to_dict()))
        return
    echo_lines(token_probe_lines(run, profile_shown_live=live))
    click.echo(f"plan.json, tokens.json and lengths.png written to {out}  ({run.train_command})")
