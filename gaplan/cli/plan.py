"""``gaplan plan``: which layout (DDP, FSDP, checkpointing, CPU offload; weight precision) to train a model with, and
on one device which memory levers (docs/levers.md)."""

from __future__ import annotations

import json
from typing import Any

import click

from gaplan.cli.config_file import GaplanCommand
from gaplan.cli.field_options import field_options, sectioned
from gaplan.cli.options import command_object, lora_options, overwrite_option, stderr_printer, task_and_lengths
from gaplan.cli.output import echo_lines
from gaplan.core.options import OUTPUT
from gaplan.workflows.plan_options import PlanCommand
from gaplan.workload.spec import WorkloadSpec


@click.command(name="plan", cls=GaplanCommand, options_class=PlanCommand)
@field_options(WorkloadSpec, only=("model", "optimizer", "loss", "lr", "trust_remote_code"),
               optimizer={"help": "The optimizer every row trains with (others are compared only when --levers names "
                                  "them)."},
               loss={"help": "The loss of every layout (the lever table compares chunked too).", "applies": None},
               lr={"help": "Learning rate for the launch command (default: the optimizer's)."})
@task_and_lengths
@field_options(PlanCommand)
@overwrite_option()
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
    from gaplan.report.result_text import layout_line, lever_line, measured_layout_line, plan_lines
    from gaplan.workflows.run_commands import run_plan_command

    command = command_object(options)
    say = stderr_printer(options["quiet"])
    done = run_plan_command(command, say=say, on_result=lambda r: say(layout_line(r)),
                            on_measured=lambda r, split: say(measured_layout_line(r, split)),
                            on_lever=lambda r: say(lever_line(r)))
    if options["as_json"]:
        click.echo(json.dumps(done.to_dict()))
        return
    echo_lines(plan_lines(done.comparison, done.levers, done.launch_command, done.out))
