"""``gaplan train``: its options and what is printed; the checks are :mod:`gaplan.workflows.train_command`'s and
:class:`gaplan.workflows.train_options.TrainOptions`', the work :func:`gaplan.run_train`."""

from __future__ import annotations

import json
import os
import sys
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
from gaplan.cli.output import BenchProgress, ProgressBar, echo_lines, same_terminal
from gaplan.core.lines import throughput_line
from gaplan.core.options import OUTPUT
from gaplan.report.result_text import train_lines
from gaplan.runs.folder import REPORT_HTML, REPORT_MD, path_in
from gaplan.workflows.train_command import TrainCommand


@click.command(name="train", cls=GaplanCommand, options_class=TrainCommand)
@workload_options
@field_options(TrainCommand)  # the plan's source, the data, the loop, the outputs (TrainOptions); --token-plan, --resume, --out
@batch_by_options
@overwrite_option("without `--resume` (it replaces a run, `--resume` continues one)")
@sectioned(OUTPUT, "--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
@sectioned(OUTPUT, "--quiet", is_flag=True, help="No progress bar.")
def train_command(**options: Any) -> None:
    """Train with gradient accumulation and a loss equal to the large-batch loss, token for token.

    Without --plan or --micro-batch, probes first (reusing a cached probe of the same
    workload, device, budget and threads). Each micro-batch's summed token loss is divided
    by the number of targets in the whole optimizer step (all micro-batches, all ranks).

    \b
    Examples:
      gaplan train --effective-batch 256
      gaplan train --model tiny-bert-mlm --effective-batch 64 --steps 50 --memory-limit 1GiB
      gaplan train --plan reports/<run>/plan.json --data corpus.txt
      gaplan train --plan reports/<goodput-run>/plan.json --lr-scaling sqrt   # a goodput plan, lr scaled
      gaplan train --effective-batch 256 --batch-schedule adaptive  # grow E with the noise scale, lr by sqrt
      gaplan train --effective-batch 32 --micro-batch 8 --optimizer sgd --lr 0.1 --steps 1 --save-weights w.safetensors
      torchrun --nproc-per-node 2 -m gaplan train --effective-batch 64 --micro-batch 8
      # FSDP; an OOM is redone from the last checkpoint at half the micro-batch through torchrun's restart:
      TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nproc-per-node 2 --rdzv-backend c10d
          --rdzv-endpoint localhost:29500 --max-restarts 1 -m gaplan train --parallel fsdp --checkpoint-every 10
      gaplan train --effective-batch 256 --resume reports/<run>
      gaplan train --effective-batch 64 --compare           # then: the run folder's report.html
    """
    from gaplan.workflows.train import run_train
    from gaplan.workflows.train_command import prepare_train

    command = command_object(options)
    setup = prepare_train(command, say=stderr_printer(options["quiet"]))
    spec, run_dir, train_options = setup.spec, setup.run_dir, setup.options
    say = stderr_printer(options["quiet"])
    # Under torchrun every rank runs this; one bar (rank 0's) is enough.
    bar = ProgressBar(train_options.steps, enabled=not options["quiet"] and os.environ.get("RANK", "0") == "0")
    if not train_options.enforce_memory_limit:
        # Nothing is bound: train with the allocators as the user's own loop has them (MKL's pool on), not as a
        # budget needs them. Only before torch is loaded, which is when MKL reads its settings.
        from gaplan.devices.cpu import use_native_allocator

        use_native_allocator()
    progress = BenchProgress(say, not options["quiet"] and same_terminal())

    def bench_start(outlook) -> None:  # training is over: its bar ends before the bench's bars begin
        bar.close()
        progress.start(outlook)

    try:
        run = run_train(spec, run_dir, train_options, device=setup.device, memory_limit=setup.memory_limit, say=say,
                        on_step=bar.step, on_event=bar.write, on_row=lambda row: say(throughput_line(row)),
                        on_bench_trial=progress.trial, on_bench_start=bench_start, overwrite=setup.overwrite,
                        config_toml=run_config_text(click.get_current_context()))
    finally:
        bar.close()
        progress.close()
    if not run.is_main:
        return
    summary = run.summary
    if options["as_json"]:
        click.echo(json.dumps(summary))
    elif summary["steps"] or summary.get("steps_done") or run.interrupted:
        echo_lines(train_lines(summary, run_dir, bounded=train_options.enforce_memory_limit))
        if summary.get("report"):
            click.echo(f"report written to {path_in(run_dir, REPORT_MD)} and {REPORT_HTML}")
    if run.interrupted:
        sys.exit(130)

