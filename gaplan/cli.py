"""The ``gaplan`` command line: parses options, calls the library, prints. Nothing else.

    gaplan probe                          # largest micro-batch that fits + plan, built-in model
    gaplan probe --model tiny-llama --seq-len 512 --memory-limit 2GiB --effective-batch 256
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import click

from gaplan import __version__
from gaplan.errors import GaplanError
from gaplan.units import format_bytes, parse_bytes

WORKLOAD_HELP = "Presets: tiny-gpt2 (default), small-gpt2, tiny-llama, tiny-bert-mlm, tiny-bert-cls."


class GaplanGroup(click.Group):
    """Turns every :class:`GaplanError` into one line on stderr and exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GaplanError as exc:
            click.echo(f"gaplan: {exc}", err=True)
            ctx.exit(2)
        except KeyboardInterrupt:
            click.echo("gaplan: interrupted", err=True)
            ctx.exit(130)


@click.group(cls=GaplanGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="gaplan")
def main() -> None:
    """gaplan: the largest micro-batch that fits, the accumulation plan, and training with the exact loss.

    \b
    Examples:
      gaplan probe                                  # built-in small causal LM, CPU budget 1 GiB
      gaplan probe --model tiny-llama --seq-len 512 --memory-limit 2GiB --effective-batch 256
      gaplan probe --model mypkg.models:make_resnet --memory-limit 1GiB --json
    """


