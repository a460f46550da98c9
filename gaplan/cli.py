"""The ``gaplan`` command line: parses options, calls the library, prints. Nothing else.

    gaplan probe                          # largest micro-batch that fits + plan, built-in model
    gaplan probe --model tiny-llama --seq-len 512 --memory-limit 2GiB --effective-batch 256
"""

from __future__ import annotations

import dataclasses
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
      gaplan probe --report                         # + throughput, memory breakdown, report.md/html
      gaplan train --effective-batch 256            # probe (or cached), then train with accumulation
      gaplan bench --effective-batch 256            # the plan vs other splits vs a true large batch
      gaplan report reports/<run>                   # rebuild a run folder's report from its files
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
        click.option("--grad-checkpointing", type=click.Choice(["off", "on", "auto"]), default=None, is_flag=False,
                     flag_value="on", help="Recompute activations in backward: on, off (default), or auto "
                                          "(probe: on only when a larger micro-batch fits and wins on throughput)."),
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
                        grad_checkpointing=options["grad_checkpointing"] == "on").validate()


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
@click.option("--objective", type=click.Choice(["max-micro-batch", "throughput"]), default="max-micro-batch",
              show_default=True, help="Plan with the largest micro-batch, or with the split of highest measured "
                                      "throughput (times every split: minutes).")
@click.option("--report", is_flag=True, help="Also time the splits against a true large batch, break memory down "
                                             "by category, and write report.md/html, CSVs and PNGs to the run folder.")
@click.option("--repeats", type=int, default=2, show_default=True, help="Timed optimizer steps per split (with "
                                                                      "--report or --objective throughput).")
@click.option("--seed-from-estimate", is_flag=True, help="Start the search at gaplan estimate's predicted edge "
                                                         "(traced on fake tensors first) and verify both sides.")
