"""The ``gaplan`` command line: parses options, calls the library (:mod:`gaplan.workflows.probe`), prints. Nothing else.

    gaplan probe                          # largest micro-batch that fits + plan, built-in model
    gaplan probe --model tiny-llama --seq-len 512 --memory-limit 2GiB --effective-batch 256
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

import click

from gaplan.cli.bench import bench_command
from gaplan.cli.estimate import estimate_command
from gaplan.cli.options import (
    SEARCH_CAP_OPTION,
    batch_by_options,
    check_by_tokens,
    check_granule_option,
    check_writable,
    command_line,
    data_options,
    data_source_from_options,
    memory_limit_from_options,
    parse_batch_range,
    spec_from_options,
    stderr_printer,
    timing_options,
    workload_options,
)
from gaplan.cli.output import BenchProgress, print_probe, same_terminal
from gaplan.cli.plan import plan_command
from gaplan.cli.train import train_command
from gaplan.core.constants import DEFAULT_EFFECTIVE_BATCH
from gaplan.core.errors import GaplanError
from gaplan.core.lines import histogram_lines, throughput_line, trial_line
from gaplan.core.options import OptionError
from gaplan.core.options import flag as flag_of_name
from gaplan.core.version import __version__
from gaplan.runs.folder import REPORT_HTML, REPORT_MD, TOKENS_JSON, default_run_dir, path_in


class GaplanGroup(click.Group):
    """Turns every :class:`GaplanError` into one line on stderr and exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GaplanError as exc:
            if ctx.params.get("debug"):  # what raised it, through the exceptions chained to it (a disk fault's writer)
                click.echo("".join(traceback.format_exception(exc)).rstrip(), err=True)
            click.echo(f"gaplan: {self._message(exc, ctx)}", err=True)
            ctx.exit(2)
        except KeyboardInterrupt:
            click.echo("gaplan: interrupted", err=True)
            ctx.exit(130)

    def _message(self, exc: GaplanError, ctx: click.Context) -> str:
        """The error's line; an option the library named by its field is named by the command's flag for it."""
        if not isinstance(exc, OptionError):
            return str(exc)
        command = self.get_command(ctx, ctx.invoked_subcommand) if ctx.invoked_subcommand else None
        flags = {param.name: param.opts[0] for param in (command.params if command else [])
                 if isinstance(param, click.Option)}
        return exc.for_cli(lambda name: flags.get(name) or flag_of_name(name))


@click.group(cls=GaplanGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="gaplan")
@click.option("--debug", is_flag=True, envvar="GAPLAN_DEBUG",
              help="On an error, print its traceback and the exceptions chained to it before its one line "
                   "(also GAPLAN_DEBUG=1).")
def main(debug: bool) -> None:
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
@click.option("--objective", type=click.Choice(["max-micro-batch", "throughput", "goodput"]),
              default="max-micro-batch", show_default=True,
              help="Plan with the largest micro-batch; with the split of highest measured throughput (times every "
                   "split: minutes); or goodput: measure the gradient noise scale in a short run at "
                   "--effective-batch, time the plans of --batch-range, and plan the effective batch of most "
                   "samples/s x statistical efficiency.")
@click.option("--batch-range", default=None, metavar="LOW:HIGH",
              help="--objective goodput: the effective batches to choose from (default E/16:4E).")
@click.option("--measure-steps", type=int, default=30, show_default=True,
              help="--objective goodput: optimizer steps of the run that measures the noise scale.")
@click.option("--report", is_flag=True, help="Also time the splits against a true large batch, break memory down "
                                             "by category, and write report.md/html, CSVs and PNGs to the run folder.")