def workload_options(func: Callable) -> Callable:
    """Options that describe what is trained, shared by every command that builds a model."""
    options = [
        click.option("--model", default="tiny-gpt2", show_default=True, metavar="NAME|DIR|MODULE:FUNC",
                     help="A preset, a Hugging Face model directory or cached id, or module:function. "
                          + WORKLOAD_HELP),
        click.option("--task", default=None, metavar="TASK",
                     help="causal-lm, masked-lm or classification (default: the model's own)."),
        click.option("--seq-len", type=int, default=None, help="Sequence length of every sample (default: preset's)."),
        click.option("--dtype", default="fp32", show_default=True, metavar="fp32|bf16|fp16",
                     help="Compute dtype (autocast; weights stay fp32)."),
        click.option("--optimizer", default="adamw", show_default=True, metavar="adamw|sgd"),
        click.option("--lr", type=float, default=1e-4, show_default=True, help="Learning rate."),
        click.option("--grad-checkpointing", is_flag=True, help="Recompute activations in backward."),
        click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda[:N]"),
        click.option("--memory-limit", default=None, metavar="SIZE",
                     help="Memory budget, e.g. 2GiB or 800MB (CPU default 1 GiB; CUDA default: the card)."),
        click.option("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def spec_from_options(options: dict[str, Any]):
    from gaplan.workload import WorkloadSpec

    return WorkloadSpec(model=options["model"], task=options["task"], seq_len=options["seq_len"],
                        dtype=options["dtype"], optimizer=options["optimizer"], lr=options["lr"],
                        grad_checkpointing=options["grad_checkpointing"]).validate()


def memory_limit_from_options(options: dict[str, Any]) -> int | None:
    text = options["memory_limit"]
    return None if text is None else parse_bytes(text)


def default_run_dir(command: str, model: str) -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", os.path.basename(model.rstrip("/")) or model).strip("-")
    return os.path.join("reports", f"{command}-{name}-{stamp}")


def check_writable(directory: str, what: str = "--out") -> None:
    """Fail before any work when the output cannot be written (nothing half-written after)."""
    target = os.path.abspath(directory)
    if os.path.exists(target) and not os.path.isdir(target):
        raise GaplanError(f"{what} {directory} exists and is not a directory")
    parent = target
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    try:  # really try: permission bits say nothing for root or on /proc-like file systems
        os.rmdir(tempfile.mkdtemp(prefix=".gaplan-check-", dir=parent))
    except OSError:
        raise GaplanError(f"{what} {directory} is not writable") from None


def positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise GaplanError(f"{name} must be a positive integer (got {value})")


def trial_line(trial) -> str:
    verdict = "fits" if trial.fits else "OOM "
    return f"  micro-batch {trial.micro_batch:>6}  {verdict}  peak {format_bytes(trial.peak_bytes):>10}  {trial.seconds:7.2f} s"


def print_probe(result) -> None:
    """The human-readable probe report: trials, the edge, the plan."""
    spec = result.workload
    budget = format_bytes(result.memory_limit_bytes)
    note = " (default CPU budget; set --memory-limit to change it)" if result.budget_is_default else ""
    click.echo(f"model      {spec.model}  ({result.task}, {result.param_count / 1e6:.1f}M parameters, "
               f"seq len {result.seq_len}, {spec.dtype}, {spec.optimizer})")
    click.echo(f"device     {result.device}, budget {budget}{note}")
    if result.margin:
        click.echo(f"margin     {result.margin:.0%} kept free: trials ran under {format_bytes(result.probe_limit_bytes)}")
    click.echo(f"static     {format_bytes(result.static_bytes)} for weights, gradients and optimizer states")
    click.echo("")
    click.echo(f"  {'micro-batch':>18}  {'result':<4}  {'peak':>15}  {'time':>9}")
    for trial in sorted(result.trials, key=lambda t: t.micro_batch):
        click.echo(trial_line(trial))
    click.echo("")
    edge = f"{result.max_micro_batch}" + (" (the search cap; more may fit)" if result.capped else "")
    click.echo(f"largest micro-batch that fits: {edge}   "
               f"[{len(result.trials)} trials, {result.wall_seconds:.1f} s; every trial = 2 accumulated "
               "micro-steps + optimizer step at steady state]")
    plan = result.plan
    sizes = ",".join(str(s) for s in plan.micro_batch_sizes)
    click.echo(f"plan: effective batch {plan.effective_batch} = micro-batch {plan.micro_batch} x "
               f"{plan.grad_accum_steps} accumulation steps x world size {plan.world_size}   (sizes {sizes})")


@main.command()
@workload_options
@click.option("--effective-batch", type=int, default=256, show_default=True, help="Samples per optimizer step.")
@click.option("--world-size", type=int, default=1, show_default=True, help="Processes the batch is split over.")
@click.option("--margin", type=float, default=0.0, show_default=True,
              help="Fraction of the budget kept free (e.g. 0.05 for longer batches later).")
@click.option("--max-micro-batch", type=int, default=4096, show_default=True, help="Do not search above this.")
@click.option("--out", default=None, metavar="DIR", help="Run folder for plan.json (default reports/probe-<model>-<time>).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout instead of the table.")
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
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
    """
    from gaplan.probe import probe as run_probe
    from gaplan.probe import save_probe

    spec = spec_from_options(options)
    memory_limit = memory_limit_from_options(options)
    for name in ("effective_batch", "world_size", "max_micro_batch", "threads"):
        positive("--" + name.replace("_", "-"), options[name])
    out = options["out"] or default_run_dir("probe", spec.model)
    check_writable(out)
    show = (lambda t: click.echo(trial_line(t), err=True)) if not options["quiet"] else None
    if show:
        click.echo(f"probing {spec.model} (each trial: 2 micro-steps + optimizer step) ...", err=True)
    result = run_probe(spec, device=options["device"], memory_limit=memory_limit, margin=options["margin"],
                       effective_batch=options["effective_batch"], world_size=options["world_size"],
                       max_micro_batch=options["max_micro_batch"], threads=options["threads"], on_trial=show)
    plan_path = os.path.join(out, "plan.json")
    save_probe(result, plan_path)
    if options["as_json"]:
        click.echo(json.dumps(dict(result.to_dict(), plan_file=plan_path)))
        return
    print_probe(result)
    click.echo(f"plan written to {plan_path}  (gaplan train --plan {plan_path})")


def run() -> None:
    """Entry point that never shows a traceback for user errors."""
    main(prog_name="gaplan")


if __name__ == "__main__":
    sys.exit(main())