@click.option("--emit", type=click.Choice(["hf"]), default=None,
              help="Also print the plan as code to paste: hf = transformers TrainingArguments.")
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
      gaplan probe --report --objective throughput      # time every split; plan with the fastest
      gaplan probe --grad-checkpointing auto --emit hf  # print TrainingArguments to paste
    """
    from gaplan.probe import save_probe
    from gaplan.tuner import tune

    spec = spec_from_options(options)
    memory_limit = memory_limit_from_options(options)
    for name in ("effective_batch", "world_size", "max_micro_batch", "threads", "repeats"):
        positive("--" + name.replace("_", "-"), options[name])
    timing = options["report"] or options["objective"] == "throughput" or options["grad_checkpointing"] == "auto"
    if timing and options["world_size"] != 1:
        raise GaplanError("--report, --objective throughput and --grad-checkpointing auto time one device: "
                          "use --world-size 1")
    out = options["out"] or default_run_dir("probe", spec.model)
    check_writable(out)
    quiet = options["quiet"]
    show = (lambda t: click.echo(trial_line(t), err=True)) if not quiet else None
    if show:
        click.echo(f"probing {spec.model} (each trial: a fresh process, 2 optimizer steps of 2 micro-steps) ...",
                   err=True)
    start = 1
    if options["seed_from_estimate"]:
        start = seed_from_estimate(spec, options, memory_limit, quiet)
    tuned = tune(spec, objective=options["objective"], grad_checkpointing=options["grad_checkpointing"] or "off",
                 device=options["device"], memory_limit=memory_limit, effective_batch=options["effective_batch"],
                 bench_large_batch=options["report"], repeats=options["repeats"], on_trial=show,
                 on_row=None if quiet else lambda row: click.echo(throughput_line(row), err=True),
                 on_stage=None if quiet else lambda text: click.echo(text + " ...", err=True),
                 margin=options["margin"], world_size=options["world_size"],
                 max_micro_batch=options["max_micro_batch"], threads=options["threads"], start=start)
    result = dataclasses.replace(tuned.result, command=command_line())
    plan_path = os.path.join(out, "plan.json")
    save_probe(result, plan_path)
    written = write_run_report(out, result, tuned.benches, quiet) if options["report"] else None
    snippet = None
    if options["emit"] == "hf":
        from gaplan.integrations.transformers import hf_snippet

        snippet = hf_snippet(result.plan)
    if options["as_json"]:
        click.echo(json.dumps(dict(result.to_dict(), plan_file=plan_path, report=written, hf_snippet=snippet)))
        return
    print_probe(result)
    if result.tuner:
        click.echo(f"tuner ({tuned.decision.objective}): {tuned.decision.reason}")
    click.echo(f"plan written to {plan_path}  (gaplan train --plan {plan_path})")
    if written:
        click.echo(f"report written to {os.path.join(out, 'report.md')} and report.html")
    if snippet:
        click.echo("\n# Hugging Face Trainer settings for this plan:\n" + snippet, nl=False)


def seed_from_estimate(spec, options: dict[str, Any], memory_limit: int | None, quiet: bool) -> int:
    """The estimate's B* for this device and budget, where the probe's search starts."""
    from gaplan.devices import DEFAULT_CPU_BUDGET, resolve_device
    from gaplan.estimate import estimate

    device = resolve_device(options["device"])
    kind = "cpu" if device == "cpu" else "cuda"
    limit = memory_limit or (DEFAULT_CPU_BUDGET if kind == "cpu" else None)
    if limit is not None:
        limit = int(limit * (1 - options["margin"]))
    if kind == "cuda" and limit is None:
        import torch

        limit = torch.cuda.get_device_properties(torch.device(device)).total_memory
    predicted = estimate(spec, memory_limit=limit, device_kind=kind, effective_batch=1,
                         max_micro_batch=options["max_micro_batch"], threads=options["threads"])
    if not quiet:
        click.echo(f"estimate: B* = {predicted.max_micro_batch} ({predicted.trace_count} traces on fake tensors, "
                   f"{predicted.trace_seconds:.1f} s); starting the search there", err=True)
    return predicted.max_micro_batch


def command_line() -> str:
    """This invocation as a shell command, recorded in plan.json so a report says how to reproduce it."""
    import shlex

    return " ".join(["gaplan", *map(shlex.quote, sys.argv[1:])])


def throughput_line(row) -> str:
    speed = f"{row.samples_per_s:8.1f} samples/s" if row.samples_per_s else "       - samples/s"
    ratio = f"  x{row.ratio_to_large_batch:.2f} of the large batch" if row.ratio_to_large_batch else ""
    peak = format_bytes(row.peak_bytes)
    return f"  {row.split:>18}  {speed}  peak {peak:>10}{ratio}{'  ' + row.note if row.note else ''}"


def write_run_report(out: str, result, benches: list, quiet: bool) -> list[str]:
    """throughput.csv and breakdown.csv from measurements, then the report built from the folder's files."""
    from gaplan.bench import bench
    from gaplan.probe import WorkerProcess
    from gaplan.report import write_csv, write_report

    rows = []
    if not benches:
        benches = [bench(result, on_row=None if quiet else lambda row: click.echo(throughput_line(row), err=True))]
    for index, measured in enumerate(benches):
        for row in measured.to_records():
            if index:  # the splits that only fit with gradient checkpointing
                row.update(split=row["split"] + " +ckpt", kind="split")
            rows.append(row)
    write_csv(out, "throughput.csv", rows)
    sizes = breakdown_sizes(result)
    if not quiet:
        click.echo(f"memory breakdown by category at micro-batch {', '.join(map(str, sizes))} ...", err=True)
    peaks = {t.micro_batch: t.peak_bytes for t in result.trials if t.fits}
    with WorkerProcess(result.workload, result.device, result.probe_limit_bytes) as worker:
        breakdown = [dict(worker.breakdown(size), device_peak_bytes=peaks.get(size)) for size in sizes]
    write_csv(out, "breakdown.csv", breakdown)
    return write_report(out).files


def breakdown_sizes(result) -> list[int]:
    """Up to four measured sizes that fit, spread from the smallest to B*."""
    fitted = sorted({t.micro_batch for t in result.trials if t.fits})
    if len(fitted) <= 4:
        return fitted
    return sorted({fitted[round(i * (len(fitted) - 1) / 3)] for i in range(4)})


# Part of the plan-cache key: a change in how trials measure must not reuse older answers.
PROBE_METHOD = "fork-per-trial, 2 optimizer steps, anonymous peak"


