"""The ``gaplan`` command line: parses options, calls the library (:mod:`gaplan.workflows`), prints. Nothing else.

    gaplan probe                          # largest micro-batch that fits + plan, built-in model
    gaplan probe --model tiny-llama --seq-len 512 --memory-limit 2GiB --effective-batch 256
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from gaplan import __version__
from gaplan.cli_estimate import estimate_command
from gaplan.cli_options import (
    SEARCH_CAP_OPTION,
    batch_by_options,
    check_granule_option,
    check_writable,
    command_line,
    data_options,
    data_source_from_options,
    given_on_command_line,
    memory_limit_from_options,
    positive,
    spec_from_options,
    stderr_printer,
    workload_options,
)
from gaplan.cli_output import ProgressBar, print_probe, same_terminal
from gaplan.cli_plan import plan_command
from gaplan.constants import DEFAULT_EFFECTIVE_BATCH, DEFAULT_TRAIN_STEPS
from gaplan.errors import GaplanError
from gaplan.lines import histogram_lines, throughput_line, token_bench_lines, trial_line
from gaplan.run_folder import CHECKPOINT, REPORT_HTML, REPORT_MD, TOKENS_JSON, default_run_dir, path_in


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


@main.command()
@workload_options
@click.option("--effective-batch", type=int, default=DEFAULT_EFFECTIVE_BATCH, show_default=True,
              help="Samples per optimizer step.")
@click.option("--world-size", type=int, default=1, show_default=True,
              help="Processes the batch is split over (with --parallel fsdp, 2 or more: every trial runs them all).")
@click.option("--margin", type=float, default=0.0, show_default=True,
              help="Fraction of the budget kept free (e.g. 0.05 for longer batches later).")
@SEARCH_CAP_OPTION
@click.option("--target", default=None, metavar="GPU", help="Emulate a smaller card from gaplan estimate "
                                                            "--list-targets on this GPU (its usable memory as budget).")
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
@batch_by_options
@data_options
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
      gaplan probe --data corpus.jsonl --batch-by tokens  # T*: the largest tokens per micro-batch for this data

    With --batch-by tokens: reads --data, prints its length profile, and finds T*, the largest token
    budget a micro-batch packed from this data may hold: the exact edge B* at the data's longest and
    shortest lengths, T* the most tokens both allow, in granules. Writes plan.json (the probe at the
    longest length), tokens.json (the profile and T*: gaplan train --token-plan) and lengths.png.
    """
    from gaplan.workflows import run_probe

    spec = spec_from_options(options)
    memory_limit = target_limit(options) or memory_limit_from_options(options)
    positive(options, "effective_batch", "world_size", "search_cap", "threads", "repeats")
    check_granule_option(options)
    if options["batch_by"] == "tokens":
        _probe_by_tokens(spec, memory_limit, options)
        return
    if options["data"]:
        raise GaplanError("--data applies to --batch-by tokens here (a probe by samples runs full-length batches)")
    timing = options["report"] or options["objective"] == "throughput" or options["grad_checkpointing"] == "auto"
    if timing and spec.parallel == "fsdp":
        raise GaplanError("--report, --objective throughput and --grad-checkpointing auto time one device; a sharded "
                          "run's splits are timed by gaplan bench --parallel fsdp --world-size W")
    if timing and options["world_size"] != 1:
        raise GaplanError("--report, --objective throughput and --grad-checkpointing auto time one device: "
                          "use --world-size 1")
    from gaplan.probing import trial_ranks

    ranks = trial_ranks(spec, options["world_size"])  # --parallel fsdp needs 2 ranks or more
    out = options["out"] or default_run_dir("probe", spec.model)
    check_writable(out)
    say = stderr_printer(options["quiet"])
    each = f"{ranks} fresh processes in one process group, each under the budget" if ranks > 1 else "a fresh process"
    say(f"probing {spec.model} (each trial: {each}, 2 optimizer steps of 2 micro-steps) ...")
    run = run_probe(spec, out, device=options["device"], memory_limit=memory_limit,
                    effective_batch=options["effective_batch"], world_size=options["world_size"],
                    margin=options["margin"], search_cap=options["search_cap"], objective=options["objective"],
                    grad_checkpointing=options["grad_checkpointing"] or "off", report=options["report"],
                    repeats=options["repeats"], seed_from_estimate=options["seed_from_estimate"],
                    threads=options["threads"], command=command_line(), on_trial=lambda t: say(trial_line(t)),
                    on_row=lambda row: say(throughput_line(row)), say=say)
    result = run.result
    snippet = None
    if options["emit"] == "hf":
        from gaplan.integrations.transformers import hf_snippet

        snippet = hf_snippet(result.plan)
    if options["as_json"]:
        click.echo(json.dumps(dict(result.to_dict(), plan_file=run.plan_path, report=run.report_files,
                                   hf_snippet=snippet, estimate_seed=run.estimate_seed)))
        return
    print_probe(result, trials_shown_live=not options["quiet"] and same_terminal())
    if run.tuner_reason:
        click.echo(f"tuner ({options['objective']}): {run.tuner_reason}")
    click.echo(f"plan written to {run.plan_path}  (gaplan train --plan {run.plan_path})")
    if run.report_files:
        click.echo(f"report written to {path_in(out, REPORT_MD)} and {REPORT_HTML}")
    if snippet:
        click.echo("\n# Hugging Face Trainer settings for this plan:\n" + snippet, nl=False)


