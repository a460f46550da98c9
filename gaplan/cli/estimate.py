"""``gaplan estimate``: the largest micro-batch for a GPU you don't have, traced on fake tensors."""

from __future__ import annotations

import json
from typing import Any

import click

from gaplan.cli.config_file import GaplanCommand
from gaplan.cli.field_options import field_options, sectioned
from gaplan.cli.options import command_object, stderr_printer, workload_options
from gaplan.cli.output import echo_lines
from gaplan.core.options import MEMORY, OUTPUT
from gaplan.report.result_text import estimate_lines, target_lines
from gaplan.workflows.estimate_options import EstimateCommand
from gaplan.workflows.probe_settings import ProbeOptions


@click.command(name="estimate", cls=GaplanCommand, options_class=EstimateCommand)
@workload_options
@field_options(EstimateCommand)
@sectioned(MEMORY, "--list-targets", is_flag=True, help="List the known GPUs and their usable memory, then exit.")
@field_options(ProbeOptions, only=("search_cap",), search_cap={"applies": None})
@sectioned(OUTPUT, "--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@sectioned(OUTPUT, "--quiet", is_flag=True, help="No progress line on stderr.")
def estimate_command(**options: Any) -> None:
    """Plan for a GPU you don't have: trace one training step on fake tensors, allocate nothing.

    The model is built on the meta device and traced under FakeTensorMode with torch's
    MemTracker: weights, gradients, optimizer states and the activations of the real
    model code, at two micro-batch sizes; the line through them predicts the largest
    micro-batch, which is then traced to check it. CUDA's allocator rounding, context
    and workspace reserve, foreach AdamW and autocast are modelled and stated.
    --device cpu models a CPU process instead (to compare with gaplan probe).

    With --parallel fsdp --world-size W, one rank of a W-way FSDP2 step is traced with
    torch's FSDPMemTracker on a fake process group (no GPU, no other process): sharded
    and gathered parameters and gradients, optimizer states, activations, all-gather and
    reduce-scatter buffers. The output ends with the command that launches the plan.

    \b
    Examples:
      gaplan estimate --target h100-80gb --model ./llama-7b-config-dir --seq-len 2048 --dtype bf16 --effective-batch 512
      gaplan estimate --model llama-2-7b --seq-len 4096 --dtype bf16 --target h100-80gb --world-size 8 \\
          --parallel fsdp --effective-batch 512
      gaplan estimate --model llama-2-70b --dtype bf16 --grad-checkpointing --parallel fsdp --grad-sync every \\
          --target h100-80gb --nodes 8 --effective-batch 512
      gaplan estimate --memory-limit 24GiB --model tiny-llama --json
      gaplan estimate --list-targets
      gaplan estimate --device cpu --memory-limit 1GiB     # compare with: gaplan probe
    """
    from gaplan.estimate import list_targets
    from gaplan.workflows.run_commands import run_estimate_command

    if options["list_targets"]:
        targets = list_targets()
        if options["as_json"]:
            click.echo(json.dumps([t.to_dict() for t in targets]))
            return
        echo_lines(target_lines(targets))
        return
    command = command_object(options)
    result = run_estimate_command(command, say=stderr_printer(options["quiet"]))
    if options["as_json"]:
        click.echo(json.dumps(result.to_dict()))
        return
    echo_lines(estimate_lines(result))