@timing_options
@click.option("--seed-from-estimate/--no-seed-from-estimate", default=None,
              help="Start the search at gaplan estimate's predicted edge (traced on fake tensors first) and verify "
                   "both sides. Default: on where the model's family is in the estimate's zoo of measured "
                   "architectures (one process), off elsewhere.")
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
      gaplan probe --objective goodput --effective-batch 64 --batch-range 4:256  # the batch worth its steps
      gaplan probe --grad-checkpointing auto --emit hf  # print TrainingArguments to paste
      gaplan probe --data corpus.jsonl --batch-by tokens  # T*: the largest tokens per micro-batch for this data

    With --batch-by tokens: reads --data, prints its length profile, and finds T*, the largest token
    budget a micro-batch packed from this data may hold: the exact edge B* at the data's longest and
    shortest lengths, T* the most tokens both allow, in granules. Writes plan.json (the probe at the
    longest length), tokens.json (the profile and T*: gaplan train --token-plan) and lengths.png.
    """
    from gaplan.core.options import from_options
    from gaplan.workflows.probe import ProbeOptions, run_probe

    spec = spec_from_options(options)
    memory_limit = target_limit(options) or memory_limit_from_options(options)
    options["batch_range"] = parse_batch_range(options["batch_range"])
    # By its fields, checked there; --grad-checkpointing given as nothing means off.
    probe_options = from_options(ProbeOptions, options, grad_checkpointing=options["grad_checkpointing"] or "off",
                                 command=command_line())
    check_granule_option(options)
    by_goodput = options["objective"] == "goodput"
    if not by_goodput:
        for name, default, flag in (("batch_range", None, "--batch-range"), ("measure_steps", 30, "--measure-steps")):
            if options[name] != default:
                raise GaplanError(f"{flag} applies to --objective goodput")
    if options["batch_by"] == "tokens":
        _probe_by_tokens(spec, memory_limit, options)
        return
    if options["data"] and not by_goodput:
        raise GaplanError("--data applies to --batch-by tokens and to --objective goodput's measuring run here (a "
                          "probe by samples runs full-length batches)")
    if by_goodput and options["report"]:
        raise GaplanError("--report times the plan of --effective-batch; with --objective goodput, report on the "
                          "chosen plan afterwards: gaplan bench --plan OUT/plan.json")
    timing = (options["report"] or options["objective"] in ("throughput", "goodput")
              or options["grad_checkpointing"] == "auto")
    if timing and spec.parallel == "fsdp":
        raise GaplanError("--report, --objective throughput|goodput and --grad-checkpointing auto time one device; "
                          "a sharded run's splits are timed by gaplan bench --parallel fsdp --world-size W")
    if timing and options["world_size"] != 1:
        raise GaplanError("--report, --objective throughput|goodput and --grad-checkpointing auto time one device: "
                          "use --world-size 1")
    from gaplan.probing.edge import trial_ranks

    ranks = trial_ranks(spec, options["world_size"])  # --parallel fsdp needs 2 ranks or more
    out = options["out"] or default_run_dir("probe", spec.model)
    check_writable(out)
    say = stderr_printer(options["quiet"])
    each = f"{ranks} fresh processes in one process group, each under the budget" if ranks > 1 else "a fresh process"
    say(f"probing {spec.model} (each trial: {each}, 2 optimizer steps of 2 micro-steps) ...")
    if timing:
        say("after the probe, --report / --objective throughput time splits in interleaved rounds (the forecast of "
            "how long follows the probe; --time-budget bounds it)")
    progress = BenchProgress(say, not options["quiet"] and same_terminal())
    try:
        run = run_probe(spec, out, probe_options, device=options["device"], memory_limit=memory_limit,
                        on_trial=lambda t: say(trial_line(t)), on_row=lambda row: say(throughput_line(row)), say=say,
                        on_bench_trial=progress.trial, on_bench_start=progress.start)
    finally:
        progress.close()
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
    if run.verdict:
        click.echo(f"throughput: {run.verdict}")
    if run.report_files:
        click.echo(f"report written to {path_in(out, REPORT_MD)} and {REPORT_HTML}")
    if snippet:
        click.echo("\n# Hugging Face Trainer settings for this plan:\n" + snippet, nl=False)


def _probe_by_tokens(spec: Any, memory_limit: int | None, options: dict[str, Any]) -> None:
    """``gaplan probe --batch-by tokens``: the data's length profile, T*, plan.json, tokens.json, lengths.png."""
    from gaplan.workflows.probe_tokens import run_token_probe

    check_by_tokens(spec, options, "probe")
    for name, default, flag in (("report", False, "--report"), ("objective", "max-micro-batch", "--objective"),
                                ("seed_from_estimate", None, "--seed-from-estimate"), ("emit", None, "--emit"),
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
    from gaplan.core.units import format_bytes

    click.echo(f"device     {run.long_probe.device}, budget {format_bytes(run.long_probe.memory_limit_bytes)}{note}")
    click.echo(budget.describe())
    click.echo(f"samples plan at the longest length: {run.long_probe.plan.describe()}")
    click.echo(f"plan.json, tokens.json and lengths.png written to {out}  (gaplan train --batch-by tokens "
               f"--token-plan {path_in(out, TOKENS_JSON)})")


def target_limit(options: dict[str, Any]) -> int | None:
    """``--target``'s memory, to emulate it on a larger GPU: a card's memory, as ``--memory-limit`` is, so the probe's
    worker takes the context's allowance off it and the allocator holds the rest, cuBLAS's workspaces included."""
    if not options["target"]:
        return None
    from gaplan.estimate import lookup_target

    if options["memory_limit"]:
        raise GaplanError("--target and --memory-limit both set the budget: give one")
    from gaplan.devices.backend import resolve_device

    if resolve_device(options["device"]) == "cpu":
        raise GaplanError("--target emulates a GPU on a larger one: it needs a CUDA device (this run is on CPU)")
    return lookup_target(options["target"]).total_bytes


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
    from gaplan.report.write import write_report

    written = write_report(run_dir)
    if as_json:
        click.echo(json.dumps({"run_dir": run_dir, "files": written.files}))
        return
    click.echo(f"wrote {', '.join(written.files)} in {run_dir}")


main.add_command(train_command)
main.add_command(bench_command)
main.add_command(estimate_command)
main.add_command(plan_command)


def run() -> None:
    """Entry point that never shows a traceback for user errors."""
    main(prog_name="gaplan")


if __name__ == "__main__":
    sys.exit(main())