def _probe_by_tokens(spec: Any, memory_limit: int | None, options: dict[str, Any]) -> None:
    """``gaplan probe --batch-by tokens``: the data's length profile, T*, plan.json, tokens.json, lengths.png."""
    from gaplan.token_workflow import run_token_probe

    _check_by_tokens(spec, options, "probe")
    for name, default, flag in (("report", False, "--report"), ("objective", "max-micro-batch", "--objective"),
                                ("seed_from_estimate", False, "--seed-from-estimate"), ("emit", None, "--emit"),
                                ("search_cap", None, "--search-cap"), ("margin", 0.0, "--margin")):
        if options[name] != default:
            raise GaplanError(f"{flag} applies to a probe by samples, not to --batch-by tokens")
    if options["grad_checkpointing"] == "auto":
        raise GaplanError("--grad-checkpointing auto applies to a probe by samples: give on or off with --batch-by tokens")
    out = options["out"] or default_run_dir("probe", spec.model)
    check_writable(out)
    say = stderr_printer(options["quiet"])
    live = not options["quiet"] and same_terminal()
    shown = []

    def show_profile(profile: Any) -> None:
        if not options["as_json"] and live:
            say("\n".join(histogram_lines(profile.histogram)))
        shown.append(profile)

    run = run_token_probe(spec, out, data_source_from_options(options), device=options["device"],
                          memory_limit=memory_limit, granule=options["granule"],
                          effective_batch=options["effective_batch"], threads=options["threads"],
                          command=command_line(), say=say, on_trial=lambda t: say(trial_line(t)),
                          on_profile=show_profile)
    if options["as_json"]:
        click.echo(json.dumps(run.to_dict()))
        return
    profile, budget = run.profile, run.budget
    if not live:
        click.echo(f"lengths    {profile.describe()}")
        click.echo("\n".join(histogram_lines(profile.histogram)))
        for name, probed in (("longest", run.long_probe), ("shortest", run.short_probe)):
            if probed is not None:
                click.echo(f"\nB* at the {name} length, {probed.workload.seq_len} tokens: {probed.max_micro_batch}"
                           f"{' (the search cap; more may fit)' if probed.capped else ''}   [{len(probed.trials)} trials]")
                for trial in probed.trials:
                    click.echo(trial_line(trial))
        click.echo("")
    note = " (default CPU budget; set --memory-limit to change it)" if run.long_probe.budget_is_default else ""
    from gaplan.units import format_bytes

    click.echo(f"device     {run.long_probe.device}, budget {format_bytes(run.long_probe.memory_limit_bytes)}{note}")
    click.echo(budget.describe())
    click.echo(f"samples plan at the longest length: {run.long_probe.plan.describe()}")
    click.echo(f"plan.json, tokens.json and lengths.png written to {out}  (gaplan train --batch-by tokens "
               f"--token-plan {path_in(out, TOKENS_JSON)})")


