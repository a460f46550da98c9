"""``gaplan plan``: which layout (DDP, FSDP, checkpointing, CPU offload; weight precision) to train a model with, and
on one device which memory levers (docs/levers.md)."""

from __future__ import annotations

import json
from typing import Any

import click

from gaplan.cli.config_file import GaplanCommand
from gaplan.cli.field_options import field_help, field_options, sectioned
from gaplan.cli.options import command_object, lora_options, stderr_printer, task_and_lengths
from gaplan.core.options import OUTPUT
from gaplan.workflows.plan_options import PlanCommand
from gaplan.workload.spec import WorkloadSpec


@click.command(name="plan", cls=GaplanCommand)
@field_options(WorkloadSpec, only=("model", "dtype", "optimizer", "loss", "lr", "trust_remote_code"),
               model={"help": field_help(WorkloadSpec, "model") + " Shapes to plan for: llama-2-7b, llama-2-13b, "
                                                                  "llama-2-70b."},
               dtype={"type": click.Choice(["bf16", "fp16", "fp32"]), "default": "bf16", "metavar": None, "help": (
                   "Compute dtype; the layouts try fp32 weights with it (autocast) and pure low-precision weights.")},
               optimizer={"help": "The optimizer every row trains with (others are compared only when --levers names "
                                  "them)."},
               loss={"help": "The loss of every layout (the lever table compares chunked too).", "applies": None},
               lr={"help": "Learning rate for the launch command (default: the optimizer's)."})
@task_and_lengths
@field_options(PlanCommand)
@sectioned(OUTPUT, "--json", "as_json", is_flag=True, help="Print one JSON object on stdout instead of the table.")
@sectioned(OUTPUT, "--quiet", is_flag=True, help="No progress lines on stderr.")
@lora_options
def plan_command(**options: Any) -> None:
    """Compare the ways to train a model over W ranks and pick one: layout, precision, micro-batch, launch command.

    Every layout -- DDP, FSDP, FSDP + activation checkpointing, FSDP + CPU offload, each
    with fp32 weights and low-precision compute or pure low-precision weights -- is
    estimated with gaplan estimate (one rank traced on fake tensors; nothing is
    allocated), giving the largest micro-batch B*, the split of the effective batch
    (22,21,21 x 8 when uneven) and the peak per rank at the split's micro-batch. The pick
    has the fewest accumulation steps; on a tie, the finer precision, then the least
    memory-saving machinery (each costs time); its trade-offs are named, and a pick within
    5% of the limit gets a caveat and the gaplan probe command that checks it. With
    --measure, each layout that fits is then probed and timed on this machine, and the
    fastest wins.

    On one device (--world-size 1) a lever table follows, on the DDP pick's precision:
    your workload, each lever alone (--loss chunked, checkpointing; other optimizers only
    when --levers names them), and the memory levers together, each with B*, its split,
    its peak and a modelled time per optimizer step (docs/levers.md). Its pick, the
    fastest to E (with --measure: the fastest measured), gives the launch command.

    \b
    Examples:
      gaplan plan --model llama-2-7b --seq-len 4096 --target h100-80gb --world-size 8 --effective-batch 512
      gaplan plan --model llama-2-70b --target h100-80gb --nodes 8 --effective-batch 512 --layouts fsdp,fsdp+ckpt
      gaplan plan --model tiny-gpt2 --seq-len 16 --device cpu --memory-limit 200MiB --world-size 2 --json
      gaplan plan --model tiny-gpt2 --seq-len 16 --device cpu --world-size 2 --effective-batch 64 --measure
      gaplan plan --device cpu --effective-batch 16 --levers chunked,ckpt,lion
    """
    from gaplan.report.layout_report import (
        caveat_lines,
        header_line,
        layouts_frame,
        not_estimated_lines,
        pick_line,
        report_dict,
        table_text,
        tradeoff_lines,
    )
    from gaplan.workflows.plan_options import PlanCommand, run_plan_command

    command = command_object(PlanCommand, options)
    say = stderr_printer(options["quiet"])
    out = command.out

    def progress(result) -> None:
        what = f"{result.layout.label}, {result.precision_label}"
        if result.fits is None:
            say(f"  {what}: not estimated")
        elif result.fits:
            say(f"  {what}: B* {result.max_micro_batch}, peak {_bytes(result.peak_bytes)} per rank at micro-batch "
                f"{result.micro_batch}")
        else:
            say(f"  {what}: does not fit")

    def measured(result, split: str) -> None:
        what = f"{result.layout.label}, {result.precision_label}"
        if result.samples_per_s:
            say(f"  {what}: B* {result.max_micro_batch} (estimated {result.extra.get('estimated_max_micro_batch')})"
                f", {split}: {result.samples_per_s:.1f} samples/s")
        else:
            say(f"  {what}: {result.note}")

    def lever_progress(result) -> None:
        if result.fits:
            rate = f", {result.samples_per_s:.1f} samples/s" if result.samples_per_s else ""
            say(f"  {result.label}: B* {result.max_micro_batch}, {result.grad_accum_steps} step(s){rate}")
        else:
            say(f"  {result.label}: {result.note or 'does not fit'}")

    done = run_plan_command(command, say=say, on_result=progress, on_measured=measured, on_lever=lever_progress)
    comparison, files, lever_table = done.comparison, done.files, done.levers
    if options["as_json"]:
        from gaplan.report.lever_report import report_dict as lever_dict

        extra = {"levers": lever_dict(lever_table)} if lever_table is not None else {}
        click.echo(json.dumps({**report_dict(comparison), **extra, "out": out, "files": files}))
        return
    click.echo(header_line(comparison))
    click.echo("")
    click.echo(table_text(layouts_frame(comparison)))
    for line in not_estimated_lines(comparison):
        click.echo(line)
    if any(r.extra.get("capped") for r in comparison.results):
        click.echo("(cap): B* reached one rank's share of the effective batch; a larger micro-batch may fit but is "
                   "never used")
    click.echo("")
    click.echo(pick_line(comparison))
    for line in caveat_lines(comparison) + tradeoff_lines(comparison):
        click.echo(line)
    if lever_table is not None:
        _print_levers(lever_table)
    if done.launch_command:
        click.echo(f"launch: {done.launch_command}")
    click.echo(f"report: {out}/report.md (and report.html, layouts.png, layouts.csv, layouts.json"
               + (", levers.md, levers.csv, levers.json)" if lever_table is not None else ")"))


def _print_levers(table) -> None:
    from gaplan.report.lever_report import cost_line, header_line, not_compared_lines, pick_lines, table_text

    click.echo("")
    click.echo(header_line(table))
    click.echo("")
    click.echo(table_text(table))
    for line in not_compared_lines(table) + [cost_line(table), ""] + pick_lines(table):
        click.echo(line)


def _bytes(value: int | None) -> str:
    from gaplan.core.units import format_bytes

    return format_bytes(value or 0)