def plan_cache_path(spec, device: str, memory_limit: int | None) -> str:
    """Where a probe of this workload, device and budget is cached for ``gaplan train``."""
    import hashlib

    key = json.dumps({"workload": {k: v for k, v in spec.to_dict().items() if k != "lr"}, "device": device,
                      "memory_limit": memory_limit, "probe": PROBE_METHOD}, sort_keys=True)
    root = os.environ.get("GAPLAN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "gaplan")
    return os.path.join(root, "plans", hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")


def probe_for(spec, options: dict[str, Any], device: str, memory_limit: int | None, say: Callable[[str], None],
              write_cache: bool = True):
    """The probe to plan from: ``--plan``'s file, else the cached probe of this workload, else a new probe.

    Returns the workload spec too: a plan's tuner may have chosen gradient checkpointing.
    """
    from gaplan.probe import load_probe, probe, save_probe

    if options.get("plan_file"):
        probed = load_probe(options["plan_file"])
        if options["grad_checkpointing"] in (None, "auto"):
            spec = dataclasses.replace(spec, grad_checkpointing=probed.workload.grad_checkpointing)
        if not same_workload(probed.workload, spec):
            raise GaplanError(f"--plan {options['plan_file']} was made for {probed.workload.model} "
                              f"(seq len {probed.workload.seq_len}, {probed.workload.dtype}), not this workload")
        return spec, probed
    if options["grad_checkpointing"] == "auto":
        raise GaplanError("--grad-checkpointing auto is decided by gaplan probe; give its --plan, or on/off")
    cache = plan_cache_path(spec, device, memory_limit)
    if os.path.isfile(cache):
        probed = load_probe(cache)
        say(f"using the cached probe {cache}: largest micro-batch {probed.max_micro_batch}")
        return spec, probed
    say("probing the largest micro-batch that fits first ...")
    probed = probe(spec, device=device, memory_limit=memory_limit, effective_batch=1, on_trial=lambda t: say(trial_line(t)))
    if write_cache:
        save_probe(probed, cache)
    return spec, probed


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
@click.option("--compare", is_flag=True, help="After training, time the plan against other splits and a true "
                                              "large batch, and write the report (with loss and samples/s plots).")
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
      gaplan train --effective-batch 64 --compare           # then: the run folder's report.html
    """
    from gaplan.data import SyntheticCorpus, TextCorpus
    from gaplan.devices import make_backend, resolve_device
    from gaplan.plan import make_plan
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
    if options["plan_file"] or options["micro_batch"] is None:
        spec, probed = probe_for(spec, options, device, memory_limit, say, write_cache=dist.rank == 0)
    elif options["grad_checkpointing"] == "auto":
        raise GaplanError("--grad-checkpointing auto is decided by gaplan probe; give its --plan, or on/off")
    effective = options["effective_batch"] or (probed.plan.effective_batch if options["plan_file"] else 256)
    max_micro = options["micro_batch"] or dist.min(probed.planning_micro_batch)
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
    if options["compare"] and not result.interrupted:
        from gaplan.bench import bench
        from gaplan.probe import load_probe
        from gaplan.report import write_csv, write_report

        say("timing the plan against other splits and a true large batch ...")
        measured = bench(load_probe(os.path.join(run_dir, "plan.json")), result.plan.effective_batch,
                         threads=options["threads"], on_row=lambda row: say(throughput_line(row)))
        write_csv(run_dir, "throughput.csv", measured.to_records())
        summary["report"] = write_report(run_dir).files
        summary["throughput"] = measured.to_records()
        say(f"report written to {os.path.join(run_dir, 'report.md')} and report.html")
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
    from gaplan.probe import ProbeResult, save_probe

    if probed is None:
        probed = ProbeResult(workload=spec, device=device, memory_limit_bytes=memory_limit or 0, margin=0.0,
                             probe_limit_bytes=memory_limit or 0, budget_is_default=memory_limit is None,
                             max_micro_batch=plan.max_micro_batch, capped=False, trials=[], plan=plan,
                             param_count=0, static_bytes=0, task=spec.task or "?", seq_len=spec.seq_len,
                             wall_seconds=0.0)
    save_probe(dataclasses.replace(probed, plan=plan, command=command_line()), os.path.join(run_dir, "plan.json"))


@main.command(name="bench")
@workload_options
@click.option("--effective-batch", type=int, default=256, show_default=True, help="Samples per optimizer step.")
@click.option("--plan", "plan_file", default=None, metavar="PLAN.JSON", help="Use a plan written by gaplan probe.")
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed optimizer steps per split.")
@click.option("--warmup", type=int, default=1, show_default=True, help="Untimed optimizer steps first.")
@click.option("--no-large-batch", is_flag=True, help="Do not run the true large batch (micro-batch = E).")
@click.option("--out", default=None, metavar="DIR", help="Run folder (default reports/bench-<model>-<time>).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON object on stdout.")
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
def bench_command(**options: Any) -> None:
    """Throughput of the plan against other splits and against a true large batch.

    Times whole optimizer steps of the effective batch E (warm-up excluded, median of
    the repeats) for the plan, for every micro-batch from B* down by powers of two, and
    for micro-batch E without accumulation. On CPU a large batch that does not fit the
    budget is run without it, for reference, and labelled so. Probes first (or uses the
    cached probe, or --plan). Writes throughput.csv, plan.json and the report.

    \b
    Examples:
      gaplan bench --effective-batch 256
      gaplan bench --model tiny-bert-cls --seq-len 64 --effective-batch 64 --repeats 5
      gaplan bench --plan reports/<run>/plan.json --json
    """
    from gaplan.bench import bench
    from gaplan.devices import resolve_device
    from gaplan.probe import save_probe
    from gaplan.report import write_csv, write_report

    spec = spec_from_options(options)
    memory_limit = memory_limit_from_options(options)
    for name in ("effective_batch", "repeats", "threads"):
        positive("--" + name.replace("_", "-"), options[name])
    if options["warmup"] < 0:
        raise GaplanError(f"--warmup must be 0 or more (got {options['warmup']})")
    device = resolve_device(options["device"])
    out = options["out"] or default_run_dir("bench", spec.model)
    check_writable(out)
    say = (lambda text: click.echo(text, err=True)) if not options["quiet"] else (lambda text: None)
    spec, probed = probe_for(spec, options, device, memory_limit, say)
    say(f"timing splits of effective batch {options['effective_batch']} (B* = {probed.max_micro_batch}, "
        f"{options['warmup']} warm-up + {options['repeats']} timed steps each) ...")
    measured = bench(probed, options["effective_batch"], repeats=options["repeats"], warmup=options["warmup"],
                     threads=options["threads"], large_batch=not options["no_large_batch"],
                     on_row=lambda row: say(throughput_line(row)))
    os.makedirs(out, exist_ok=True)
    save_probe(dataclasses.replace(probed, command=command_line()), os.path.join(out, "plan.json"))
    write_csv(out, "throughput.csv", measured.to_records())
    files = write_report(out).files
    if options["as_json"]:
        click.echo(json.dumps({"run_dir": out, "effective_batch": measured.effective_batch,
                               "rows": measured.to_records(), "report": files}))
        return
    for row in measured.rows:
        click.echo(throughput_line(row))
    best = measured.best_fitting()
    if best is not None:
        click.echo(f"fastest split that fits: {best.split} at {best.samples_per_s:.1f} samples/s")
    click.echo(f"throughput.csv and the report written to {out}")


@main.command(name="report")
@click.argument("run_dir", metavar="DIR")
@click.option("--json", "as_json", is_flag=True, help="Print the files written as JSON.")
def report_command(run_dir: str, as_json: bool) -> None:
    """Rebuild report.md, report.html, probe.csv and the PNGs of a run folder from its CSV/JSON alone.

    Needs no model and no device: copy a run folder anywhere and rebuild its report.

    \b
    Examples:
      gaplan report reports/probe-tiny-gpt2-20261129-101500
      gaplan report reports/<run> --json
    """
    from gaplan.report import write_report

    written = write_report(run_dir)
    if as_json:
        click.echo(json.dumps({"run_dir": run_dir, "files": written.files}))
        return
    click.echo(f"wrote {', '.join(written.files)} in {run_dir}")


@main.command(name="estimate")
@workload_options
@click.option("--target", default=None, metavar="GPU", help="A GPU from --list-targets (default h100-80gb when no "
                                                            "--memory-limit is given).")
@click.option("--list-targets", is_flag=True, help="List the known GPUs and their usable memory, then exit.")
@click.option("--effective-batch", type=int, default=256, show_default=True, help="Samples per optimizer step.")
@click.option("--sizes", default=None, metavar="B1,B2", help="Micro-batches whose micro-steps draw the memory line "
                                                             "(default 1,2).")
@click.option("--max-micro-batch", type=int, default=4096, show_default=True, help="Do not consider above this.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.option("--quiet", is_flag=True, help="No progress line on stderr.")
def estimate_command(**options: Any) -> None:
    """Plan for a GPU you don't have: trace one training step on fake tensors, allocate nothing.

    The model is built on the meta device and traced under FakeTensorMode with torch's
    MemTracker: weights, gradients, optimizer states and the activations of the real
    model code, at two micro-batch sizes; the line through them predicts the largest
    micro-batch, which is then traced to check it. CUDA's allocator rounding, context
    and workspace reserve, foreach AdamW and autocast are modelled and stated.
    --device cpu models a CPU process instead (to compare with gaplan probe).

    \b
    Examples:
      gaplan estimate --target h100-80gb --model ./llama-7b-config-dir --seq-len 2048 --dtype bf16 --effective-batch 512
      gaplan estimate --memory-limit 24GiB --model tiny-llama --json
      gaplan estimate --list-targets
      gaplan estimate --device cpu --memory-limit 1GiB     # compare with: gaplan probe
    """
    from gaplan.estimate import estimate
    from gaplan.targets import list_targets

    if options["list_targets"]:
        targets = list_targets()
        if options["as_json"]:
            click.echo(json.dumps([t.to_dict() for t in targets]))
            return
        click.echo(f"{'target':<12} {'memory':>10} {'reserve':>10} {'usable':>10}  description")
        for t in targets:
            click.echo(f"{t.name:<12} {format_bytes(t.total_bytes):>10} {format_bytes(t.reserve_bytes):>10} "
                       f"{format_bytes(t.usable_bytes):>10}  {t.description}")
        return
    spec = spec_from_options(options)
    memory_limit = memory_limit_from_options(options)
    for name in ("effective_batch", "max_micro_batch", "threads"):
        positive("--" + name.replace("_", "-"), options[name])
    sizes = parse_sizes(options["sizes"])
    kind = "cpu" if (options["device"] or "auto").strip().lower() == "cpu" else "cuda"
    if kind == "cpu" and options["target"]:
        raise GaplanError("--target is a GPU: it does not go with --device cpu")
    if not options["quiet"]:
        click.echo(f"tracing {spec.model} on fake tensors (nothing is allocated) ...", err=True)
    result = estimate(spec, memory_limit=memory_limit, target=options["target"], effective_batch=options["effective_batch"],
                      sizes=sizes, device_kind=kind, max_micro_batch=options["max_micro_batch"], threads=options["threads"])
    if options["as_json"]:
        click.echo(json.dumps(result.to_dict()))
        return
    print_estimate(result)


def parse_sizes(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise GaplanError(f"--sizes must be comma-separated positive integers (got {text!r})") from None
    if len(sizes) < 2 or min(sizes) < 1:
        raise GaplanError(f"--sizes needs at least two positive micro-batch sizes (got {text!r})")
    return sizes


def print_estimate(result) -> None:
    """The human-readable estimate: traced peaks by category, the line, the edge, the plan, the assumptions."""
    spec = result.workload
    where = result.target or ("a CPU process" if result.device_kind == "cpu" else "the given limit")
    click.echo(f"model      {spec['model']}  ({result.task}, {result.param_count / 1e6:.1f}M parameters, "
               f"seq len {result.seq_len}, {spec['dtype']}, {spec['optimizer']})")
    click.echo(f"device     {where}: {format_bytes(result.memory_limit_bytes)}, usable "
               f"{format_bytes(result.usable_bytes)}")
    click.echo(f"static     {format_bytes(result.static_bytes)} for weights, gradients and optimizer states")
    click.echo("")
    click.echo(f"  {'micro-batch':>11} {'phase':>15} {'params':>10} {'grads':>10} {'optimizer':>10} "
               f"{'activations':>11} {'other':>10} {'peak':>10}")
    for row in result.rows:
        click.echo(f"  {row.micro_batch:>11} {row.phase:>15} {format_bytes(row.parameters):>10} "
                   f"{format_bytes(row.gradients):>10} {format_bytes(row.optimizer_states):>10} "
                   f"{format_bytes(row.activations):>11} {format_bytes(row.other):>10} {format_bytes(row.peak_bytes):>10}")
    intercept, slope = result.line
    click.echo("")
    click.echo(f"memory line: {format_bytes(int(intercept))} + {format_bytes(int(slope))} per sample")
    edge = f"{result.max_micro_batch}" + (" (the cap; more may fit)" if result.capped else "")
    click.echo(f"largest micro-batch predicted to fit: {edge}   [{result.trace_count} traces, "
               f"{result.trace_seconds:.1f} s, peak {format_bytes(result.peak_bytes)}]")
    plan = result.plan
    click.echo(f"plan: effective batch {plan['effective_batch']} = micro-batch {plan['micro_batch']} x "
               f"{plan['grad_accum_steps']} accumulation steps x world size {plan['world_size']}")
    click.echo("assumptions:")
    for line in result.assumptions:
        click.echo(f"  - {line}")


def run() -> None:
    """Entry point that never shows a traceback for user errors."""
    main(prog_name="gaplan")


if __name__ == "__main__":
    sys.exit(main())