def _check_by_tokens(spec: Any, options: dict[str, Any], command: str) -> None:
    """What every ``--batch-by tokens`` probe needs: the data's lengths, one device."""
    if not options["data"]:
        raise GaplanError(f"--batch-by tokens probes the token budget from the data's lengths: give --data "
                          f"(gaplan {command} --data FILE --batch-by tokens)")
    if spec.parallel == "fsdp" or options.get("world_size", 1) != 1:
        raise GaplanError(f"gaplan {command} --batch-by tokens probes one device: use --world-size 1 and "
                          "--parallel ddp (gaplan train under torchrun probes T* per node)")


def target_limit(options: dict[str, Any]) -> int | None:
    """``--target``'s usable memory (the card less its CUDA context and workspaces), to emulate it on a larger GPU."""
    if not options["target"]:
        return None
    from gaplan.estimate import lookup_target

    if options["memory_limit"]:
        raise GaplanError("--target and --memory-limit both set the budget: give one")
    from gaplan.devices import resolve_device

    if resolve_device(options["device"]) == "cpu":
        raise GaplanError("--target emulates a GPU on a larger one: it needs a CUDA device (this run is on CPU)")
    return lookup_target(options["target"]).usable_bytes


@main.command()
@workload_options
@click.option("--effective-batch", type=int, default=None,
              help=f"Samples per optimizer step (default {DEFAULT_EFFECTIVE_BATCH}, or the plan's).")
@click.option("--micro-batch", type=int, default=None, help="Skip the probe and use this micro-batch.")
@batch_by_options
@click.option("--token-budget", type=int, default=None, metavar="TOKENS",
              help="With --batch-by tokens: the most padded tokens (samples x longest) in one micro-batch "
                   "(default: probed from --data's lengths, T*).")
@click.option("--token-plan", default=None, metavar="TOKENS.JSON",
              help="With --batch-by tokens: take T* from a tokens.json written by gaplan probe --batch-by tokens.")
@click.option("--plan", "plan_file", default=None, metavar="PLAN.JSON", help="Use a plan written by gaplan probe.")
@data_options
@click.option("--steps", type=int, default=DEFAULT_TRAIN_STEPS, show_default=True, help="Optimizer steps.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--max-grad-norm", type=float, default=None, help="Clip the gradient norm (after fp16 unscaling).")
@click.option("--warmup-steps", type=int, default=0, show_default=True, help="Linear learning-rate warm-up steps.")
@click.option("--checkpoint-every", type=int, default=0, show_default=True,
              help="Checkpoint every N steps (always at the end and on SIGINT/SIGTERM).")
@click.option("--resume", default=None, metavar="RUN_DIR", help="Continue the run in RUN_DIR from its checkpoint.")
@click.option("--save-weights", default=None, metavar="FILE", help="Write the final weights (safetensors).")
@click.option("--save-model", default=None, metavar="DIR", help="Write the trained model as a save_pretrained folder "
                                                                "(config, weights, tokenizer) that transformers loads.")
@click.option("--out", default=None, metavar="DIR", help="Run folder (default reports/train-<model>-<time>).")
@click.option("--enforce-memory-limit", is_flag=True, help="CPU: train under --memory-limit (default 1 GiB) as the "
                                                           "probe's trials do, so a plan that is too big hits real OOMs.")
