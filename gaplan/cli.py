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
    where = f"  (out of memory at optimizer step {trial.completed_steps + 1})" if not trial.fits else ""
    return (f"  micro-batch {trial.micro_batch:>6}  {verdict}  peak {format_bytes(trial.peak_bytes):>10}  "
            f"{trial.seconds:7.2f} s{where}")


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
    for trial in result.trials:
        click.echo(trial_line(trial))
    click.echo("")
    edge = f"{result.max_micro_batch}" + (" (the search cap; more may fit)" if result.capped else "")
    click.echo(f"largest micro-batch that fits: {edge}   "
               f"[{len(result.trials)} trials, each a fresh process, {result.wall_seconds:.1f} s]")
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


# Part of the plan-cache key: a change in how trials measure must not reuse older answers.
PROBE_METHOD = "fork-per-trial, 2 optimizer steps, anonymous peak"


def plan_cache_path(spec, device: str, memory_limit: int | None) -> str:
    """Where a probe of this workload, device and budget is cached for ``gaplan train``."""
    import hashlib

    key = json.dumps({"workload": {k: v for k, v in spec.to_dict().items() if k != "lr"}, "device": device,
                      "memory_limit": memory_limit, "probe": PROBE_METHOD}, sort_keys=True)
    root = os.environ.get("GAPLAN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "gaplan")
    return os.path.join(root, "plans", hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")


def same_workload(a, b) -> bool:
    keys = ("model", "task", "seq_len", "dtype", "optimizer", "grad_checkpointing")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


@main.command()
@workload_options
@click.option("--effective-batch", type=int, default=None, help="Samples per optimizer step (default 256, or the plan's).")
@click.option("--micro-batch", type=int, default=None, help="Skip the probe and use this micro-batch.")
@click.option("--plan", "plan_file", default=None, metavar="PLAN.JSON", help="Use a plan written by gaplan probe.")
@click.option("--data", default=None, metavar="FILE", help="Text file (one sample per line) or JSONL with 'text'.")
@click.option("--steps", type=int, default=6, show_default=True, help="Optimizer steps.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--max-grad-norm", type=float, default=None, help="Clip the gradient norm (after fp16 unscaling).")
@click.option("--warmup-steps", type=int, default=0, show_default=True)
@click.option("--checkpoint-every", type=int, default=0, show_default=True,
              help="Checkpoint every N steps (always at the end and on SIGINT/SIGTERM).")
@click.option("--resume", default=None, metavar="RUN_DIR", help="Continue the run in RUN_DIR from its checkpoint.")
@click.option("--save-weights", default=None, metavar="FILE", help="Write the final weights (safetensors).")
@click.option("--out", default=None, metavar="DIR", help="Run folder (default reports/train-<model>-<time>).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(**options: Any) -> None:
    """Train with gradient accumulation and a loss equal to the large-batch loss, token for token.

    Without --plan or --micro-batch, probes first (reusing a cached probe of the same
    workload, device and budget). Each micro-batch's summed token loss is divided by
    the number of targets in the whole optimizer step (all micro-batches, all ranks).

    \b
    Examples:
      gaplan train --effective-batch 256
      gaplan train --model tiny-bert-mlm --effective-batch 64 --steps 50 --memory-limit 1GiB
      gaplan train --plan reports/<run>/plan.json --data corpus.txt
      gaplan train --effective-batch 32 --micro-batch 8 --optimizer sgd --lr 0.1 --steps 1 --save-weights w.safetensors
      torchrun --nproc-per-node 2 -m gaplan train --effective-batch 64 --micro-batch 8
      gaplan train --effective-batch 256 --resume reports/<run>
    """
    from gaplan.data import SyntheticCorpus, TextCorpus
    from gaplan.devices import make_backend, resolve_device
    from gaplan.plan import make_plan
    from gaplan.probe import load_probe, probe, save_probe
    from gaplan.train import TrainConfig, init_distributed
    from gaplan.train import train as run_train
    from gaplan.workload import build_workload, model_source_kind

    spec = spec_from_options(options)
    memory_limit = memory_limit_from_options(options)
    for name in ("effective_batch", "micro_batch", "steps", "threads"):
        positive("--" + name.replace("_", "-"), options[name])
    if options["lr"] == 1e-4 and options["optimizer"] == "adamw":
        spec = type(spec)(**dict(spec.to_dict(), lr=1e-3))  # a training default that learns in a few steps
    device = resolve_device(options["device"])
    run_dir = options["resume"] or options["out"] or default_run_dir("train", spec.model)
    if options["resume"] and not os.path.isfile(os.path.join(run_dir, "checkpoint.pt")):
        raise GaplanError(f"--resume {run_dir}: no checkpoint.pt in it")
    check_writable(run_dir)
    if options["save_weights"]:
        check_writable(os.path.dirname(os.path.abspath(options["save_weights"])), "--save-weights")
    dist = init_distributed(device)
    if options["threads"]:
        import torch

        torch.set_num_threads(options["threads"])
    say = (lambda text: click.echo(text, err=True)) if dist.rank == 0 and not options["quiet"] else (lambda text: None)

    probed = None
    if options["plan_file"]:
        probed = load_probe(options["plan_file"])
        if not same_workload(probed.workload, spec):
            raise GaplanError(f"--plan {options['plan_file']} was made for {probed.workload.model} "
                              f"(seq len {probed.workload.seq_len}, {probed.workload.dtype}), not this workload")
    elif options["micro_batch"] is None:
        cache = plan_cache_path(spec, device, memory_limit)
        if os.path.isfile(cache):
            probed = load_probe(cache)
            say(f"using the cached probe {cache}: largest micro-batch {probed.max_micro_batch}")
        else:
            say("probing the largest micro-batch that fits first ...")
            probed = probe(spec, device=device, memory_limit=memory_limit, effective_batch=1,
                           on_trial=lambda t: say(trial_line(t)))
            if dist.rank == 0:
                save_probe(probed, cache)
    effective = options["effective_batch"] or (probed.plan.effective_batch if options["plan_file"] else 256)
    max_micro = options["micro_batch"] or dist.min(probed.max_micro_batch)
    if options["micro_batch"] and probed is not None and options["micro_batch"] > probed.max_micro_batch:
        raise GaplanError(f"--micro-batch {options['micro_batch']} does not fit: the probed maximum is "
                          f"{probed.max_micro_batch}")
    plan = make_plan(effective, max_micro, dist.world_size)
    workload = build_workload(spec, device if device == "cpu" else f"cuda:{dist.rank}" if dist.active else device,
                              seed=options["seed"])
    if model_source_kind(spec.model) == "function":
        corpus = None
    elif options["data"]:
        corpus = TextCorpus(options["data"], workload.seq_len, workload.vocab_size,
                            spec.model if os.path.isdir(spec.model) else None)
    else:
        corpus = SyntheticCorpus(workload.seq_len, workload.num_labels or 4, seed=options["seed"])
    sizes = ",".join(map(str, plan.micro_batch_sizes))
    say(f"plan: effective batch {plan.effective_batch} = micro-batch {plan.micro_batch} x {plan.grad_accum_steps} "
        f"accumulation steps x world size {plan.world_size} (sizes {sizes})")
    config = TrainConfig(steps=options["steps"], seed=options["seed"], max_grad_norm=options["max_grad_norm"],
                         checkpoint_every=options["checkpoint_every"], warmup_steps=options["warmup_steps"],
                         run_dir=run_dir)
    if dist.rank == 0:
        os.makedirs(run_dir, exist_ok=True)
        save_probe_plan(run_dir, spec, device, memory_limit, plan, probed)
    meter = make_backend(workload.device.type if device == "cpu" else str(workload.device))
    meter.activate(None, enforce=False)  # measure this process's peaks; the budget binds only the probe
    peak, reset = meter.peak_bytes, meter.reset_peak
    bar = None
    if dist.rank == 0 and not options["quiet"]:
        from tqdm import tqdm

        bar = tqdm(total=config.steps, desc="train", unit="step", file=sys.stderr, dynamic_ncols=True)

    def on_step(log) -> None:
        if bar is not None:
            if bar.n == 0 and log.step > 1:
                bar.update(log.step - 1)
            bar.set_postfix(loss=f"{log.loss:.4f}", samples_s=f"{log.samples_per_s:.1f}",
                            tokens_s=f"{log.tokens_per_s:.0f}")
            bar.update(1)

    def on_event(text: str) -> None:
        (bar.write if bar is not None else say)(text)

    result = run_train(workload, plan, corpus, config, resume=bool(options["resume"]), on_step=on_step,
                       on_event=on_event, peak_bytes=peak, reset_peak=reset)
    if bar is not None:
        bar.close()
    if options["save_weights"] and dist.rank == 0:
        from safetensors.torch import save_file

        state = {k: v.detach().contiguous().clone() for k, v in workload.model.state_dict().items()}
        save_file(state, options["save_weights"])  # cloned per name: tied weights no longer share storage
    if dist.rank != 0:
        return
    logs = result.logs
    summary = {
        "run_dir": run_dir, "steps": len(logs), "plan": result.plan.to_dict(),
        "loss_first": logs[0].loss if logs else None, "loss_last": logs[-1].loss if logs else None,
        "samples_per_s": (sum(log.samples_per_s for log in logs) / len(logs)) if logs else None,
        "tokens_per_s": (sum(log.tokens_per_s for log in logs) / len(logs)) if logs else None,
        "seconds": round(result.seconds, 2), "oom_fallbacks": result.oom_fallbacks, "interrupted": result.interrupted,
    }
    if options["as_json"]:
        click.echo(json.dumps(summary))
    elif logs:
        click.echo(f"trained {len(logs)} steps in {result.seconds:.1f} s: loss {logs[0].loss:.4f} -> "
                   f"{logs[-1].loss:.4f}, {summary['samples_per_s']:.1f} samples/s, "
                   f"{summary['tokens_per_s']:.0f} tokens/s; log and checkpoint in {run_dir}")
    if result.interrupted:
        sys.exit(130)


def save_probe_plan(run_dir: str, spec, device: str, memory_limit: int | None, plan, probed) -> None:
    """The run folder's plan.json: the probe it came from, with the plan actually used."""
    import dataclasses

    from gaplan.probe import ProbeResult, save_probe

    if probed is None:
        probed = ProbeResult(workload=spec, device=device, memory_limit_bytes=memory_limit or 0, margin=0.0,
                             probe_limit_bytes=memory_limit or 0, budget_is_default=memory_limit is None,
                             max_micro_batch=plan.max_micro_batch, capped=False, trials=[], plan=plan,
                             param_count=0, static_bytes=0, task=spec.task or "?", seq_len=spec.seq_len,
                             wall_seconds=0.0)
    save_probe(dataclasses.replace(probed, plan=plan), os.path.join(run_dir, "plan.json"))


def run() -> None:
    """Entry point that never shows a traceback for user errors."""
    main(prog_name="gaplan")


if __name__ == "__main__":
    sys.exit(main())