@click.option("--compare", is_flag=True, help="After training, time the plan against other splits and a true "
                                              "large batch, and write the report (with loss and samples/s plots).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(**options: Any) -> None:
    """Train with gradient accumulation and a loss equal to the large-batch loss, token for token.

    Without --plan or --micro-batch, probes first (reusing a cached probe of the same
    workload, device, budget and threads). Each micro-batch's summed token loss is divided
    by the number of targets in the whole optimizer step (all micro-batches, all ranks).

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
    from gaplan.train_workflow import TrainOptions, resume_settings, run_train

    spec = spec_from_options(options)
    memory_limit = memory_limit_from_options(options)
    positive(options, "effective_batch", "micro_batch", "steps", "threads")
    for name in ("warmup_steps", "checkpoint_every"):
        if options[name] < 0:
            raise GaplanError(f"--{name.replace('_', '-')} must be 0 or more (got {options[name]})")
    run_dir = options["resume"] or options["out"] or default_run_dir("train", spec.model)
    if options["resume"] and not os.path.isfile(path_in(run_dir, CHECKPOINT)):
        raise GaplanError(f"--resume {run_dir}: no {CHECKPOINT} in it")
    check_writable(run_dir)
    if options["save_weights"]:
        check_writable(os.path.dirname(os.path.abspath(options["save_weights"])), "--save-weights")
    if options["save_model"]:
        from gaplan.model_io import check_save_path

        check_save_path(options["save_model"])
    train_options = TrainOptions(
        effective_batch=options["effective_batch"], micro_batch=options["micro_batch"],
        batch_by=options["batch_by"], token_budget=_token_budget(options, spec, memory_limit),
        granule=options["granule"],
        plan_file=options["plan_file"],
        grad_checkpointing=options["grad_checkpointing"], data=options["data"], text_field=options["text_field"],
        label_field=options["label_field"], long_samples=options["long_samples"], tokenizer=options["tokenizer"],
        steps=options["steps"],
        seed=options["seed"], max_grad_norm=options["max_grad_norm"], warmup_steps=options["warmup_steps"],
        checkpoint_every=options["checkpoint_every"], save_weights=options["save_weights"],
        save_model=options["save_model"], enforce_memory_limit=options["enforce_memory_limit"],
        compare=options["compare"], threads=options["threads"], command=command_line())
    device = options["device"]
    if options["resume"]:  # the run as it was started; what was given again must agree with it
        given = given_on_command_line(click.get_current_context())
        spec_fields = {"model", "task", "seq_len", "dtype", "weights_dtype", "optimizer", "lr", "init",
                       "trust_remote_code", "parallel", "cpu_offload", "grad_sync"}
        given_spec = {k: getattr(spec, k) for k in spec_fields if k in given}
        if "grad_checkpointing" in given and options["grad_checkpointing"] in ("on", "off"):
            given_spec["grad_checkpointing"] = options["grad_checkpointing"] == "on"
        given_options = {k: getattr(train_options, k) for k in given if hasattr(train_options, k)}
        given_options.update(command=train_options.command)
        spec, train_options, environment = resume_settings(run_dir, given_spec, given_options)
        device = device if "device" in given else environment.get("device", device)
        memory_limit = memory_limit if "memory_limit" in given else environment.get("memory_limit")
    say = stderr_printer(options["quiet"])
    # Under torchrun every rank runs this; one bar (rank 0's) is enough.
    bar = ProgressBar(train_options.steps, enabled=not options["quiet"] and os.environ.get("RANK", "0") == "0")
    run = run_train(spec, run_dir, train_options, device=device, memory_limit=memory_limit, say=say,
                    on_step=bar.step, on_event=bar.write, on_row=lambda row: say(throughput_line(row)))
    bar.close()
    if not run.is_main:
        return
    summary = run.summary
    if options["as_json"]:
        click.echo(json.dumps(summary))
    elif summary["steps"]:
        click.echo(f"trained {summary['steps']} steps in {summary['seconds']:.1f} s: loss {summary['loss_first']:.4f} -> "
                   f"{summary['loss_last']:.4f}, {summary['samples_per_s']:.1f} samples/s, "
                   f"{summary['tokens_per_s']:.0f} tokens/s; log and checkpoint in {run_dir}")
        if summary.get("report"):
            click.echo(f"report written to {path_in(run_dir, REPORT_MD)} and {REPORT_HTML}")
    if run.interrupted:
        sys.exit(130)


def _token_budget(options: dict, spec: Any = None, memory_limit: int | None = None) -> int | None:
    """The token budget given with ``--batch-by tokens`` (``--token-budget``, or T* of ``--token-plan``; None: probe
    it), checked; None by samples."""
    check_granule_option(options)
    if options["batch_by"] == "samples":
        for name in ("token_budget", "token_plan"):
            if options[name] is not None:
                raise GaplanError(f"--{name.replace('_', '-')} needs --batch-by tokens")
        return None
    if options["token_budget"] is not None and options["token_budget"] < 2:
        raise GaplanError(f"--token-budget must be at least 2 tokens (got {options['token_budget']})")
    if options["micro_batch"] is not None or options["plan_file"] is not None:
        raise GaplanError("--batch-by tokens packs by --token-budget: leave out --micro-batch and --plan")
    if options["token_plan"] is None:
        return options["token_budget"]
    if options["token_budget"] is not None:
        raise GaplanError("--token-budget and --token-plan both give the token budget: give one")
    from gaplan.devices import resolve_device
    from gaplan.token_workflow import token_budget_from_plan

    budget = token_budget_from_plan(options["token_plan"], spec, resolve_device(options["device"]), memory_limit)
    stderr_printer(options["quiet"])(f"token plan {options['token_plan']}: {budget.describe()}")
    return budget.token_budget


@main.command(name="bench")
@workload_options
@click.option("--effective-batch", type=int, default=DEFAULT_EFFECTIVE_BATCH, show_default=True,
              help="Samples per optimizer step.")
@click.option("--plan", "plan_file", default=None, metavar="PLAN.JSON", help="Use a plan written by gaplan probe.")
@click.option("--world-size", type=int, default=1, show_default=True,
              help="With --parallel fsdp: the ranks (2 or more) every timed run trains on, each under the budget.")
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed optimizer steps per split.")
@click.option("--warmup", type=int, default=1, show_default=True, help="Untimed optimizer steps first.")
@click.option("--no-large-batch", is_flag=True, help="Do not run the true large batch (micro-batch = E).")
@batch_by_options
@data_options
@click.option("--rounds", type=int, default=3, show_default=True,
              help="With --batch-by tokens: fresh training runs per plan, interleaved; rates are their medians.")
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
      gaplan bench --parallel fsdp --world-size 2 --effective-batch 64   # each run: 2 ranks, FSDP2
      gaplan bench --data corpus.txt --tokenizer bytes --batch-by tokens    # token plan vs samples plan

    With --batch-by tokens: probes T* for --data (as gaplan probe --batch-by tokens), then trains the
    token plan (micro-batches packed within T* tokens) and the samples plan (B* at the longest length)
    on the same steps of the data, each run a fresh process under the enforced budget (CPU): --rounds
    runs per plan, interleaved, each of --warmup untimed and --repeats timed optimizer steps. Prints
    samples/s, real tokens/s, padding, micro-steps per step, peak, and the ratio of real tokens/s.
    """
    from gaplan.devices import resolve_device
    from gaplan.plan import default_search_cap, make_plan
    from gaplan.plan_cache import probe_for
    from gaplan.probing import trial_ranks
    from gaplan.workflows import run_bench

    spec = spec_from_options(options)
    memory_limit = memory_limit_from_options(options)
    positive(options, "effective_batch", "repeats", "threads", "world_size", "rounds")
    if options["warmup"] < 0:
        raise GaplanError(f"--warmup must be 0 or more (got {options['warmup']})")
    check_granule_option(options)
    if options["batch_by"] == "tokens":
        _bench_by_tokens(spec, memory_limit, options)
        return
    if options["data"]:
        raise GaplanError("--data applies to --batch-by tokens here (bench by samples times full-length batches)")
    world = options["world_size"]
    if trial_ranks(spec, world) == 1 and world != 1:
        raise GaplanError("--world-size applies to --parallel fsdp here (every timed run trains all its ranks); "
                          "a replicated (DDP) split is timed in one process: use --world-size 1")
    make_plan(options["effective_batch"], options["effective_batch"], world)  # E must divide over the ranks
    device = resolve_device(options["device"])
    out = options["out"] or default_run_dir("bench", spec.model)
    check_writable(out)
    say = stderr_printer(options["quiet"])
    spec, probed = probe_for(spec, device, memory_limit, default_search_cap(options["effective_batch"], world),
                             plan_file=options["plan_file"], grad_checkpointing=options["grad_checkpointing"],
                             threads=options["threads"], say=say, on_trial=lambda t: say(trial_line(t)),
                             world_size=world)
    say(f"timing splits of effective batch {options['effective_batch']} (B* = {probed.max_micro_batch}, "
        f"{options['warmup']} warm-up + {options['repeats']} timed steps each) ...")
    live = not options["quiet"] and same_terminal()
    measured, files = run_bench(probed, out, options["effective_batch"], repeats=options["repeats"],
                                warmup=options["warmup"], threads=options["threads"],
                                large_batch=not options["no_large_batch"], command=command_line(),
                                on_row=lambda row: say(throughput_line(row)))
    if options["as_json"]:
        click.echo(json.dumps({"run_dir": out, "effective_batch": measured.effective_batch,
                               "rows": measured.to_records(), "report": files}))
        return
    if not live:
        for row in measured.rows:
            click.echo(throughput_line(row))
    best = measured.best_fitting()
    if best is not None:
        click.echo(f"fastest split that fits: {best.split} at {best.samples_per_s:.1f} samples/s")
    click.echo(f"throughput.csv and the report written to {out}")


def _bench_by_tokens(spec: Any, memory_limit: int | None, options: dict[str, Any]) -> None:
    """``gaplan bench --batch-by tokens``: T*, then the token plan against the samples plan on the same data."""
    from gaplan.constants import TOKEN_PLAN_KIND
    from gaplan.token_workflow import run_token_bench

    _check_by_tokens(spec, options, "bench")
    if options["plan_file"]:
        raise GaplanError("--plan is a samples plan: gaplan bench --batch-by tokens probes T* and B* for --data")
    out = options["out"] or default_run_dir("bench", spec.model)
    check_writable(out)
    say = stderr_printer(options["quiet"])
    live = not options["quiet"] and same_terminal()

    def on_run(kind: str, round_number: int, run: dict[str, Any]) -> None:
        name = "token plan  " if kind == TOKEN_PLAN_KIND else "samples plan"
        if "error" in run:
            say(f"  round {round_number}  {name}  failed: {run['error']}")
        else:
            say(f"  round {round_number}  {name}  {run['samples_per_s']:8.1f} samples/s  {run['tokens_per_s']:9,.0f} "
                f"real tokens/s  {sum(run['micro_steps']) / len(run['micro_steps']):5.1f} micro-steps per step")

    result = run_token_bench(spec, out, data_source_from_options(options), device=options["device"],
                             memory_limit=memory_limit, granule=options["granule"],
                             effective_batch=options["effective_batch"], warmup=options["warmup"],
                             repeats=options["repeats"], rounds=options["rounds"], threads=options["threads"],
                             command=command_line(), say=say, on_trial=lambda t: say(trial_line(t)),
                             on_profile=lambda profile: say("\n".join(histogram_lines(profile.histogram))) if live
                             else None, on_run=on_run)
    if options["as_json"]:
        click.echo(json.dumps(result.to_dict()))
        return
    probe = result.probe
    if not live:
        click.echo(f"lengths    {probe.profile.describe()}")
        click.echo("\n".join(histogram_lines(probe.profile.histogram)))
    click.echo(probe.budget.describe())
    click.echo(f"samples plan: B* = {probe.long_probe.max_micro_batch} at the longest length "
               f"({probe.profile.longest} tokens)\n")
    click.echo("\n".join(token_bench_lines(result.rows)))
    if result.ratio is not None:
        click.echo(f"\nreal tokens/s, token plan / samples plan: {result.ratio:.2f}x")
    click.echo(f"throughput.csv, tokens.json and the report written to {out}")


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


main.add_command(estimate_command)
main.add_command(plan_command)


def run() -> None:
    """Entry point that never shows a traceback for user errors."""
    main(prog_name="gaplan")


if __name__ == "__main__":
    sys.exit(main())
